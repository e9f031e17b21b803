"""The pool base's shared pieces (actors/runtime/pool.py): the metric names both pools export, each pool's stats record
and the step metrics the driver logs from it, and the load accounting a `with self._load(slot):` block keeps. The
pools' own logic: tests/unit/actors/envs/test_pool.py; with Ray: tests/integration/actors/{rewards,envs}/."""

import dataclasses

import pytest

from actors.envs.pool import ENV_POOL, EnvPool
from actors.rewards.pool import REWARD_POOL, RewardPool
from actors.runtime.pool import Slot, pool_metric_names
from actors.types import EnvPoolStats, PoolStats, RewardPoolStats
from orchestrator.telemetry.ray_metrics import REWARD_POOL_METRICS

# What users' dashboards and alerts read (cluster/grafana-dashboard.json, docs/agents.md): the names stay.
REWARD_NAMES = {
    "rayward_reward_workers_alive": "Gauge", "rayward_reward_queue_depth": "Gauge",
    "rayward_reward_inflight_chunks": "Gauge", "rayward_reward_chunk_latency_s": "Histogram",
    "rayward_reward_events_total": "Counter", "rayward_reward_workers_target": "Gauge",
    "rayward_reward_workers_starting": "Gauge", "rayward_reward_utilization": "Gauge",
    "rayward_reward_queue_wait_s": "Histogram", "rayward_reward_scale_decisions_total": "Counter",
}
ENV_NAMES = {
    "rayward_env_workers_alive": "Gauge", "rayward_env_queue_depth": "Gauge",
    "rayward_env_inflight_calls": "Gauge", "rayward_env_call_latency_s": "Histogram",
    "rayward_env_events_total": "Counter", "rayward_env_workers_target": "Gauge",
    "rayward_env_workers_starting": "Gauge", "rayward_env_utilization": "Gauge",
    "rayward_env_queue_wait_s": "Histogram", "rayward_env_scale_decisions_total": "Counter",
}


@pytest.mark.parametrize(("kind", "names"), [(REWARD_POOL, REWARD_NAMES), (ENV_POOL, ENV_NAMES)])
def test_each_pool_exports_the_metric_names_it_always_had(kind, names):
    declared = pool_metric_names(kind.metrics, kind.units.unit).values()
    assert {name: cls for cls, name in declared} == names


def test_the_driver_lists_the_reward_pool_metrics_it_exports():
    assert set(REWARD_POOL_METRICS) == set(REWARD_NAMES)


def stats(cls, **fields):
    return cls(workers=3, target_workers=4, starting=1, retiring=0, calls_inflight=2, queue_depth=5, worker_s=1.5,
               utilization=0.5, decisions=2, autoscale="off", retries=1, replaced=1, **fields)


def test_each_pool_keeps_its_own_fields_and_step_metrics():
    shared = {f.name for f in dataclasses.fields(PoolStats)}
    assert {"global_step", "chunks", "errors"}.isdisjoint(shared)  # the reward pool's own
    assert {f.name for f in dataclasses.fields(EnvPoolStats)}.isdisjoint({"global_step", "chunks", "errors"})
    reward = stats(RewardPoolStats, global_step=7, chunks=3).step_metrics()
    assert reward == {"reward_pool/workers": 3, "reward_pool/target_workers": 4, "reward_pool/starting": 1,
                      "reward_pool/retries": 1, "reward_pool/replaced": 1, "reward_pool/queue_depth": 5,
                      "reward_pool/decisions": 2, "reward_pool/worker_s": 1.5, "reward_pool/utilization": 0.5}
    env = stats(EnvPoolStats, sessions=6, sessions_lost=1).step_metrics()
    assert env == {"env_pool/workers": 3, "env_pool/target_workers": 4, "env_pool/starting": 1,
                   "env_pool/sessions": 6, "env_pool/sessions_lost": 1, "env_pool/replaced": 1,
                   "env_pool/queue_depth": 5, "env_pool/decisions": 2, "env_pool/worker_s": 1.5,
                   "env_pool/utilization": 0.5, "env_pool/instances_created": 0, "env_pool/instances_reused": 0,
                   "env_pool/agent_errors": 0, "env_pool/agent_timeouts": 0}
    assert RewardPool.STATS is RewardPoolStats and EnvPool.STATS is EnvPoolStats


class _Accounting(RewardPool):
    """Just the load accounting: no workers, no event loop."""

    def __init__(self):
        self._busy, self._alive, self.worker_s, self.busy_s, self.idle_s = 0, 1, 0.0, 0.0, 0.0
        self._t_account = 0.0
        self.queued = self.inflight_chunks = 0


def test_a_load_block_keeps_the_busy_count_however_it_ends():
    pool, slot = _Accounting(), Slot(0, None, 0.0, alive=True)
    with pool._load(slot):
        slot.calls += 1
    assert pool._busy == 1
    with pool._load(slot):
        slot.calls += 1  # busy already: no change
    assert pool._busy == 1
    with pytest.raises(RuntimeError), pool._load(slot):
        slot.calls -= 2
        raise RuntimeError("the call failed")
    assert pool._busy == 0
    starting = Slot(1, None, 0.0)  # not alive yet: counted once it is (WorkerPool._await_alive)
    with pool._load(starting):
        starting.calls += 1
    assert pool._busy == 0
