"""The long-tailed workload of bench/async_generation.py: completion lengths drawn from a log-normal distribution,
imposed on the engine's sampling by a vLLM logits processor (`LogNormalLengths`, given to the generators with
`generation.engine_kwargs: {logits_processors: [bench.long_tail:LogNormalLengths]}`).

Why log-normal: the completion lengths of reasoning RL are right-skewed, most near a median and a few several times
longer (the peers' long-tail work: APRIL's partial rollouts, slime, AReaL's interruptible generation; bench/
scale_sim.py models them the same way, `--sigma`). With a median of MEDIAN_TOKENS and SIGMA 0.8, a batch of 64
completions has its longest at about 5x its mean: a batch-synchronous engine decodes the last part of each batch
with a handful of sequences.

Why imposed and not learned: a model's own lengths move as it trains. A tiny model warmed to end its answers at
log-normal lengths (the first version of this bench) drifted to its length cap within 10 GRPO steps at the demo's
learning rate (an Adam step moves every weight, and the end-of-turn hazard it had learned went with them), and
with it went the tail the bench is about. Here each sequence's length is a function of its sampling seed (a
request of n samples: the seeds seed..seed + n - 1, as vLLM gives its children), the same in both loops: its end
of turn is masked until then and forced at it. Sampling logprobs are processed ones (the generator's
logprobs_mode), so the forced token's logprob is 0 where the learner's is its own: the correction clamps that one
token a sequence, alike in both loops.

The task is the demo's (letter_fraction on "Write the letter X:", the random tiny model): its reward does not
depend on the length, and the policy cannot change the lengths.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

MEDIAN_TOKENS = 40
SIGMA = 0.8
MAX_TOKENS = 320  # the cap (the run's max_completion_length): about the 99.5th percentile, median x e^(2.6 sigma)


def target_length(seed: int | None) -> int:
    """A sequence's length, in tokens with its end of turn, drawn by its seed (None: a fresh draw)."""
    rng = random.Random(seed) if seed is not None else random.Random()
    return max(2, min(MAX_TOKENS, round(rng.lognormvariate(math.log(MEDIAN_TOKENS), SIGMA))))


class LogNormalLengths(LogitsProcessor):
    """Per row of the engine's batch: the end-of-turn token masked until the row's `target_length`, then the only
    token left."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        eos = vllm_config.model_config.hf_config.eos_token_id
        self.eos = eos[0] if isinstance(eos, list) else eos
        self.rows: dict[int, tuple[int, list[int]]] = {}  # batch row -> (its length, its output ids: a live list)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.rows.pop(i, None)
        for i, params, _prompt, output in batch_update.added:
            self.rows[i] = (target_length(params.seed), output)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for i, (length, output) in self.rows.items():
            if len(output) + 1 >= length:  # the next token is its last
                logits[i] = -math.inf
                logits[i, self.eos] = 0.0
            else:
                logits[i, self.eos] = -math.inf
        return logits


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    q = {p: s[min(len(s) - 1, int(p / 100 * len(s)))] for p in (50, 90, 99)}
    return (f"mean {sum(s) / len(s):.0f}, p50 {q[50]:.0f}, p90 {q[90]:.0f}, p99 {q[99]:.0f}, max {s[-1]:.0f} "
            f"(max / mean {s[-1] / (sum(s) / len(s)):.1f})")


if __name__ == "__main__":
    draws = [target_length(s) for s in range(4096)]
    print(f"lengths by seed, 4096 seeds: {quantiles(draws)}")
    batches = [draws[i:i + 64] for i in range(0, len(draws), 64)]
    print(f"per batch of 64: longest / mean {sum(max(b) / (sum(b) / len(b)) for b in batches) / len(batches):.1f}")
