"""Prompts: where they come from, in which order, and the position a checkpoint keeps.

    sources.py     datasets, chat templates, `PromptStream` (what the loop draws from), the in-memory one
                   (`PromptSource`), `EpochOrder`, `Prompt`, `DataPosition`
    shards.py      streamed datasets: parquet/jsonl shards read as drawn (`StreamSource`), a seeded shuffle buffer
    curriculum.py  a curriculum over prompts: per-prompt statistics, the difficulty sampler, a user's sampler
"""
