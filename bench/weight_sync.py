"""Weight sync learner -> vLLM engines through rayward's own path, against a plain gloo broadcast of the same bytes.

For random Qwen2-shaped models of about 25M, 100M and 400M parameters (float32), in one invocation:
  * floor: a plain torch.distributed gloo broadcast between two processes of the same bytes, distinct source
    tensors into freshly allocated receive buffers (how weights really move; a reused, cache-hot buffer reads
    ~2.5x faster);
  * rayward: a run built as `rayward run` builds it (learner actor, vLLM generator actor, weight_sync backend),
    then `run.weights.push()` repeated; seconds (median), the parts (gather/pack, wire, load), GB/s, the ratio
    to the floor, and the peak extra memory of the learner and the generator during a sync (VmHWM after a reset);
  * --step-share: the sync loop on the demo config with that model (generation_batch_size 16): median time/sync
    and its share of time/step.

    python bench/weight_sync.py                                   # 25m,100m,400m, collective backend
    python bench/weight_sync.py --sizes 100m --backends collective,object_store
    python bench/weight_sync.py --sizes 100m --step-share --steps 6
    python bench/weight_sync.py --sizes 100m --step-share --set grpo.gradient_checkpointing=false
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.models import DEFAULT_CACHE, build_model  # noqa: E402
from orchestrator.config import DEFAULT_BUCKET_MB  # noqa: E402

FLOOR_BUCKET_MB = 256  # the floor sends the model's bytes as tensors of this size (distinct, fresh receivers)


def model_bytes(path: Path) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        for k in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
            t = f.get_slice(k)
            n = 1
            for d in t.get_shape():
                n *= d
            total += n * 4
    return total


def _floor_rank(rank: int, port: int, nbytes: int, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    chunk = FLOOR_BUCKET_MB << 20
    sizes = [min(chunk, nbytes - lo) for lo in range(0, nbytes, chunk)]
    src = [torch.randint(0, 255, (n,), dtype=torch.uint8) for n in sizes] if rank == 0 else None
    times = []
    for _ in range(repeats + 1):  # the first is warm-up
        dist.barrier()
        t0 = time.perf_counter()
        for i, n in enumerate(sizes):
            buf = src[i] if rank == 0 else torch.empty(n, dtype=torch.uint8)  # fresh receive buffers
            dist.broadcast(buf, src=0)
        times.append(time.perf_counter() - t0)
    if rank == 1:
        Path(out).write_text(json.dumps(times[1:]))
    dist.destroy_process_group()


def floor_seconds(nbytes: int, repeats: int) -> float:
    import torch.multiprocessing as mp

    from actors.runtime.net import free_port

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        mp.spawn(_floor_rank, args=(free_port(), nbytes, repeats, f.name), nprocs=2, join=True)
        return statistics.median(json.loads(Path(f.name).read_text()))


def _hwm_reset(pid: int) -> int:
    """Reset the process's peak RSS to its current RSS; returns the current RSS in bytes."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status(pid, "VmRSS")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process has used."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rayward_sync(model: Path, backend: str, repeats: int, bucket_mb: float) -> dict:
    import ray

    from orchestrator.config import load_config
    from orchestrator.run.build import build_run, prepare, shutdown_run
    from orchestrator.run.cluster import init_ray

    cfg = load_config(ROOT / "configs" / "demo.yaml", [
        f"model.name_or_path={model}", f"weight_sync.backend={backend}", f"weight_sync.bucket_mb={bucket_mb}",
        "generation.kv_cache_gib=1", "cluster.num_reward_workers=1", "logging.progress=false",
        f"logging.dir={tempfile.mkdtemp()}",
    ])
    init_ray(cfg.cluster, "bench-sync")
    run = build_run(prepare(cfg, "bench-sync"))
    try:
        pid = lambda self: os.getpid()  # noqa: E731
        lpid, gpid = run.learner.on_each(pid)[0], run.generators.on_each(pid)[0]
        run.weights.push()  # the first sync after start-up is slower (allocations, first loads)
        stats, extra_l, extra_g, cpu_l, cpu_g = [], [], [], [], []
        for _ in range(repeats):
            base_l, base_g = _hwm_reset(lpid), _hwm_reset(gpid)
            c0 = _cpu_s(lpid), _cpu_s(gpid)
            stats.append(run.weights.push())
            cpu_l.append(_cpu_s(lpid) - c0[0])
            cpu_g.append(_cpu_s(gpid) - c0[1])
            extra_l.append(_status(lpid, "VmHWM") - base_l)
            extra_g.append(_status(gpid, "VmHWM") - base_g)
        med = lambda xs: statistics.median(xs)  # noqa: E731
        return {
            "seconds": med([s.seconds for s in stats]), "gather_s": med([s.gather_s for s in stats]),
            "transfer_s": med([s.transfer_s for s in stats]), "load_s": med([s.load_s for s in stats]),
            "learner_extra_mb": max(extra_l) / 2**20, "generator_extra_mb": max(extra_g) / 2**20,
            "learner_cpu_s": med(cpu_l), "generator_cpu_s": med(cpu_g),
        }
    finally:
        shutdown_run(run)
        ray.shutdown()


def step_share(model: Path, steps: int, bucket_mb: float, extra: list[str]) -> dict:
    from orchestrator.config import load_config
    from orchestrator.run.train import train

    cfg = load_config(ROOT / "configs" / "demo.yaml", [
        f"model.name_or_path={model}", f"grpo.max_steps={steps}", "generation.generation_batch_size=16",
        "grpo.per_device_train_batch_size=16", "logging.progress=false", f"logging.dir={tempfile.mkdtemp()}",
        "logging.log_completions=false", f"weight_sync.bucket_mb={bucket_mb}", *extra,
    ])
    hist = train(cfg, "bench-step", show_progress=False)[1:]  # the first step carries start-up effects
    med = lambda k: statistics.median(h[k] for h in hist)  # noqa: E731
    return {"sync_s": med("time/sync"), "step_s": med("time/step"), "share": med("time/sync") / med("time/step"),
            "parts": {k: med(f"sync/{k}_s") for k in ("gather", "transfer", "load")},
            "phases": {k: med(f"time/{k}") for k in ("generate", "train")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="25m,100m,400m")
    ap.add_argument("--backends", default="collective", help="comma-separated: collective, object_store")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB)
    ap.add_argument("--step-share", action="store_true", help="also run the sync loop and report sync/step")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the --step-share run (repeatable), "
                         "e.g. grpo.gradient_checkpointing=false")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes.split(","):
        model = build_model(size, cache)
        nbytes = model_bytes(model)
        floor = floor_seconds(nbytes, args.repeats)
        print(f"{size}: {nbytes / 1e6:.0f} MB, gloo broadcast floor {floor:.3f}s ({nbytes / floor / 1e9:.2f} GB/s)",
              flush=True)
        for backend in args.backends.split(","):
            r = rayward_sync(model, backend, args.repeats, args.bucket_mb)
            rows.append((size, nbytes, floor, backend, r))
            print(f"  {backend}: {r['seconds']:.3f}s = {r['seconds'] / floor:.2f}x floor, "
                  f"{nbytes / r['seconds'] / 1e9:.2f} GB/s (gather+pack {r['gather_s']:.3f}, wire "
                  f"{r['transfer_s']:.3f}, load {r['load_s']:.3f}); peak extra memory learner "
                  f"{r['learner_extra_mb']:.0f} MB, generator {r['generator_extra_mb']:.0f} MB; CPU seconds learner "
                  f"{r['learner_cpu_s']:.2f}, generator {r['generator_cpu_s']:.2f}", flush=True)
        if args.step_share:
            s = step_share(model, args.steps, args.bucket_mb, args.set)
            parts = ", ".join(f"{k} {v:.3f}" for k, v in s["parts"].items())
            print(f"  sync loop ({args.steps} steps, demo config, 16 completions/step): time/sync {s['sync_s']:.3f}s "
                  f"({parts}) of time/step {s['step_s']:.3f}s = {100 * s['share']:.1f} % (generate "
                  f"{s['phases']['generate']:.3f}s, train {s['phases']['train']:.3f}s)", flush=True)
    print("\n| model | MB | floor s | backend | sync s | x floor | GB/s | learner +MB | generator +MB | CPU-s "
          "learner / generator |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size, nbytes, floor, backend, r in rows:
        print(f"| {size} | {nbytes / 1e6:.0f} | {floor:.3f} | {backend} | {r['seconds']:.3f} | "
              f"{r['seconds'] / floor:.2f} | {nbytes / r['seconds'] / 1e9:.2f} | {r['learner_extra_mb']:.0f} | "
              f"{r['generator_extra_mb']:.0f} | {r['learner_cpu_s']:.2f} / {r['generator_cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
