"""The reward pool's autoscaling policy (pure): windows of whole batch cycles, delays, caps and bounds, and
simulated synchronous runs whose reward slows down eightfold and recovers (tests.unit.actors.runtime.pool_sim.py).
What only a real pool shows (its counters drive the policy, real workers start and retire, nothing is scored
twice) is in tests/integration/actors/rewards/test_pool.py."""

from __future__ import annotations

import pytest

from actors.runtime.autoscale import AutoscalePolicy, AutoscaleSettings, Decision, PoolSample
from orchestrator.config import RewardAutoscaleConfig
from tests.unit.actors.runtime.pool_sim import simulate

TICK = 0.25


class FakePool:
    """Cumulative counters of a pretend pool, sampled every TICK like the real one; decisions move the target
    (and the live count with it: workers start at once here)."""

    def __init__(self, settings: AutoscaleSettings, workers: int):
        self.policy = AutoscalePolicy(settings)
        self.t = self.worker_s = self.busy_s = 0.0
        self.batches = self.peak = 0
        self.target = workers
        self.starting = 0  # of the target, workers not alive yet (they neither work nor count as live)
        self.decisions: list[Decision] = []
        self.desired: list[tuple[float, int]] = []  # (t, desired) at every evaluated sample

    def _observe(self) -> None:
        d = self.policy.observe(PoolSample(self.t, self.batches, self.worker_s, self.busy_s, self.peak, self.target,
                                           self.live))
        if self.policy.load is not None:
            self.desired.append((self.t, self.policy.load.desired))
        if d is not None:
            self.decisions.append(d)
            self.target = d.after

    @property
    def live(self) -> int:
        return self.target - self.starting

    def arrive(self, chunks: int) -> None:
        self.batches += 1
        self.peak = max(self.peak, chunks)
        self._observe()

    def run(self, seconds: float, busy: float, outstanding: int = 0) -> None:
        """`busy` workers scoring (at most the live ones) for `seconds`."""
        for _ in range(round(seconds / TICK)):
            self.t += TICK
            self.worker_s += self.live * TICK
            self.busy_s += min(busy, self.live) * TICK
            self._observe()
            self.peak = outstanding

    def cycle(self, busy_s: float, rest_s: float, chunks: int = 8) -> None:
        """One synchronous step: a batch keeps every worker busy for busy_s, then the pool idles rest_s."""
        self.arrive(chunks)
        self.run(busy_s, busy=self.live, outstanding=chunks)
        self.run(rest_s, busy=0)


def settings(**kw) -> AutoscaleSettings:
    base = dict(min_workers=1, max_workers=8, target_utilization=0.5, look_back_s=5.0, upscale_delay_s=2.0,
                downscale_delay_s=4.0)
    return AutoscaleSettings(**{**base, **kw})


def test_settings_are_checked():
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        settings(min_workers=5, max_workers=4)
    with pytest.raises(ValueError, match="min_workers"):
        settings(min_workers=0)
    with pytest.raises(ValueError, match="target_utilization"):
        settings(target_utilization=1.5)
    with pytest.raises(ValueError, match="delays"):
        settings(upscale_delay_s=-1)
    assert settings(min_workers=2, max_workers=4).clamp(9) == 4 and settings(min_workers=2).clamp(0) == 2


def test_no_decision_before_one_whole_batch_cycle():
    pool = FakePool(settings(upscale_delay_s=0), workers=1)
    pool.run(30, busy=0)  # generators starting: no batch yet
    pool.arrive(8)
    pool.run(30, busy=1, outstanding=8)  # one batch keeps the worker busy for 30 s: still one arrival
    assert pool.decisions == [] and pool.policy.load is None


def test_a_slower_reward_grows_the_pool_while_its_batch_runs_after_the_upscale_delay():
    pool = FakePool(settings(), workers=1)
    for _ in range(4):
        pool.cycle(busy_s=1, rest_s=2)  # a third of the time busy: 1 worker is enough at target 0.5
    assert pool.decisions == [] and {d for _, d in pool.desired} == {1}
    t_rise = pool.t
    pool.cycle(busy_s=8, rest_s=2)  # the reward got 8x slower
    (d,) = pool.decisions[:1]
    above_from = min(t for t, want in pool.desired if t > t_rise and want > 1)
    # Decided while that batch still ran, no sooner than upscale_delay_s after the load first called for it.
    assert d.before == 1 and d.after >= 2 and t_rise < d.t <= t_rise + 8
    assert d.t - above_from >= 2.0 - 1e-9
    assert "busy workers on average" in d.reason and "target utilisation 0.5" in d.reason and "above 1" in d.reason


def test_whole_cycle_windows_do_not_mistake_a_burst_for_load():
    """Steps longer than look_back_s: during each batch the worker is 100% busy, but over whole steps 20%."""
    pool = FakePool(settings(look_back_s=3, upscale_delay_s=0.5), workers=1)
    for _ in range(10):
        pool.cycle(busy_s=4, rest_s=16)
    assert pool.decisions == [] and {d for _, d in pool.desired} == {1}


def test_the_pool_shrinks_only_after_the_downscale_delay_and_a_busy_spell_restarts_it():
    pool = FakePool(settings(max_workers=4, downscale_delay_s=6), workers=4)
    for _ in range(3):
        pool.cycle(busy_s=2, rest_s=1)  # 4 workers busy 2/3 of the time: they would like 6, the bound is 4
    assert pool.decisions == []
    pool.cycle(busy_s=0.25, rest_s=2.75)  # light: fewer would do...
    assert pool.desired[-1][1] < 4
    pool.cycle(busy_s=2.5, rest_s=0.5)  # ...but a busy spell comes before downscale_delay_s has passed
    t_spell = pool.t
    for _ in range(6):
        pool.cycle(busy_s=0.25, rest_s=2.75)
    assert pool.decisions and pool.decisions[0].t > t_spell  # nothing decided before the spell
    down = pool.decisions[0]
    last_at_4 = max(t for t, want in pool.desired if t < down.t and want >= 4)
    assert down.after < down.before == 4 and down.t - last_at_4 >= 6 - TICK  # held below for the whole delay
    first_below = min(t for t, want in pool.desired if want < 4)
    assert down.t > first_below + 6 + TICK  # the spell restarted the clock
    assert "below 4 live for" in down.reason


def test_workers_still_starting_are_not_retired_on_load_measured_without_them():
    """4 asked for, 1 still waiting for a node: the 3 live ones' load wants 3, which is no reason to cancel the
    4th before it has been measured; a load that wants fewer than the live ones is."""
    pool = FakePool(settings(downscale_delay_s=1), workers=4)
    pool.starting = 1
    for _ in range(6):
        pool.cycle(busy_s=1.5, rest_s=1.5)  # 3 live, busy half the time: 1.5 busy workers want 3
    assert pool.policy.load.desired == 3 and pool.decisions == []
    for _ in range(6):
        pool.cycle(busy_s=0.5, rest_s=2.5)  # 0.5 busy workers want 1: fewer than the live ones
    assert pool.decisions and pool.decisions[0].after < 3 and "below 3 live" in pool.decisions[0].reason


def test_a_long_pause_lets_the_pool_shrink_to_min_workers():
    pool = FakePool(settings(min_workers=2, downscale_delay_s=10), workers=6)
    for _ in range(4):
        pool.cycle(busy_s=2, rest_s=1)
    pool.run(60, busy=0)  # no batch for a minute (evaluation, checkpoint)
    assert pool.target == 2 and pool.decisions[-1].after == 2


def test_growth_is_capped_by_the_chunks_there_are_and_by_max_workers():
    pool = FakePool(settings(upscale_delay_s=0), workers=2)
    for _ in range(6):  # two chunks per step keep both workers busy all the time: more workers would idle
        pool.arrive(2)
        pool.run(3, busy=2, outstanding=2)
    assert pool.decisions == [] and pool.policy.load.wanted == 4 and pool.policy.load.desired == 2
    pool = FakePool(settings(max_workers=3, upscale_delay_s=0), workers=2)
    for _ in range(6):
        pool.arrive(64)
        pool.run(3, busy=pool.target, outstanding=64)
    assert pool.target == 3 and all(d.after <= 3 for d in pool.decisions)
    assert "bounded to 1..3" in pool.decisions[-1].reason


# --- simulated synchronous runs (tests.unit.actors.runtime.pool_sim.py) -------------------------------------


def check_slowdown_run(lat: list[float], rise: int, drop: int, st: AutoscaleSettings, **sim) -> None:
    auto = simulate(lat, settings=st, workers=st.min_workers, **sim)
    fixed = simulate(lat, settings=None, workers=st.max_workers, **sim)
    slow = auto.reward_s[rise:drop]
    assert max(auto.workers[rise:drop]) > st.min_workers  # grew
    assert min(slow[-3:]) <= 0.5 * slow[0], auto.reward_s  # reward time at most half of right after the rise
    assert auto.workers[-1] == st.min_workers, auto.workers  # and back after the drop
    assert auto.worker_s < fixed.worker_s, (auto.worker_s, fixed.worker_s)
    # No flapping: grows while the reward is slow, shrinks after, each at most once in a while.
    ups = [step for step, d in auto.decisions if d.after > d.before]
    downs = [step for step, d in auto.decisions if d.after < d.before]
    assert ups and downs and max(ups) < drop <= min(downs), auto.decisions


def test_simulated_run_with_short_delays_follows_an_eightfold_slowdown_and_back():
    """The integration test's shape: 8 chunks of 0.08 s per step (0.64 s at 1 worker), 1.5 s of the rest."""
    lat = [0.08] * 3 + [0.64] * 7 + [0.08] * 7
    st = settings(max_workers=4, look_back_s=3, upscale_delay_s=1, downscale_delay_s=3)
    check_slowdown_run(lat, 3, 10, st, chunks=8, rest_s=1.5, start_s=4.0)


def test_simulated_hour_long_run_with_the_default_delays():
    """The config's defaults (Serve-like: 30 s up, 600 s down): 64 chunks of 1.5 s per step, 40 s of generation and
    training, the reward 8x slower from step 20 to step 60; the pool starts at the 3 workers the load settles at."""
    lat = [1.5] * 20 + [12.0] * 40 + [1.5] * 40
    st = AutoscaleSettings(**RewardAutoscaleConfig(min_workers=3, max_workers=32).model_dump())
    check_slowdown_run(lat, 20, 60, st, chunks=64, rest_s=40.0, start_s=20.0, dt=0.1, tick_s=1.0)


def test_a_burst_grows_the_pool_to_what_it_needs_in_one_decision_and_it_shrinks_once_the_burst_is_over():
    """Issue 35's case: bench/reward_autoscale.py's shape with Serve's 30 s look-back, longer than the whole slow
    spell's tail. The pool used to grow 1 -> 2 -> 3 (reward time 0.37x) and hold 3 to the end; now the first slow
    batch's finished chunks say how much work a batch is, and the pool moves to the workers that work needs."""
    lat = [0.08] * 4 + [0.64] * 10 + [0.08] * 10
    st = settings(max_workers=4, look_back_s=30, upscale_delay_s=1, downscale_delay_s=3)
    check_slowdown_run(lat, 4, 14, st, chunks=8, rest_s=1.5, start_s=4.0)
    auto = simulate(lat, settings=st, workers=1, chunks=8, rest_s=1.5, start_s=4.0)
    (up_step, up), (down_step, down) = auto.decisions
    # W = 8 x 0.64 = 5.12 worker-s per batch, R = 1.5 s idle: n = W (1 - u) / (u R) = 3.4 -> 4, while the first
    # slow batch runs; back to 1 two fast steps after the drop (downscale_delay_s 3 s).
    assert (up_step, up.before, up.after) == (4, 1, 4) and "batches of" in up.reason
    assert (down_step, down.after) == (16, 1) and "below 4 live" in down.reason
    slow = auto.reward_s[4:14]
    assert min(slow[-3:]) <= 0.3 * slow[0]  # 4 workers: 2 chunks each


def test_overlapping_arrivals_size_by_busy_workers():
    """Batches that arrive while earlier work runs (the pipelined loop) are not bursts: no idle time tells how
    long the rest of a step is, so the pool sizes by busy workers / target (Serve's rule)."""
    pool = FakePool(settings(upscale_delay_s=0), workers=2)
    for _ in range(6):
        pool.arrive(4)
        pool.run(1, busy=2, outstanding=4)  # never idle, never a burst: 2 busy workers want 4
    assert pool.policy.load.phase is None and pool.policy.load.wanted == 4 and pool.target == 4
