"""A worker pool's autoscaling policy (the reward pool's and the environment pool's, through actors/runtime/pool.py):
samples of the pool's load in, a target number of workers out (pure).

Modelled on Ray Serve's autoscaler (`target_ongoing_requests`, `upscale_delay_s`, `downscale_delay_s`,
`look_back_period_s`), with the load measured the way a batch-driven pool sees it:

* **Load** is the average number of *busy* workers (a worker is busy while it holds at least one chunk) over a
  look-back window. The pool integrates busy workers, and the time it has nothing to do, over time; the policy
  takes differences.
* **Desired workers**, two cases:
  - *Bursty batches* (every batch of the window found the pool idle: the synchronous loop, one batch per step
    followed by generation and training): a batch is W busy worker-seconds of work and the pool idles R seconds
    between batches, so n workers are busy W / (W + n R) of the time, which is `target_utilization` u at
    n = W (1 - u) / (u R). The pool moves there in one decision: it grows to what the queue needs, and
    shrinks as soon as that need is gone. At that size the reward phase takes u / (1 - u) of the rest of the
    step whatever the reward's latency (0.5: as long as generation + training).
  - *Otherwise* (work arriving while earlier work runs: the pipelined loop, environment sessions): busy
    workers / u, rounded up, Serve's ongoing requests / target_ongoing_requests. It moves towards the fixed
    point by at most a factor 1 / u per decision (busy workers never exceed the live ones).

  Either is capped by the most chunks that were waiting or running at once in the window (one chunk per
  worker is all the parallelism the work offers) and clamped to [min_workers, max_workers].
* **Delays**: the pool grows only after the desired count has stayed above the current target (live and
  starting workers) for `upscale_delay_s`, and shrinks only after it has stayed below the live workers for
  `downscale_delay_s`; either way it moves to the desired count of that moment. While added workers are still
  starting, the load was measured without them: it may want fewer than the target, but the workers asked for
  are kept until they have been measured (or the load wants fewer than those already live).

Why not queue wait or chunks per worker: the synchronous loop's batches are bursts followed by idle time.
Queue wait and chunks in flight per worker depend on the batch size and drop to zero once there are as many
workers as chunks, so a rule built on them oscillates between "too few" and "none needed". Work per batch and
the idle time between batches do not depend on the pool's size.

**Windows of whole batches, one regime.** A time window shorter than a step would see 100% load during the
burst and none after it. So the window is aligned to batch arrivals: whole arrival-to-arrival cycles, starting
at the newest arrival at least `look_back_s` ago; in the synchronous loop it holds whole steps, in the
pipelined loop (a batch per finished group) it is about `look_back_s` long. It keeps only the newest regime:
cycles whose work is within REGIME_CHANGE of the newest whole cycle's, so a pool that grew for a slow spell
shrinks once the spell is over, not once the slow steps have left the look-back. The cycle in progress,
its work extrapolated from the chunks it finished, starts a regime of its own when it holds REGIME_CHANGE
times an average cycle's work (a reward that just became slower is seen at its first finished chunk); it
counts with the others when it holds more than MORE_WORK times as much, or when it lowers the load (a long
pause); otherwise a step half-way through, its batch scored and the rest to come, would look busier than
it is. No decision is taken before one whole cycle has been seen (the pool idles while the generators start).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

# Float noise below one worker: 2.0000000001 busy-worker units must not round up to 3 workers.
_ROUND_SLACK = 1e-6
# The cycle in progress counts as "more work than usual" once it holds this much more than an average whole
# cycle: a step with the usual work ends a little above or below the average (stragglers, dispatch), and
# counting those would flip the pool between two sizes; a reward that became markedly slower passes it early.
MORE_WORK = 1.25
# A whole cycle whose work is more than this factor above or below the newest whole cycle's belongs to another
# regime (the reward got slower or faster): the window keeps only the newest regime's cycles, so a pool that
# grew for a slow spell shrinks once the spell is over, not once its cycles have left look_back_s. Loose enough
# that the spread of ordinary steps (lengths, stragglers) stays in one regime.
REGIME_CHANGE = 2.0


def _same_regime(a: float, b: float) -> bool:
    """Whether two cycles' work (busy worker-seconds) is within REGIME_CHANGE of each other."""
    lo, hi = sorted((a, b))
    return hi <= REGIME_CHANGE * lo or hi <= _ROUND_SLACK


@dataclass(frozen=True)
class AutoscaleSettings:
    """Bounds, target and delays: the config's `cluster.reward_autoscale` (which owns the defaults), or
    `rayward scale --min/--max` (the same defaults, from the config)."""

    min_workers: int
    max_workers: int
    target_utilization: float  # busy fraction each worker should settle at
    look_back_s: float  # seconds of history a decision averages over (stretched to whole batch cycles)
    upscale_delay_s: float  # the load must call for more workers this long before the pool grows
    downscale_delay_s: float  # ... for fewer workers this long before it shrinks

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"autoscaling needs 1 <= min_workers <= max_workers, got {self.min_workers}..{self.max_workers}"
            )
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.look_back_s <= 0 or self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise ValueError("look_back_s must be > 0 and the delays >= 0")

    def clamp(self, n: int) -> int:
        return min(max(n, self.min_workers), self.max_workers)


@dataclass(frozen=True)
class PoolSample:
    """The pool's cumulative counters at time `t` (the policy differences them over its window)."""

    t: float  # monotonic seconds
    batches: int  # batches received so far: their arrivals delimit the window's cycles
    worker_s: float  # integral of live workers over time
    busy_s: float  # integral of busy workers (live workers holding at least one chunk) over time
    peak_outstanding: int  # the most chunks queued or being scored at once since the previous sample
    target: int  # workers alive or starting, not retiring: the count the pool is heading to
    live: int  # of those, the ones alive (the load was measured on them)
    idle_s: float = 0.0  # integral of the time the pool had nothing to do (no unit queued, no worker busy)
    outstanding: int = 0  # units queued or in flight now
    arrived_idle: bool = False  # (a sample taken at an arrival) the batch found the pool with nothing to do


@dataclass(frozen=True)
class Load:
    """One evaluation of the window."""

    t: float
    span_s: float  # seconds of history used (whole cycles + the one in progress)
    cycles: int  # whole arrival-to-arrival cycles in it (0: the batch in progress alone, a new regime)
    busy_workers: float  # average busy workers
    utilization: float  # busy / live worker-seconds
    peak_outstanding: int
    wanted: int  # `phase` for bursty batches, otherwise busy workers / target utilisation, rounded up
    desired: int  # `wanted` capped by peak_outstanding and clamped to [min_workers, max_workers]
    phase: int | None = None  # (bursty batches) the workers at which a batch's busy fraction is the target
    batch_work_s: float = 0.0  # busy worker-seconds per batch in the window
    batch_idle_s: float = 0.0  # seconds the pool idles per batch in the window


@dataclass(frozen=True)
class Decision:
    t: float
    before: int
    after: int
    reason: str

    @property
    def direction(self) -> str:
        return "up" if self.after > self.before else "down"


@dataclass
class _Mark:
    """A sample taken right after a batch arrived: where a window may start. `peak` is the most chunks
    outstanding at once from this mark until the next."""

    sample: PoolSample
    peak: int


class AutoscalePolicy:
    """Feed it `observe(sample)` periodically (the pool does, every AUTOSCALE_TICK_S); it returns a Decision
    when the target worker count should change, with its reason, and None otherwise."""

    def __init__(self, settings: AutoscaleSettings):
        self.settings = settings
        self._marks: deque[_Mark] = deque()
        self._last: PoolSample | None = None
        self._above_since: float | None = None
        self._below_since: float | None = None
        self.load: Load | None = None  # the latest evaluation (for stats and gauges)

    def set_bounds(self, settings: AutoscaleSettings, target: int, now: float) -> Decision | None:
        """New settings (e.g. `rayward scale --min/--max`); a target outside the new bounds moves at once."""
        self.settings = settings
        self._above_since = self._below_since = None
        clamped = settings.clamp(target)
        if clamped == target:
            return None
        return Decision(now, target, clamped, f"bounds changed to {settings.min_workers}..{settings.max_workers}")

    def observe(self, s: PoolSample) -> Decision | None:
        if self._last is not None and s.batches > self._last.batches:
            self._marks.append(_Mark(s, s.peak_outstanding))
        elif self._marks:
            self._marks[-1].peak = max(self._marks[-1].peak, s.peak_outstanding)
        self._last = s
        self._prune(s.t)
        load = self._evaluate(s)
        self.load = load
        if load is None:
            return None
        return self._decide(s, load)

    # --- the window ---------------------------------------------------------------------------------------

    def _prune(self, now: float) -> None:
        """Keep the marks a window may still start at: the newest one at least look_back_s old, and later ones
        (never fewer than two, so a whole cycle is always there)."""
        cutoff = now - self.settings.look_back_s
        while len(self._marks) > 2 and self._marks[1].sample.t <= cutoff:
            self._marks.popleft()

    def _evaluate(self, s: PoolSample) -> Load | None:
        if len(self._marks) < 2:
            return None  # not one whole cycle yet
        marks = list(self._marks)
        work = [b.sample.busy_s - a.sample.busy_s for a, b in itertools.pairwise(marks)]
        # The newest regime: whole cycles back from the newest while their work stays within REGIME_CHANGE of it.
        k = len(work) - 1
        while k > 0 and _same_regime(work[k - 1], work[-1]):
            k -= 1
        first, newest = marks[k].sample, marks[-1].sample
        cycles = len(work) - k
        whole_s, whole_busy, whole_live, whole_idle = (newest.t - first.t, newest.busy_s - first.busy_s,
                                                       newest.worker_s - first.worker_s, newest.idle_s - first.idle_s)
        if whole_s <= 0:
            return None
        avg_work = whole_busy / cycles
        # The cycle in progress: its batch is scored first, then the pool waits for the next one, so half-way
        # through it looks busier than it will be. Its work is extrapolated from the units it finished, the ones
        # being scored counted half done: a reward that just became slower shows at its first finished chunk.
        ip_s, ip_busy, ip_idle = s.t - newest.t, s.busy_s - newest.busy_s, s.idle_s - newest.idle_s
        done = newest.outstanding - s.outstanding
        ip_work = ip_busy
        if done > 0 and s.outstanding > 0:
            ip_work = ip_busy * newest.outstanding / (done + 0.5 * min(s.live, s.outstanding))
        bursty = all(m.sample.arrived_idle for m in marks[k:])
        if ip_work > REGIME_CHANGE * avg_work and ip_s > 0:
            # A new regime starts with this batch: it alone is the window (the rest of the step, the idle time,
            # is the newest whole cycle's: it does not depend on the reward).
            span, busy, live, cycles = ip_s, ip_busy, s.worker_s - newest.worker_s, 0
            work_c, idle_c = ip_work, newest.idle_s - marks[-2].sample.idle_s
            bursty = newest.arrived_idle
        elif ip_work > MORE_WORK * avg_work or (ip_s > 0 and (whole_busy + ip_busy) / (whole_s + ip_s)
                                                < whole_busy / whole_s):
            # It already holds more work than an average whole cycle (the pool reacts while that batch is still
            # being scored), or counting it lowers the load (a long pause).
            span, busy, live = s.t - first.t, s.busy_s - first.busy_s, s.worker_s - first.worker_s
            work_c = (whole_busy + ip_work) / (cycles + 1)
            idle_c = max(whole_idle / cycles, (whole_idle + ip_idle) / (cycles + 1))
        else:
            span, busy, live, work_c, idle_c = whole_s, whole_busy, whole_live, avg_work, whole_idle / cycles
        busy_workers = busy / span
        peak = max(m.peak for m in marks[k:])
        u = self.settings.target_utilization
        want = math.ceil(busy_workers / u - _ROUND_SLACK)
        phase = None
        if bursty:
            # Batches that find the pool idle and leave it idle (the synchronous loop): W worker-seconds of work
            # per batch, R idle seconds between batches. n workers score a batch in W / n, and the busy fraction
            # W / (W + n R) is the target u at n = W (1 - u) / (u R): the fixed point that the busy-worker rule
            # only approaches, by at most a factor 1 / u per decision, up or down. Never idle: all the queue can use.
            phase = want = math.ceil(work_c * (1 - u) / (u * idle_c) - _ROUND_SLACK) if idle_c > 0 else peak
        desired = self.settings.clamp(min(want, peak))
        return Load(s.t, span, cycles, busy_workers, busy / live if live > 0 else 0.0, peak, want, desired, phase,
                    work_c, idle_c)

    # --- delays -------------------------------------------------------------------------------------------

    def _decide(self, s: PoolSample, load: Load) -> Decision | None:
        st, target = self.settings, s.target
        if load.desired > target:
            self._below_since = None
            self._above_since = s.t if self._above_since is None else self._above_since
            held, delay = s.t - self._above_since, st.upscale_delay_s
        elif load.desired < s.live:
            self._above_since = None
            self._below_since = s.t if self._below_since is None else self._below_since
            held, delay = s.t - self._below_since, st.downscale_delay_s
        else:
            self._above_since = self._below_since = None
            return None
        if held < delay:
            return None
        self._above_since = self._below_since = None
        side = f"above {target}" if load.desired > target else f"below {s.live} live"
        over = f"{load.cycles} batch cycles" if load.cycles else "the batch in progress"
        if load.phase is not None:
            why = (
                f"batches of {load.batch_work_s:.2f} worker-s with the pool idle {load.batch_idle_s:.2f} s between "
                f"them ({over}) want {load.wanted} workers, each busy {st.target_utilization:g} of the time"
            )
        else:
            why = (
                f"{load.busy_workers:.2f} busy workers on average over {load.span_s:.1f} s ({over}, utilisation "
                f"{load.utilization:.2f}) want {load.wanted} at target utilisation {st.target_utilization:g}"
            )
        if load.wanted > load.peak_outstanding and load.desired == max(load.peak_outstanding, st.min_workers):
            why += f", capped at {load.peak_outstanding}: never more chunks outstanding at once"
        elif load.desired != load.wanted:
            why += f", bounded to {st.min_workers}..{st.max_workers}"
        return Decision(s.t, target, load.desired, f"{why}; {side} for {held:.1f} s")


__all__ = [
    "AutoscalePolicy",
    "AutoscaleSettings",
    "Decision",
    "Load",
    "PoolSample",
]
