"""A vLLM-CPU engine's memory over many batch shapes, with oneDNN's primitive cache at each capacity.

    python bench/engine_memory.py                                  # default (1,024), rayward's 128, and 0
    python bench/engine_memory.py --capacities default,128 --rounds 12 --model tiny-tools

vLLM-CPU runs its linear layers through oneDNN, which builds a primitive for each shape it meets (the tokens of an
engine step x the layer's shape) and keeps up to ONEDNN_PRIMITIVE_CACHE_CAPACITY of them process-wide. An agentic
run's prompts (a chat with tool schemas and tool results: hundreds of tokens, every length different) give the
engine hundreds of step sizes. Each capacity runs in a subprocess of its own (oneDNN reads the variable when it
first builds a primitive), one after the other: rayward's Generator (an in-process engine, as a run's generator),
then --rounds rounds of --calls generate calls, each a batch of 1-40 prompts of 20-600 random tokens and 4-60 new
tokens (EOS ignored; round r draws with seed r % --shape-sets, so shapes come back after --shape-sets rounds).
Prints the process's USS after each round, its growth after the first round (which first uses the engine's
buffers, whatever the cache), and the wall time of all rounds. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAPACITY_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def worker(model: str, rounds: int, calls: int, shape_sets: int) -> dict[str, object]:
    import psutil
    from vllm import SamplingParams

    from actors.generation.generator import Generator
    from orchestrator.builtin.models import resolve

    gen = Generator(resolve(model), max_model_len=768, kv_cache_gib=1)
    proc = psutil.Process()

    def uss() -> float:
        return proc.memory_full_info().uss / 2**20

    start, per_round = uss(), []
    t0 = time.perf_counter()
    for r in range(rounds):
        rng = random.Random(r % shape_sets)
        for _ in range(calls):
            prompts = [[rng.randint(5, 500) for _ in range(rng.randint(20, 600))] for _ in range(rng.randint(1, 40))]
            params = SamplingParams(max_tokens=rng.randint(4, 60), temperature=1.0, ignore_eos=True)
            [r.result() for r in gen.loop.submit_batch(prompts, params)]
        per_round.append(round(uss()))
    gen.loop.close(60)
    return {"start": round(start), "rounds": per_round, "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacities", default="default,128,0", help="comma-separated; `default`: oneDNN's own")
    ap.add_argument("--model", default="tiny-tools")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--shape-sets", type=int, default=4)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.rounds, args.calls, args.shape_sets)))
        return
    print(f"engine memory over batch shapes: {args.model}, {args.rounds} rounds of {args.calls} generate calls, "
          f"{args.shape_sets} shape sets")
    print(f"{'capacity':>9}  {'start MB':>8}  {'round 1':>8}  {'last MB':>8}  {'growth':>7}  {'wall s':>6}  "
          "USS by round (MB)")
    for cap in args.capacities.split(","):
        env = {k: v for k, v in os.environ.items() if k != CAPACITY_ENV}
        if cap != "default":
            env[CAPACITY_ENV] = cap
        env.update(PYTHONPATH=str(ROOT), VLLM_LOGGING_LEVEL="ERROR")
        out = subprocess.run([sys.executable, __file__, "--worker", "1", "--model", args.model, "--rounds",
                              str(args.rounds), "--calls", str(args.calls), "--shape-sets", str(args.shape_sets)],
                             env=env, cwd=ROOT, capture_output=True, text=True, check=False)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            sys.exit(f"capacity {cap}: the worker failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
        r = json.loads(lines[-1])
        first, last = r["rounds"][0], r["rounds"][-1]
        print(f"{cap:>9}  {r['start']:>8}  {first:>8}  {last:>8}  {last - first:>+7}  {r['wall_s']:>6.1f}  "
              f"{' '.join(str(x) for x in r['rounds'])}", flush=True)


if __name__ == "__main__":
    main()
