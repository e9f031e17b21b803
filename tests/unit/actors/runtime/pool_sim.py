"""A time-stepped model of the synchronous loop around the reward pool, for the autoscaling policy's unit tests.

Each step sends one batch of `chunks` chunks to the pool, then spends `rest_s` generating and training. A
worker holds at most 2 chunks (the pool's CHUNKS_PER_WORKER) and scores them one at a time (a CPU-bound
reward); the pool gives each chunk to the least-loaded live worker. A worker the policy adds is live
`start_s` later; a retired one leaves when it has no chunk (starting ones first). The policy sees the same
cumulative counters the real pool integrates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.runtime.autoscale import AutoscalePolicy, AutoscaleSettings, Decision, PoolSample

SLOTS = 2


@dataclass
class _Worker:
    live_at: float
    held: list[float] = field(default_factory=list)  # seconds left of each chunk it holds, in order
    retiring: bool = False


@dataclass
class SimResult:
    reward_s: list[float]  # per step: seconds from the batch's arrival to its last chunk's end
    workers: list[int]  # per step: target workers when the step's batch was scored
    decisions: list[tuple[int, Decision]]  # (step, decision)
    worker_s: float  # integral of live workers over the run
    wall_s: float


def simulate(
    chunk_s: list[float], *, chunks: int, rest_s: float, workers: int, settings: AutoscaleSettings | None,
    start_s: float = 2.0, dt: float = 0.01, tick_s: float = 0.25,
) -> SimResult:
    """Run len(chunk_s) steps; step k's chunks each take chunk_s[k] seconds. settings None = a fixed pool."""
    pool = [_Worker(0.0) for _ in range(workers)]
    policy = AutoscalePolicy(settings) if settings else None
    t = worker_s = busy_s = idle_s = 0.0
    arrived_idle = False
    batches = peak = 0
    next_tick = tick_s
    res = SimResult([], [], [], 0.0, 0.0)

    def live() -> list[_Worker]:
        return [w for w in pool if w.live_at <= t]

    def target() -> int:
        return sum(not w.retiring for w in pool)

    def tick(step: int) -> None:
        nonlocal peak
        if policy is None:
            return
        d = policy.observe(PoolSample(t, batches, worker_s, busy_s, peak, target(),
                                      sum(not w.retiring for w in live()), idle_s, outstanding(), arrived_idle))
        peak = outstanding()
        if d is None:
            return
        res.decisions.append((step, d))
        active = [w for w in pool if not w.retiring]
        for _ in range(d.after - len(active)):
            pool.append(_Worker(t + start_s))
        # Retire starting workers first, then the least loaded.
        for w in sorted(active, key=lambda w: (w.live_at <= t, len(w.held)))[: max(len(active) - d.after, 0)]:
            w.retiring = True

    queue: list[float] = []

    def outstanding() -> int:
        return len(queue) + sum(len(w.held) for w in pool)

    def advance(step: int) -> None:
        nonlocal t, worker_s, busy_s, idle_s, next_tick
        while queue:  # dispatch to the least loaded live worker with room
            room = [w for w in live() if not w.retiring and len(w.held) < SLOTS]
            if not room:
                break
            min(room, key=lambda w: len(w.held)).held.append(queue.pop(0))
        lv = live()
        worker_s += len(lv) * dt
        busy_s += sum(bool(w.held) for w in lv) * dt
        idle_s += dt * (outstanding() == 0)
        for w in lv:
            if w.held:
                w.held[0] -= dt
                if w.held[0] <= 1e-9:
                    w.held.pop(0)
        pool[:] = [w for w in pool if not (w.retiring and not w.held)]
        t += dt
        if t >= next_tick:
            next_tick += tick_s
            tick(step)

    for step, cs in enumerate(chunk_s):
        res.workers.append(target())
        t0 = t
        arrived_idle = outstanding() == 0
        queue.extend([cs] * chunks)
        batches += 1
        peak = max(peak, outstanding())
        tick(step)  # the pool samples at every arrival
        while outstanding():
            advance(step)
        res.reward_s.append(t - t0)
        t_end = t + rest_s
        while t < t_end:
            advance(step)
    res.worker_s, res.wall_s = worker_s, t
    return res
