"""Learner memory and step time: gradient checkpointing off and on, full fine-tuning and LoRA, on a ~100M-parameter
random Qwen2 at completion length 512.

rayward's `Learner` runs in-process (no Ray), float32 on CPU, AdamW, loss dapo, beta 0. The batch: `--completions`
completions of `--length` tokens after a `--prompt-length`-token prompt, in micro-batches of `--micro`. Every
measurement runs in a subprocess of its own:

* memory, one process per (full | LoRA) x (checkpointing off | on): a warm-up `train_step` (the optimizer state
  exists from then on), then the peak resident memory of the next step (VmHWM of /proc/self/status after writing 5
  to /proc/self/clear_refs just before it). These processes run with MALLOC_MMAP_THRESHOLD_=65536: glibc then
  hands every freed tensor back to the OS, so resident memory follows the live tensors. With glibc's defaults it
  keeps freed blocks of up to 32 MB, and the peak would also count whatever fragments the warm-up left behind. That
  setting makes steps several times slower here (every allocation faults its pages in afresh), so no time is
  measured in these processes.
* time, one process per (full | LoRA) with glibc's defaults: checkpointing alternates between steps (off, on, off,
  on, ...: transformers' gradient_checkpointing_disable / _enable on the same learner), after a warm-up step in each
  mode, so a machine whose load drifts (shared cores) slows both alike. Each step's wall time and the process's CPU
  time (user + system, all threads: less sensitive to other processes on the cores) are recorded, and the medians
  over `--rounds` steps per mode are reported.

    python bench/learner_memory.py                       # full and LoRA (~20-30 min on 2 shared cores)
    python bench/learner_memory.py --kinds full --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.child import report, run_child  # noqa: E402 - after the path insert
from bench.models import SHAPES, build_model  # noqa: E402

SIZE = "100m"  # Qwen2-shaped, tied embeddings, ~100M parameters (the issue's shape; bench/weight_sync.py's too)
HIDDEN, LAYERS, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = SHAPES[SIZE]
# LoRA as usually run for RL: every linear layer, rank 16 (TRL's "LoRA without regret" uses all-linear).
LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
KINDS = {"full": None, "lora": LORA}  # name -> the learner's lora argument
# glibc: allocations of at least this many bytes are mmapped and unmapped when freed (memory processes only).
MMAP_THRESHOLD = 65536


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _learner(model: str, kind: str, gc: bool, completions: int, length: int, prompt_length: int, micro: int):
    import torch

    from actors.learner.learner import Learner
    from actors.learner.loss import LossConfig
    from actors.learner.specs import LearnerSpec, ModelSpec, OptimSpec, StepSpec
    from actors.types import TrainBatch

    g = torch.Generator().manual_seed(0)
    batch = TrainBatch(
        prompt_ids=[torch.randint(3, VOCAB, (prompt_length,), generator=g).tolist() for _ in range(completions)],
        completion_ids=[torch.randint(3, VOCAB, (length,), generator=g).tolist() for _ in range(completions)],
        sampling_logprobs=[[float("nan")] * length for _ in range(completions)],
        advantages=torch.randn(completions, generator=g).tolist(),
        truncated=[False] * completions,
    )
    lr = Learner(LearnerSpec(
        model=ModelSpec(model, gradient_checkpointing=gc, lora=KINDS[kind]), optim=OptimSpec(learning_rate=1e-5),
        loss=LossConfig(loss_type="dapo", max_completion_length=length), step=StepSpec(micro_batch_size=micro),
        device="cpu",
    ))
    return lr, batch


def measure_memory(model: str, kind: str, gc: bool, **shape: int) -> dict:
    """Peak resident memory of one step after a warm-up, in this process (run with MALLOC_MMAP_THRESHOLD_)."""
    lr, batch = _learner(model, kind, gc, **shape)
    lr.train_step(batch)  # warm-up: the optimizer state exists from here on
    before = _status_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    lr.train_step(batch)
    return {"peak_mib": _status_mib("VmHWM"), "before_mib": before,
            "params_m": sum(p.numel() for p in lr.model.parameters()) / 1e6,
            "trained_m": sum(p.numel() for p in lr.model.parameters() if p.requires_grad) / 1e6}


def measure_time(model: str, kind: str, rounds: int, **shape: int) -> dict:
    """Wall and CPU seconds per step, checkpointing alternating off and on, in this process (glibc's defaults)."""
    import torch

    lr, batch = _learner(model, kind, True, **shape)
    hf = lr.model.get_base_model() if KINDS[kind] else lr.model  # the transformers model that checkpoints its layers

    def step(gc: bool) -> tuple[float, float]:
        if gc and not hf.is_gradient_checkpointing:
            hf.gradient_checkpointing_enable()
        elif not gc and hf.is_gradient_checkpointing:
            hf.gradient_checkpointing_disable()
        t0, c0 = time.perf_counter(), time.process_time()
        lr.train_step(batch)
        return time.perf_counter() - t0, time.process_time() - c0

    step(False), step(True)  # warm-up in each mode
    out: dict = {"threads": torch.get_num_threads()}
    rows = [(gc, step(gc)) for _ in range(rounds) for gc in (False, True)]
    for gc in (False, True):
        mine = [t for g, t in rows if g == gc]
        out["gc" if gc else "no_gc"] = {"wall_s": [w for w, _ in mine], "cpu_s": [c for _, c in mine],
                                        "step_s": statistics.median(w for w, _ in mine),
                                        "cpu_step_s": statistics.median(c for _, c in mine)}
    return out


def _sub(args: list[str], env: dict[str, str]) -> dict:
    return run_child(__file__, args, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {list(KINDS)}")
    ap.add_argument("--rounds", type=int, default=3, help="timed steps in each checkpointing mode (after a warm-up)")
    ap.add_argument("--completions", type=int, default=4, help="completions per step")
    ap.add_argument("--micro", type=int, default=4, help="micro-batch size (completions per forward/backward)")
    ap.add_argument("--length", type=int, default=512, help="completion length in tokens")
    ap.add_argument("--prompt-length", type=int, default=32)
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--memory", help=argparse.SUPPRESS)  # internal: KIND:0|1, print one memory measurement
    ap.add_argument("--time", help=argparse.SUPPRESS)  # internal: KIND, print one timing measurement
    a = ap.parse_args()
    shape = dict(completions=a.completions, length=a.length, prompt_length=a.prompt_length, micro=a.micro)
    model = str(build_model(SIZE))
    if a.memory:
        kind, gc = a.memory.split(":")
        report(measure_memory(model, kind, gc == "1", **shape))
        return
    if a.time:
        report(measure_time(model, a.time, a.rounds, **shape))
        return
    print(f"model: random Qwen2 hidden {HIDDEN}, {LAYERS} layers, intermediate {INTERMEDIATE}, {HEADS} heads / "
          f"{KV_HEADS} kv, vocab {VOCAB}, tied, float32; batch {a.completions} x ({a.prompt_length} prompt + "
          f"{a.length} completion) tokens, micro-batches of {a.micro}; AdamW; LoRA {LORA}", flush=True)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    results: dict = {}
    for kind in a.kinds.split(","):
        r = results[kind] = {}
        for gc in (False, True):
            mode = "gc" if gc else "no_gc"
            mem = _sub(["--memory", f"{kind}:{int(gc)}", *flags],
                       {**env, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})
            r[mode] = mem
            r["params_m"], r["trained_m"] = mem["params_m"], mem["trained_m"]
            print(f"{kind} checkpointing {'on ' if gc else 'off'}: peak {mem['peak_mib']:6.0f} MiB "
                  f"(before the step {mem['before_mib']:5.0f} MiB)", flush=True)
        t = _sub(["--time", kind, f"--rounds={a.rounds}", *flags], env)
        for mode in ("no_gc", "gc"):
            r[mode].update(t[mode])
            print(f"{kind} checkpointing {'on ' if mode == 'gc' else 'off'}: step {t[mode]['step_s']:5.1f} s wall "
                  f"(each {[round(x, 1) for x in t[mode]['wall_s']]}), {t[mode]['cpu_step_s']:5.1f} s CPU "
                  f"({t['threads']} threads)", flush=True)

    def compare(what: str, b: dict, o: dict) -> None:
        pct = lambda k: 100 * (o[k] / b[k] - 1)  # noqa: E731
        print(f"{what}: peak {pct('peak_mib'):+.0f}% ({b['peak_mib']:.0f} -> {o['peak_mib']:.0f} MiB), step "
              f"{pct('step_s'):+.0f}% wall ({b['step_s']:.1f} -> {o['step_s']:.1f} s), {pct('cpu_step_s'):+.0f}% CPU")

    print()
    for kind, r in results.items():
        print(f"{kind}: trains {r['trained_m']:.2f}M of {r['params_m']:.1f}M parameters")
        compare(f"  gradient checkpointing on vs off, {kind}", r["no_gc"], r["gc"])
    if len(results) == 2:
        for mode in ("no_gc", "gc"):
            compare(f"LoRA vs full fine-tuning, checkpointing {'on' if mode == 'gc' else 'off'}",
                    results["full"][mode], results["lora"][mode])
    if a.json:
        Path(a.json).write_text(json.dumps({"shape": shape, "lora": LORA, "results": results}, indent=1))


if __name__ == "__main__":
    main()
