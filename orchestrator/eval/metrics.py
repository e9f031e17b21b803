"""Held-out evaluation, the pure part (no Ray): the unbiased pass@k estimator, when a run evaluates, the eval
metrics of a scored batch, and which eval is the best so far.

An eval generates `eval.num_generations` (k) completions for each held-out prompt with the current policy,
scores them with the eval rewards (weights and gates at the evaluated step), and reports, over prompts:

    eval/reward                  mean weighted total reward (None-only completions excluded)
    eval/rewards/<name>/mean     mean raw score of each reward function (None excluded; TRL's semantics)
    eval/pass@1, eval/pass@<k>   unbiased pass@k (Chen et al. 2021), a completion passing when its total
                                 reward reaches eval.pass_threshold
    eval/mean_length             mean completion length in tokens

The driver side (generating on the engines, scoring on a reward pool, logging, checkpoint-best) is
`orchestrator/eval/evaluator.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from orchestrator.algo.grpo import nanmean_or_nan, nanstd_or_nan


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n samples of which c pass (Chen et al. 2021, "Evaluating Large Language
    Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k), the chance that k of the n samples, drawn without
    replacement, include a pass. As their product form, 1 - prod_{i=n-c+1}^{n} (1 - k/i), which stays exact
    where the binomials overflow."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a pass
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class EvalSchedule:
    """When a run evaluates: at its start (`at_start`), after every `every_n_steps`-th optimizer step, and after
    its last step."""

    every_n_steps: int | None
    at_start: bool
    max_steps: int

    def due(self, step: int) -> bool:
        """Whether the policy after optimizer step `step` is evaluated."""
        return step == self.max_steps or (self.every_n_steps is not None and step % self.every_n_steps == 0)


def eval_metrics(
    names: list[str],
    raw: torch.Tensor,
    total: torch.Tensor,
    lengths: list[int],
    truncated: list[bool],
    group_size: int,
    pass_threshold: float,
) -> dict[str, float]:
    """The eval metrics of N completions, G = group_size per prompt (contiguous): raw [N, K] scores (NaN =
    None), total [N] weighted gated totals (NaN when no reward had an opinion: never a pass)."""
    n = total.shape[0]
    if n == 0 or n % group_size:
        raise ValueError(f"{n} completions are not a whole number of groups of {group_size}")
    passed = (total >= pass_threshold).view(-1, group_size).sum(dim=1).tolist()  # NaN >= t is False
    m: dict[str, float] = {"eval/reward": nanmean_or_nan(total), "eval/reward_std": nanstd_or_nan(total)}
    for k, name in enumerate(names):
        m[f"eval/rewards/{name}/mean"] = nanmean_or_nan(raw[:, k])
    for k in sorted({1, group_size}):
        m[f"eval/pass@{k}"] = sum(pass_at_k(group_size, c, k) for c in passed) / len(passed)
    m["eval/mean_length"] = sum(lengths) / n
    m["eval/clipped_ratio"] = sum(truncated) / n
    m["eval/prompts"] = len(passed)
    return m


@dataclass
class Best:
    """The best value so far of one eval metric (grpo.save_best) and the step it was measured at."""

    metric: str
    mode: Literal["max", "min"]
    value: float | None = None
    step: int | None = None

    def improves(self, value: float | None) -> bool:
        """Whether `value` beats the best so far (the first finite value always does; NaN or None never)."""
        if value is None or math.isnan(value):
            return False
        if self.value is None:
            return True
        return value > self.value if self.mode == "max" else value < self.value
