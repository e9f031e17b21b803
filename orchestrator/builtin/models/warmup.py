"""How the warmed-up tiny models (tools, judge, teacher, the VLMs) are made so that they pass their gates on any CPU.

A model trained here is the product of thousands of float sums whose order depends on the CPU (vector widths, the
BLAS kernels chosen for it), and training amplifies a last-bit difference into a different model: the same seed on
another CPU is another build. So a build is made to be good, not to be bit-identical:

- its starting point is portable: every weight matrix drawn by numpy's PCG64 (`portable_normal_`), the same bits
  on every CPU (torch's `normal_` vectorises by CPU capability and rounds differently across vector widths), so
  the random tiny models are bit-identical everywhere and the trained ones start from the same weights;
- it trains on a schedule that settles (`warmup_cosine`: a linear warm-up, then a cosine decay to 0), so the last
  steps polish instead of jumping between optima;
- it is measured by gates on what its use needs (a judge's agreement with its rubric, a teacher's letter under the
  student's noise, a tool model's well-formed calls) and, where a build falls short, retrained from the next seed,
  up to ATTEMPTS times (`gated`): a bounded budget, and an error naming every score when none passes;
- `build.json` beside the weights records the seed that passed, the scores, the attempts and the CPU it ran on.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Builds from seed, seed + 1, ...: a build that misses a gate is retrained from the next seed, at most this many times.
# Each recipe passes on its first seed on the CPUs it was tried on; the others are the margin for a CPU whose
# float sums take a build below a gate (tests/unit/orchestrator/builtin/models/test_gates.py builds under another
# order and checks the gates pass).
ATTEMPTS = 3
BUILD_RECORD = "build.json"


def portable_normal_(model: Any, seed: int, std: float | Callable[[str], float]) -> None:
    """Every weight matrix (dim > 1) of `model` drawn from N(0, std) by numpy's PCG64 in parameter order (`std`: a
    number or a function of the parameter's name); vectors (norms, biases) keep the model's own constant init."""
    import numpy as np
    import torch

    rng = np.random.Generator(np.random.PCG64(seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                scale = np.float32(std(name) if callable(std) else std)
                p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape), dtype=np.float32) * scale))


def warmup_cosine(optimizer: Any, steps: int, warmup: int) -> Any:
    """A LambdaLR: linear warm-up over `warmup` steps, then half a cosine to 0 at `steps`."""
    import torch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, steps - warmup) / max(steps - warmup, 1)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass(frozen=True)
class Gate:
    """A score's acceptable range, inclusive."""

    low: float
    high: float = 1.0

    def passes(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f">= {self.low:g}" if self.high == 1.0 else f"in [{self.low:g}, {self.high:g}]"


@dataclass(frozen=True)
class Passed:
    """A build that passed its gates: the model, its scores, and the seed and attempt that made it."""

    model: Any
    scores: dict[str, float]
    seed: int
    attempt: int


def gated(build: Callable[[int], tuple[Any, dict[str, float]]], gates: dict[str, Gate], *, seed: int, what: str,
          attempts: int = ATTEMPTS) -> Passed:
    """`build(seed)` -> (model, scores), retried from seed + 1, ... until every gate passes (at most `attempts`
    builds); RuntimeError naming each attempt's scores when none does."""
    tried = []
    for k in range(attempts):
        model, scores = build(seed + k)
        missed = {name: scores[name] for name, gate in gates.items() if not gate.passes(scores[name])}
        if not missed:
            return Passed(model, scores, seed + k, k + 1)
        tried.append(f"seed {seed + k}: " + ", ".join(f"{n} {v:.3f} (wanted {gates[n]})" for n, v in missed.items()))
    raise RuntimeError(f"{what}: no build passed its gates in {attempts} attempts ({'; '.join(tried)})")


def record(out: Path, passed: Passed) -> None:
    """build.json: the passing seed, its scores, the attempts it took, and where it was built."""
    import platform

    import torch

    (out / BUILD_RECORD).write_text(json.dumps({
        "seed": passed.seed, "attempt": passed.attempt, "scores": passed.scores, "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
    }, indent=1) + "\n")


def sft(model: Any, batch: Callable[[random.Random], tuple[Any, Any]], *, steps: int, lr: float, warmup: int,
        seed: int, threads: int = 1) -> Any:
    """`steps` Adam steps on `batch(rng)` ((input ids, labels) tensors) at `lr` on the warm-up + cosine schedule,
    on `threads` torch threads (restored after); the model in eval mode, returned."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rng = random.Random(seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        schedule = warmup_cosine(opt, steps, warmup)
        model.train()
        for _ in range(steps):
            input_ids, labels = batch(rng)
            loss = model(input_ids=input_ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
        model.eval()
    finally:
        torch.set_num_threads(before)
    return model


__all__ = ["ATTEMPTS", "BUILD_RECORD", "Gate", "Passed", "gated", "portable_normal_", "record", "sft",
           "warmup_cosine"]
