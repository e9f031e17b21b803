"""`rayward.GRPOConfig`: TRL's GRPOConfig, the same fields, defaults and meanings, that constructs on a
machine without a GPU.

TRL's `GRPOConfig(output_dir=...)` turns bf16 on by default, and transformers' TrainingArguments checks that
the process constructing it can autocast to bf16 (an Ampere GPU, or use_cpu=True) and, for tf32=True, that it
has an Ampere GPU. A TRL script run through rayward constructs its config in the driver (a laptop, or the CPU
head node `rayward submit my_script.py` runs it on), which never trains: the learner actor does, in the
model's dtype (orchestrator/trl/args.py maps bf16/fp16). So this subclass leaves those two device checks out
and keeps every other one: fp16 with bf16, batch and generation sizes, the strategies.
`isinstance(args, trl.GRPOConfig)` holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import trl


@contextlib.contextmanager
def _holding(config: Any, name: str, value: Any) -> Iterator[None]:
    """`config.name` is `value` inside the block, the script's own again after it."""
    kept = getattr(config, name)
    setattr(config, name, value)
    try:
        yield
    finally:
        setattr(config, name, kept)


class GRPOConfig(trl.GRPOConfig):
    """TRL's GRPOConfig (every field as TRL documents it) without the checks of the constructing process's
    devices; a plain subclass, not a new dataclass, so TRL's generated __init__, __repr__ and fields stay."""

    def __post_init__(self) -> None:
        # tf32's check (and its torch-global switch) concerns the training process, which this one is not
        with _holding(self, "tf32", None):
            super().__post_init__()

    def _validate_args(self) -> None:
        # transformers' bf16 check passes with use_cpu (and asks the GPU otherwise); no other check reads it
        with _holding(self, "use_cpu", True):
            super()._validate_args()
