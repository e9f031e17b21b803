"""actors/runtime/cpus.py: the core-sharing policy, core shares, vLLM's OpenMP bind strings, the start-up line."""

import os

from actors.runtime.cpus import (
    SHARED_CORES_ENV,
    generator_cpu_share,
    omp_bind,
    omp_waits,
    pick_cores,
    shared_cores_env,
)


def test_pick_cores_takes_a_fraction_of_the_allowed_cores_and_at_least_one():
    allowed = sorted(os.sched_getaffinity(0))
    assert pick_cores(None) == allowed
    assert pick_cores((0.0, 1.0)) == allowed
    assert len(pick_cores((0.5, 1.0))) >= 1 and set(pick_cores((0.5, 1.0))) <= set(allowed)


def test_omp_bind_gives_each_tensor_parallel_rank_its_own_cores():
    assert omp_bind([0, 1]) == "0-1"
    assert omp_bind([0, 1], ranks=2) == "0|1"
    assert omp_bind([4, 5, 6, 7], ranks=2) == "4-5|6-7"
    assert omp_bind([3], ranks=2) == "3|3"  # fewer cores than ranks: they share


def test_the_start_up_line_says_when_openmp_waits_are_passive(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert omp_waits() == ""
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert omp_waits() == ", passive OpenMP waits"


def test_cores_are_shared_only_by_pipelined_cpu_generators():
    assert generator_cpu_share(pipelined=True, cpu_split=0.25, on_gpu=False) == (0.25, 1.0)
    assert generator_cpu_share(pipelined=False, cpu_split=0.25, on_gpu=False) is None  # phases take turns
    assert generator_cpu_share(pipelined=True, cpu_split=0.25, on_gpu=True) is None


def test_cpu_actors_wait_passively_and_gpu_actors_keep_rays_defaults(monkeypatch):
    """CPU actors also cap oneDNN's primitive cache (an engine's memory grew ~250 MB over hundreds of step shapes
    with its default of 1,024; bench/engine_memory.py); the user's own setting wins."""
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert SHARED_CORES_ENV == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert shared_cores_env(0) == {"runtime_env": {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE",
                                                                "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128"}}}
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    assert shared_cores_env(0)["runtime_env"]["env_vars"]["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"
    assert shared_cores_env(1) == {}
