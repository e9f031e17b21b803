"""The learner's optimizer, its learning-rate schedule and the gradient clipping before each optimizer step,
under transformers' names (`OptimSpec`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from actors.learner.specs import OptimSpec


def lr_lambda(kind: str, warmup_steps: int, max_steps: int) -> Callable[[int], float]:
    """The learning rate's factor at each optimizer step: a linear warmup, then constant, linear or cosine
    decay over the rest of `max_steps`."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))  # cosine

    return f


def make_optimizer(
    model: torch.nn.Module, spec: OptimSpec
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The optimizer over the trainable parameters (LoRA: the adapters) and its learning-rate schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.optim == "adamw_torch":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            params, lr=spec.learning_rate, betas=spec.adam_betas, weight_decay=spec.weight_decay
        )
    elif spec.optim == "sgd":
        optimizer = torch.optim.SGD(params, lr=spec.learning_rate, weight_decay=spec.weight_decay)
    else:
        raise ValueError(f"unknown optim {spec.optim!r}")
    schedule = lr_lambda(spec.lr_scheduler_type, spec.warmup_steps, spec.max_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def clip_gradients(model: torch.nn.Module, max_norm: float | None, sharded: bool) -> float:
    """Clip the gradient to max_norm (None: no clipping); returns its norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    if sharded:  # DTensor shards: clip_grad_norm_ reduces the norm over ranks (max_norm inf: no clip)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm or math.inf)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if max_norm is None:
        return float(torch.norm(torch.stack([p.grad.norm() for p in params])).item()) if params else 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm).item())
