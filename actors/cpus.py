"""Which CPU cores an actor computes on (CPU nodes only; on GPUs Ray's defaults stay).

Ray gives an actor with num_cpus 0.5 one intra-op thread (OMP_NUM_THREADS=1), so on a CPU box the learner used
half the machine even in the sync loop, where nothing else runs while it trains. The driver decides instead,
when it builds the run: in the sync loop the phases take turns, so each actor may use every core of its node; in
the pipelined loop the learner and the generator run at once: the generator's engine gets its share of the node's
cores (`cluster.cpu_split`, a thread per core), and the learner computes on every core, so it has the
generator's cores too while the generator waits for its next batch. Both loops make both sides' OpenMP waits passive
(orchestrator/build.py, SHARED_CORES_ENV): they compute at once in the pipelined loop and during weight syncs.
"""

from __future__ import annotations

import os

Share = tuple[float, float]  # [lo, hi) as fractions of the node's cores


def pick_cores(share: Share | None) -> list[int]:
    """This process's allowed cores, or the [lo, hi) fraction of them (at least one core)."""
    cores = sorted(os.sched_getaffinity(0))
    if share is None:
        return cores
    lo, hi = share
    n = len(cores)
    a = min(int(lo * n), n - 1)
    b = max(int(round(hi * n)), a + 1)
    return cores[a:b]


def omp_bind(cores: list[int], ranks: int = 1) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` tensor-parallel ranks over `cores`: contiguous runs, "0|1" or
    "0-3|4-7" (one core per rank at least; ranks share cores when there are fewer cores than ranks)."""
    per = max(len(cores) // ranks, 1)
    runs = [cores[(r * per) % len(cores) : (r * per) % len(cores) + per] for r in range(ranks)]
    return "|".join(str(c[0]) if len(c) == 1 else f"{c[0]}-{c[-1]}" for c in runs)


def describe(cores: list[int]) -> str:
    return f"cores {omp_bind(cores)}" if cores else "no cores"


def omp_waits() -> str:
    """How this process's OpenMP threads wait at barriers, for the start-up log: "" (libgomp's default: spin, then
    sleep) or ", passive OpenMP waits" (OMP_WAIT_POLICY=PASSIVE, set where the learner and a generator share
    cores)."""
    return ", passive OpenMP waits" if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" else ""
