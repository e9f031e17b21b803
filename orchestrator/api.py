"""Python entry points: `train(cfg)` does what `rayward run` does, inside or outside an existing Ray session."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.cluster import init_ray, new_run_name
from orchestrator.config import ConfigError, RunConfig
from orchestrator.data import DataError
from orchestrator.run import prepare


def train(cfg: RunConfig, name: str | None = None, *, verbose: bool = True) -> list[dict[str, Any]]:
    """Check the config's rewards, model and data, start (or join) Ray, build the groups, run the loop.
    Returns the per-step metrics. A Ray session already initialised by the caller is used as it is."""
    import ray

    from orchestrator.loop import run_sync
    from orchestrator.parity import logprob_parity
    from orchestrator.pipeline import run_pipelined
    from orchestrator.run import build_run, shutdown_run

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
    t0 = time.time()
    run = build_run(prepared)
    try:
        if cfg.logging.check_logprob_parity:
            gap = logprob_parity(run)
            say(f"rayward: generator-learner logprob parity after sync: max abs diff {gap:.2e}", flush=True)
        loop = run_pipelined if cfg.loop.mode == "pipelined" else run_sync  # chosen once, at build time
        history = loop(run)
    finally:
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
