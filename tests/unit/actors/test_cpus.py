"""actors/cpus.py: core shares, vLLM's OpenMP bind strings, and what the start-up line says."""

import os

from actors.cpus import omp_bind, omp_waits, pick_cores


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
