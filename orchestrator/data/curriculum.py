"""A curriculum over prompts: per-prompt statistics from the run's own scores, and the samplers that read them
(`data.sampler`: `difficulty`, or a user's function). The uniform sampler is sources.py's PromptSource order.

**Statistics** (`PromptStats`, per dataset row): times drawn and scored, the last scored group's pass rate (the share
of its completions whose weighted total reward is at least data.difficulty.pass_threshold), its reward mean and
spread, the step it was scored at, and how many scorings in a row its group had no spread (every completion's total
the same: for a pass/fail reward, solved by all or none). The driver keeps
them: every scored group (dynamic sampling's dropped and refilled groups included) is observed as it is selected
(build.py wraps the run's selector), and they are in every checkpoint with the sampler's random state.

**The difficulty sampler.** A prompt never scored is `unseen`; otherwise its last pass rate puts it in `easy` (at or
above easy_above), `hard` (at or below hard_below) or `learnable`. A prompt whose group had no spread rest_after
times in a row (solved by all or none, for a pass/fail reward; a prompt no completion can score, for any) is rested
for rest_steps steps (in no pool), then back in its pool: GRPO learns nothing from such a group. Each draw picks a
pool with the weights (schedules over the step, as reward weights; over the pools that have prompts), then a prompt
of it at random, not one drawn already in the same batch while the pool has others. A step's draws count per pool
(`curriculum/draws/<pool>`); the pools' sizes, the rested prompts and the pass-rate histogram of the drawn prompts
are step metrics.

**A user's sampler** is called `fn(stats=, trainer_state=, k=, num_rows=)` and returns k row indices.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from actors import user_code
from actors.types import TrainerState
from orchestrator.config import ConfigError, DataConfig, scheduled

POOLS = ("unseen", "learnable", "easy", "hard")
# A group whose totals' standard deviation is at most this has no spread (orchestrator/algo/selection.py's tolerance).
FLAT_STD = 1e-6
# Pass-rate bins of the drawn prompts' histogram (curriculum/drawn_pass_rate/<bin>): lower edges.
PASS_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class PromptStats:
    """One prompt's record (see the module docstring)."""

    drawn: int = 0
    scored: int = 0
    pass_rate: float | None = None  # the last scored group's
    reward_mean: float | None = None
    reward_std: float | None = None
    last_step: int | None = None  # the step its last group was scored at
    streak: int = 0  # scorings in a row whose group had no spread
    rested_until: int | None = None  # not drawn before this step


class Curriculum:
    """The statistics and a sampler over `num_rows` prompts (`choose`); `observe` feeds it scored groups."""

    def __init__(self, num_rows: int, cfg: DataConfig, seed: int = 0,
                 chooser: Callable[..., Any] | None = None) -> None:
        self.num_rows, self.cfg, self.d = num_rows, cfg, cfg.difficulty
        self.chooser = chooser
        self.stats: dict[int, PromptStats] = {}
        self.step = 0
        self._rng = random.Random(seed ^ 0x5EED)
        self.last_draws: dict[str, int] = dict.fromkeys(POOLS, 0)
        self.last_drawn_rates: list[float | None] = []

    # --- pools --------------------------------------------------------------------------------------------

    def pool(self, row: int) -> str | None:
        """The row's pool now, or None while it rests."""
        s = self.stats.get(row)
        if s is None or s.pass_rate is None:
            return "unseen"
        if s.rested_until is not None and self.step < s.rested_until:
            return None
        if s.pass_rate >= self.d.easy_above:
            return "easy"
        if s.pass_rate <= self.d.hard_below:
            return "hard"
        return "learnable"

    def pools(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {p: [] for p in POOLS}
        for row in range(self.num_rows):
            p = self.pool(row)
            if p is not None:
                out[p].append(row)
        return out

    # --- drawing ------------------------------------------------------------------------------------------

    def choose(self, k: int) -> list[int]:
        """k rows for the next batch."""
        rows = self._user(k) if self.chooser is not None else self._difficulty(k)
        for row in rows:
            self.stats.setdefault(row, PromptStats()).drawn += 1
        self.last_drawn_rates = [self.stats[r].pass_rate for r in rows]
        return rows

    def _difficulty(self, k: int) -> list[int]:
        pools = self.pools()
        weights = {p: scheduled(w, self.step) for p, w in self.d.weights.items()}  # >= 0 (DifficultyConfig)
        live = [p for p in POOLS if pools[p] and weights.get(p, 0.0) > 0]
        if not live:  # every weighted pool empty (all rested, say): any prompt that is not resting, else any
            live, pools = ["learnable"], {"learnable": [r for ps in pools.values() for r in ps]
                                          or list(range(self.num_rows))}
            weights = {"learnable": 1.0}
        self.last_draws = dict.fromkeys(POOLS, 0)
        taken: set[int] = set()
        out = []
        for _ in range(k):
            p = self._rng.choices(live, weights=[weights[q] for q in live])[0]
            fresh = [r for r in pools[p] if r not in taken]
            row = self._rng.choice(fresh or pools[p])
            taken.add(row)
            out.append(row)
            self.last_draws[p] += 1
        return out

    def _user(self, k: int) -> list[int]:
        state = TrainerState(global_step=self.step)
        rows = plain_rows(self.chooser(stats=self.stats, trainer_state=state, k=k, num_rows=self.num_rows))
        name = self.cfg.sampler
        if not isinstance(rows, list | tuple) or len(rows) != k:
            raise ConfigError(f"data.sampler {name}: returned {type(rows).__name__} "
                              f"{'of length ' + str(len(rows)) if hasattr(rows, '__len__') else ''}, not {k} row "
                              "indices")
        bad = [r for r in rows if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < self.num_rows]
        if bad:
            raise ConfigError(f"data.sampler {name}: returned {bad[:3]}: not row indices of a {self.num_rows}-row "
                              "dataset")
        self.last_draws = dict.fromkeys(POOLS, 0)
        return list(rows)

    # --- observing ----------------------------------------------------------------------------------------

    def observe(self, row: int, totals: list[float], step: int) -> None:
        """One scored group of `row`: its completions' weighted totals (NaN: no reward had an opinion)."""
        self.step = max(self.step, step)
        xs = [x for x in totals if not math.isnan(x)]
        if not xs:
            return
        s = self.stats.setdefault(row, PromptStats())
        rate = sum(x >= self.d.pass_threshold for x in xs) / len(xs)
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
        flat = std <= FLAT_STD  # no spread: GRPO learns nothing from the group (a pass/fail reward: G/G or 0/G)
        s.streak = s.streak + 1 if flat else 0
        s.scored += 1
        s.pass_rate, s.reward_mean, s.reward_std, s.last_step = rate, mean, std, step
        if s.streak >= self.d.rest_after:
            s.rested_until, s.streak = step + self.d.rest_steps, 0

    def metrics(self) -> dict[str, float]:
        pools = self.pools()
        m: dict[str, float] = {f"curriculum/pool/{p}": len(pools[p]) for p in POOLS}
        m["curriculum/rested"] = self.num_rows - sum(len(v) for v in pools.values())
        m.update({f"curriculum/draws/{p}": n for p, n in self.last_draws.items()})
        rates = [r for r in self.last_drawn_rates if r is not None]
        for lo, hi in zip(PASS_BINS, (*PASS_BINS[1:], math.inf), strict=True):
            m[f"curriculum/drawn_pass_rate/{lo:.2f}"] = sum(lo <= r < hi for r in rates)
        m["curriculum/drawn_unseen"] = sum(r is None for r in self.last_drawn_rates)
        return m

    # --- position -----------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "rng": self._rng.getstate(),
                "stats": {str(r): asdict(s) for r, s in self.stats.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.step = state["step"]
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self.stats = {int(r): PromptStats(**s) for r, s in state["stats"].items()}


def plain_rows(rows: Any) -> Any:
    """A sampler's answer with numpy's integers as Python's (an array, or a list of numpy integers: how samplers that
    draw with numpy return rows); anything else as it came, for the checks to name."""
    if hasattr(rows, "tolist") and not isinstance(rows, list | tuple):
        rows = rows.tolist()
    if isinstance(rows, list | tuple):
        return [r.item() if hasattr(r, "item") and not isinstance(r, int | float) else r for r in rows]
    return rows


def make_curriculum(cfg: DataConfig, num_rows: int, seed: int) -> Curriculum | None:
    """The run's curriculum (None for `uniform`); a user's sampler imported and checked (its keyword parameters)."""
    if cfg.sampler == "uniform":
        return None
    chooser = None
    if cfg.sampler != "difficulty":
        try:
            chooser = user_code.import_object(cfg.sampler, "data.sampler")
        except user_code.UserCodeError as err:
            raise ConfigError(str(err)) from None
        try:
            params = inspect.signature(chooser).parameters
        except (TypeError, ValueError):
            params = {}
        missing = [p for p in ("stats", "trainer_state", "k", "num_rows") if p not in params]
        if params and missing and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise ConfigError(f"data.sampler {cfg.sampler!r} takes no {missing}: a sampler is called "
                              "fn(stats=, trainer_state=, k=, num_rows=)")
    return Curriculum(num_rows, cfg, seed, chooser)


__all__ = ["Curriculum", "PromptStats", "POOLS", "make_curriculum"]
