"""The offline tiny models (no downloads), built into rayward's cache on first use:

    tiny.py      the tiny Qwen2-style policy (random), its tokenizer, and what every tiny build shares
    tools.py     the tiny model warmed up to call the box task's tools (`tiny-tools`)
    moe.py       tiny mixtures of experts (Qwen3-MoE, Qwen2-MoE; one with near-tied routers)
    judge.py     the tiny judge of the letter task (`tiny-judge`)
    teacher.py   the tiny distillation teacher of the letter task (`tiny-teacher`)
    vlm.py       the tiny vision-language models (`tiny-vlm`, `tiny-vlm-tools`)
"""
