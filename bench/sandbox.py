"""Sandbox throughput: sandboxed program runs per second in one worker process (a script, not a test).

    python bench/sandbox.py --runs 50
    python bench/sandbox.py --runs 200 --concurrency 4

Times, on the same tiny program (`print(sum(range(1000)))`):
  bare          subprocess.run([python, "-c", ...]) with this process's Python and with the sandbox's
  sandboxed     run_sandboxed(...) one after another, then from --concurrency threads at once (as the
                code_tests reward does under its semaphore)
  code_tests    the reward on one correct completion with 4 asserts (runner + nonce channel included)
and prints runs/s, wall and CPU milliseconds per run (CPU: user + system time of every process the run
started, which a busy shared machine disturbs far less than wall time), and the sandbox's overhead per
run over the bare subprocess of the same interpreter.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.rewards.code_tests import make_code_tests  # noqa: E402
from actors.rewards.sandbox import Limits, describe_protections, run_sandboxed, sandbox_python  # noqa: E402

PROGRAM = "print(sum(range(1000)))"
COMPLETION = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
WARMUP_RUNS = 3  # page cache, interpreter pick, probe


def _cpu_s() -> float:
    """CPU seconds used so far by this process and every (waited-for) descendant."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], object], runs: int, concurrency: int = 1) -> tuple[float, float]:
    """(wall seconds, CPU seconds) per run over `runs` calls spread over `concurrency` threads."""
    for _ in range(WARMUP_RUNS):
        fn()
    t0, c0 = time.perf_counter(), _cpu_s()
    if concurrency == 1:
        for _ in range(runs):
            fn()
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: fn(), range(runs)))
    return (time.perf_counter() - t0) / runs, (_cpu_s() - c0) / runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    limits = Limits(timeout_s=5.0)
    sb_python = sandbox_python(limits)
    print(describe_protections(limits))
    print(f"\n{args.runs} runs each, {len(os.sched_getaffinity(0))} CPUs, concurrency {args.concurrency}\n")

    def bare(python: str) -> Callable[[], object]:
        return lambda: subprocess.run([python, "-c", PROGRAM], capture_output=True, check=True)

    def sandboxed() -> None:
        r = run_sandboxed(PROGRAM, limits=limits)
        assert r.ok and r.stdout.strip() == "499500", r

    reward = make_code_tests(timeout_s=5.0, max_concurrency=args.concurrency)

    def scored() -> None:
        assert reward(prompts=["p"], completions=[COMPLETION], tests=[TESTS]) == [1.0]

    rows = [
        (f"bare subprocess ({sys.executable})", timed(bare(sys.executable), args.runs)),
        (f"bare subprocess ({sb_python})", timed(bare(sb_python), args.runs)),
        ("sandboxed, sequential", timed(sandboxed, args.runs)),
        (f"sandboxed, {args.concurrency} threads", timed(sandboxed, args.runs, args.concurrency)),
        ("code_tests reward, sequential", timed(scored, args.runs)),
        (f"code_tests reward, {args.concurrency} threads", timed(scored, args.runs, args.concurrency)),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'':<{width}}  {'runs/s':>8}  {'wall ms':>8}  {'CPU ms':>8}  (per run)")
    for name, (wall, cpu) in rows:
        print(f"{name:<{width}}  {1 / wall:8.1f}  {wall * 1000:8.1f}  {cpu * 1000:8.1f}")
    (base_wall, base_cpu), (sb_wall, sb_cpu), (ct_wall, ct_cpu) = rows[1][1], rows[2][1], rows[4][1]
    print(f"\noverhead over a bare run of {sb_python}, sequential: sandbox {(sb_wall - base_wall) * 1000:.1f} ms wall, "
          f"{(sb_cpu - base_cpu) * 1000:.1f} ms CPU; a code_tests completion "
          f"{(ct_wall - base_wall) * 1000:.1f} ms wall, {(ct_cpu - base_cpu) * 1000:.1f} ms CPU")


if __name__ == "__main__":
    main()
