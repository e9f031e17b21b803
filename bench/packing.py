"""Padded against packed (padding-free) learner micro-batches, on a long-tailed and on a uniform completion-length
workload, on a ~100M-parameter random Qwen2.

rayward's `Learner` in-process (no Ray), float32 on CPU, AdamW, loss dapo, beta 0, gradient checkpointing on (the
defaults). Each workload is one fixed batch of `--completions` completions after `--prompt-length`-token prompts:

* long-tailed: completion lengths drawn from a log-normal with median `--median` tokens and log-std `--sigma`,
  capped at `--cap` (most completions short, a few at the cap, as reasoning and agent traces are);
* uniform: every completion `--uniform-length` tokens.

Every layout trains the same batch cut into the same micro-batches (micro-batches of `--micro`, or with
`--max-tokens` token-budget bins too): padded (`grpo.padding_free=false`, TRL's layout) and packed. Measured:

* time, one process per workload with glibc's defaults: one learner whose layout alternates between steps
  (padded, packed, padded, ...; the micro-batch shuffle reseeded before each, so both cut alike) after a warm-up
  step in each, so a machine whose load drifts slows both alike; the median over `--rounds` steps of the step's
  wall time and of `learner/tokens_per_s` (the batch's real tokens per second), and `learner/padding_frac`;
* peak memory, one process per (workload, layout), as bench/learner_memory.py measures it: a warm-up step (the
  optimizer state exists from then on), then VmHWM of /proc/self/status over the next step after writing 5 to
  /proc/self/clear_refs, with MALLOC_MMAP_THRESHOLD_=65536 so resident memory follows the live tensors.

    python bench/packing.py                                   # both workloads (~15 min on 2 quiet cores)
    python bench/packing.py --workloads long_tailed --rounds 2 --max-tokens 2048 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.child import report, run_child  # noqa: E402 - after the path insert
from bench.models import SHAPES, build_model  # noqa: E402

SIZE = "100m"  # Qwen2-shaped, tied embeddings, ~100M parameters (bench/learner_memory.py's)
VOCAB = SHAPES[SIZE][5]
WORKLOADS = ("long_tailed", "uniform")
# glibc: allocations of at least this many bytes are mmapped and unmapped when freed (memory processes only).
MMAP_THRESHOLD = 65536
SEED = 0


def completion_lengths(workload: str, a: argparse.Namespace) -> list[int]:
    """The workload's completion lengths (seeded: the same every invocation)."""
    if workload == "uniform":
        return [a.uniform_length] * a.completions
    rng = random.Random(SEED)
    return [max(1, min(a.cap, round(a.median * rng.lognormvariate(0.0, a.sigma)))) for _ in range(a.completions)]


def make_batch(workload: str, a: argparse.Namespace):
    import torch

    from actors.types import TrainBatch

    g = torch.Generator().manual_seed(SEED)
    lens = completion_lengths(workload, a)
    return TrainBatch(
        prompt_ids=[torch.randint(3, VOCAB, (a.prompt_length,), generator=g).tolist() for _ in lens],
        completion_ids=[torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lens],
        sampling_logprobs=[[float("nan")] * n for n in lens],
        advantages=torch.randn(len(lens), generator=g).tolist(),
        truncated=[n == a.cap for n in lens],
    )


def layouts(a: argparse.Namespace) -> dict[str, tuple[bool, int | None]]:
    """name -> (packed, max_tokens_per_microbatch)."""
    out = {"padded": (False, None), "packed": (True, None)}
    if a.max_tokens:
        out.update({"padded, budget": (False, a.max_tokens), "packed, budget": (True, a.max_tokens)})
    return out


def make_learner(model: str, a: argparse.Namespace):
    from actors.learner.learner import Learner
    from actors.learner.loss import LossConfig
    from actors.learner.specs import LearnerSpec, ModelSpec, OptimSpec, StepSpec

    lr = Learner(LearnerSpec(
        model=ModelSpec(model), optim=OptimSpec(learning_rate=1e-6),
        loss=LossConfig(loss_type="dapo", max_completion_length=a.cap), step=StepSpec(micro_batch_size=a.micro),
        device="cpu",
    ))
    assert lr.packed, "the bench model must pack (grpo.padding_free null picked padded)"
    return lr


def set_layout(lr, packed: bool, max_tokens: int | None) -> None:
    """The same learner, laid out the other way: the packing switch and the token budget of its spec."""
    lr.packed = packed
    lr.spec = dataclasses.replace(lr.spec, step=dataclasses.replace(lr.spec.step, max_tokens_per_microbatch=max_tokens))
    lr._rng = random.Random(SEED)  # the same shuffle, so every layout cuts the same micro-batches


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def measure_memory(model: str, workload: str, layout: str, a: argparse.Namespace) -> dict:
    """Peak resident memory of one step after a warm-up, in this process (run with MALLOC_MMAP_THRESHOLD_)."""
    lr, batch = make_learner(model, a), make_batch(workload, a)
    set_layout(lr, *layouts(a)[layout])
    lr.train_step(batch)
    set_layout(lr, *layouts(a)[layout])
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    lr.train_step(batch)
    return {"peak_mib": _status_mib("VmHWM")}


def measure_time(model: str, workload: str, a: argparse.Namespace) -> dict:
    """Each layout's step wall time and metrics, layouts alternating step by step on one learner."""
    import torch

    lr, batch = make_learner(model, a), make_batch(workload, a)
    names = list(layouts(a))

    def step(name: str) -> dict:
        set_layout(lr, *layouts(a)[name])
        t0 = time.perf_counter()
        m = lr.train_step(batch).metrics
        return {"wall_s": time.perf_counter() - t0, **{k: m[k] for k in m if k.startswith("learner/")}}

    for name in names:  # warm-up in each layout
        step(name)
    rows = [(name, step(name)) for _ in range(a.rounds) for name in names]
    out: dict = {"threads": torch.get_num_threads()}
    for name in names:
        mine = [r for n, r in rows if n == name]
        out[name] = {
            "wall_s": [r["wall_s"] for r in mine],
            "step_s": statistics.median(r["wall_s"] for r in mine),
            "tokens_per_s": statistics.median(r["learner/tokens_per_s"] for r in mine),
            "padding_frac": mine[0]["learner/padding_frac"],
            "micro_batches": mine[0]["learner/micro_batches"],
        }
    return out


def _sub(args: list[str], env: dict[str, str]) -> dict:
    return run_child(__file__, args, env)


def _describe(workload: str, a: argparse.Namespace) -> str:
    lens = sorted(completion_lengths(workload, a))
    real = sum(lens) + a.prompt_length * len(lens)
    return (f"{workload}: {len(lens)} completions, lengths median {statistics.median(lens):.0f}, mean "
            f"{statistics.mean(lens):.0f}, max {lens[-1]} (at the cap {a.cap}: {lens.count(a.cap)}); {real} real "
            f"tokens with the {a.prompt_length}-token prompts")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {list(WORKLOADS)}")
    ap.add_argument("--completions", type=int, default=16, help="completions per step")
    ap.add_argument("--micro", type=int, default=8, help="micro-batch size (per_device_train_batch_size)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="also time token-budget micro-batches of this many positions (max_tokens_per_microbatch)")
    ap.add_argument("--prompt-length", type=int, default=32)
    ap.add_argument("--median", type=int, default=64, help="long-tailed: the median completion length")
    ap.add_argument("--sigma", type=float, default=1.2, help="long-tailed: the log-normal's log-std")
    ap.add_argument("--cap", type=int, default=1024, help="long-tailed: the longest completion (max_completion_length)")
    ap.add_argument("--uniform-length", type=int, default=128, help="uniform: every completion's length")
    ap.add_argument("--rounds", type=int, default=3, help="timed steps per layout (after a warm-up)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--memory", help=argparse.SUPPRESS)  # internal: WORKLOAD:LAYOUT, print one memory measurement
    ap.add_argument("--time", help=argparse.SUPPRESS)  # internal: WORKLOAD, print one timing measurement
    a = ap.parse_args()
    model = str(build_model(SIZE))
    if a.memory:
        workload, layout = a.memory.split(":", 1)
        report(measure_memory(model, workload, layout, a))
        return
    if a.time:
        report(measure_time(model, a.time, a))
        return
    h, layers, inter, heads, kv, vocab = SHAPES[SIZE]
    print(f"model: random Qwen2 hidden {h}, {layers} layers, intermediate {inter}, {heads} heads / {kv} kv, vocab "
          f"{vocab}, tied, float32; AdamW, dapo, gradient checkpointing; micro-batches of {a.micro}"
          + (f", and token-budget bins of {a.max_tokens}" if a.max_tokens else ""), flush=True)
    flags = [f"--completions={a.completions}", f"--micro={a.micro}", f"--prompt-length={a.prompt_length}",
             f"--median={a.median}", f"--sigma={a.sigma}", f"--cap={a.cap}", f"--uniform-length={a.uniform_length}",
             f"--rounds={a.rounds}", *([f"--max-tokens={a.max_tokens}"] if a.max_tokens else [])]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    results: dict = {}
    for workload in a.workloads.split(","):
        print(_describe(workload, a), flush=True)
        r = results[workload] = _sub(["--time", workload, *flags], env)
        for layout in layouts(a):
            if not a.no_memory:
                mem = _sub(["--memory", f"{workload}:{layout}", *flags],
                           {**env, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})
                r[layout].update(mem)
            x = r[layout]
            peak = f", peak {x['peak_mib']:6.0f} MiB" if "peak_mib" in x else ""
            print(f"  {layout:15s} step {x['step_s']:6.2f} s (each {[round(w, 2) for w in x['wall_s']]}), "
                  f"{x['tokens_per_s']:7.0f} real tokens/s, padding {100 * x['padding_frac']:4.1f} %, "
                  f"{x['micro_batches']:.0f} micro-batches{peak}", flush=True)
        for base, other in (("padded", "packed"), ("padded, budget", "packed, budget")):
            if base in r and other in r:
                b, o = r[base], r[other]
                mem = f", peak {o['peak_mib'] - b['peak_mib']:+.0f} MiB" if "peak_mib" in b else ""
                print(f"  {other} vs {base}: {b['step_s'] / o['step_s']:.2f}x faster per step{mem}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=1))


if __name__ == "__main__":
    main()
