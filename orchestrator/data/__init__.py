"""Prompts: where they come from, in which order, and the position a checkpoint keeps.

    sources.py     datasets, chat templates, the in-memory prompt stream (`PromptSource`), `Prompt`, `DataPosition`
    shards.py      streamed datasets: parquet/jsonl shards read as drawn (`StreamSource`), a seeded shuffle buffer
    curriculum.py  a curriculum over prompts: per-prompt statistics, the difficulty sampler, a user's sampler
"""
