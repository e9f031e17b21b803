"""The offline tiny models (no downloads), built into rayward's cache on first use:

    tiny.py      the tiny Qwen2-style policy (random), its tokenizer, and what every tiny build shares
    tools.py     the tiny model warmed up to call the box task's tools (`tiny-tools`)
    moe.py       tiny mixtures of experts (Qwen3-MoE, Qwen2-MoE; one with near-tied routers)
    judge.py     the tiny judge of the letter task (`tiny-judge`)
    teacher.py   the tiny distillation teacher of the letter task (`tiny-teacher`)
    vlm.py       the tiny vision-language models (`tiny-vlm`, `tiny-vlm-tools`)
    warmup.py    how the warmed-up ones pass their gates on any CPU: portable init, a settling schedule, gates
                 with bounded retries, the build record

`resolve(name)` is how a model field (the policy's, a judge's, a teacher's) reads: a built-in name builds that
model into the cache on first use and gives its directory; any other name is a path or hub id, as given.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

# name -> (module, builder, keyword arguments): each builder is `ensure_*` (built once into the cache, reused).
# Imported on use: the registry is read by config checks that must not import torch.
BUILTIN: dict[str, tuple[str, str, dict[str, Any]]] = {
    "tiny": ("tiny", "ensure_tiny_model", {}),
    "tiny-tools": ("tools", "ensure_tiny_tool_model", {}),
    "tiny-moe": ("moe", "ensure_tiny_moe", {"family": "qwen3_moe"}),
    "tiny-qwen2-moe": ("moe", "ensure_tiny_moe", {"family": "qwen2_moe"}),
    "tiny-moe-ties": ("moe", "ensure_tiny_moe", {"family": "qwen3_moe", "near_ties": True}),
    "tiny-vlm": ("vlm", "ensure_tiny_vlm", {}),
    "tiny-vlm-tools": ("vlm", "ensure_tiny_tool_vlm", {}),
    "tiny-judge": ("judge", "ensure_tiny_judge", {}),
    "tiny-teacher": ("teacher", "ensure_tiny_teacher", {}),
}


def builder(name: str) -> Callable[[], Path]:
    """The built-in model `name`'s cached build (KeyError for a name that is not built in)."""
    module, function, kwargs = BUILTIN[name]
    ensure = getattr(importlib.import_module(f"{__name__}.{module}"), function)
    return lambda: ensure(**kwargs)


def resolve(name: str) -> str:
    """A model field's directory: a built-in model's, built into the cache on first use, else `name` as given."""
    return str(builder(name)()) if name in BUILTIN else name


__all__ = ["BUILTIN", "builder", "resolve"]
