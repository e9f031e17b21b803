"""Python entry points: `train(cfg)` does what `rayward run` does, inside or outside an existing Ray session."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.build import prepare
from orchestrator.config import ConfigError, RunConfig
from orchestrator.data import DataError
from orchestrator.ops.cluster import check_learner_placement, init_ray, new_run_name


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest complete checkpoint-N in a run directory (incomplete ones are *.tmp and ignored)."""
    done = [p for p in run_dir.glob("checkpoint-*") if p.suffix != ".tmp" and (p / "rayward_state.json").exists()]
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)


def train(
    cfg: RunConfig, name: str | None = None, *, verbose: bool = True, resume: bool = False
) -> list[dict[str, Any]]:
    """Check the config's rewards, model and data, start (or join) Ray, build the groups, run the loop.
    Returns the per-step metrics. A Ray session already initialised by the caller is used as it is.
    resume=True continues from the run directory's latest checkpoint (same name), if there is one."""
    import ray

    from actors.weights.parity import logprob_parity
    from orchestrator.build import build_run, shutdown_run
    from orchestrator.loop import run_pipelined, run_sync
    from orchestrator.phases import save_checkpoint

    name = name or cfg.name or new_run_name()
    try:
        prepared = prepare(cfg, name)  # reward imports, model/tokenizer, dataset: before Ray starts
    except DataError as err:
        raise ConfigError(str(err)) from None
    say = print if verbose else (lambda *a, **k: None)
    say(f"rayward run {name!r}: logs and checkpoints in {prepared.run_dir}", flush=True)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        info = init_ray(cfg.cluster, name)
        if info.get("dashboard_url"):
            say(f"rayward run {name!r}: Ray dashboard http://{info['dashboard_url']}", flush=True)
    try:
        check_learner_placement(cfg.cluster, ray.nodes())  # needs the cluster: the first thing once Ray is up
    except ConfigError:
        if owns_ray:
            ray.shutdown()
        raise
    t0 = time.time()
    run = build_run(prepared)
    threads = [f"learner {ray.get(run.learner.handles[0].cpu_threads.remote())}"]
    threads += [f"generator-{i} {t}" for i, t in enumerate(run.generators.call("cpu_threads"))]
    say(f"rayward: compute: {'; '.join(threads)}", flush=True)
    # SIGTERM (`rayward stop`, `ray job stop`) asks the loop to stop at the next step boundary: the step in
    # progress is trained and logged, then a checkpoint is written. (Ray SIGKILLs after RAY_JOB_STOP_WAIT_TIME_S,
    # 3 s by default: raise it on the head above one step plus a checkpoint.)
    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if previous is not None:
        signal.signal(signal.SIGTERM, lambda signum, frame: setattr(run, "stop_requested", True))
    try:
        ckpt = latest_checkpoint(prepared.run_dir) if resume else None
        if ckpt is not None:
            restore(run, ckpt)
            say(f"rayward: resumed from {ckpt} at step {run.global_step}", flush=True)
        if cfg.logging.check_logprob_parity:
            stats = run.weights.push()
            gap = logprob_parity(run.learner.handles[0], run.generators.handles, cfg.generation.temperature)
            say(
                f"rayward: weight sync {stats.bytes / 1e6:.0f} MB in {stats.seconds:.2f}s; generator-learner "
                f"logprob parity after sync: max abs diff {gap:.2e}",
                flush=True,
            )
        loop = run_pipelined if cfg.loop.mode == "pipelined" else run_sync  # chosen once, at build time
        history = loop(run)
        if run.stop_requested:
            path = save_checkpoint(run)
            say(f"rayward: stopped at step {run.global_step}; checkpoint {path}", flush=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        shutdown_run(run)
        if owns_ray:
            ray.shutdown()
    first = [h["reward"] for h in history[:5] if h.get("reward") is not None]
    last = [h["reward"] for h in history[-5:] if h.get("reward") is not None]
    if first and last:
        say(
            f"rayward: done in {time.time() - t0:.0f}s; mean reward first 5 steps {sum(first) / len(first):.3f} "
            f"-> last 5 steps {sum(last) / len(last):.3f}",
            flush=True,
        )
    return history


def restore(run: Any, ckpt: Path) -> None:
    """Learner weights, optimizer and step, and the data order, from a checkpoint; generators get the weights."""
    from orchestrator.phases import sync

    (state,) = run.learner.call("load_checkpoint", str(ckpt))
    run.global_step = int(state["global_step"])
    if "data" in state:
        run.prompts.restore(state["data"])
    sync(run)
