"""Python entry points: `train(cfg)` does what `rayward run` does, and `evaluate(cfg, checkpoint)` what
`rayward eval` does, inside or outside an existing Ray session."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.build import prepare
from orchestrator.config import ConfigError, DataSource, EvalConfig, RunConfig
from orchestrator.data import DataError
from orchestrator.ops.cluster import init_ray, new_run_name

PERIODIC_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # not checkpoint-best, nor *.tmp / *.candidate


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest complete checkpoint-N in a run directory (incomplete ones are *.tmp and ignored; so is
    checkpoint-best: resuming continues from the latest step, not the best one)."""
    done = [
        p for p in run_dir.glob("checkpoint-*")
        if PERIODIC_CHECKPOINT.match(p.name) and (p / "rayward_state.json").exists()
    ]
    return max(done, key=lambda p: int(PERIODIC_CHECKPOINT.match(p.name).group(1)), default=None)


def train(
    cfg: RunConfig, name: str | None = None, *, verbose: bool = True, resume: bool = False
) -> list[dict[str, Any]]:
    """Check the config's rewards, model and data, start (or join) Ray, build the groups, run the loop.
    Returns the logged rows: one per step, and one per held-out eval (keys `eval/...`, step = the step whose
    weights it evaluated). A Ray session already initialised by the caller is used as it is.
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
            run.evaluate.restore()  # the best eval so far, from checkpoint-best (grpo.save_best)
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
    rewards = [h["reward"] for h in history if h.get("reward") is not None]
    first, last = rewards[:5], rewards[-5:]
    if first and last:
        evals = [h for h in history if h.get("eval/reward") is not None]
        held_out = f"; eval reward {evals[0]['eval/reward']:.3f} -> {evals[-1]['eval/reward']:.3f}" if evals else ""
        say(
            f"rayward: done in {time.time() - t0:.0f}s; mean reward first 5 steps {sum(first) / len(first):.3f} "
            f"-> last 5 steps {sum(last) / len(last):.3f}{held_out}",
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


def evaluate(
    cfg: RunConfig, checkpoint: str | Path | None = None, *, name: str | None = None, output: str | Path | None = None,
    verbose: bool = True,
) -> dict[str, Any]:
    """What `rayward eval` does: evaluate a checkpoint (an HF model directory), or the config's model, on the
    eval block's data with its rewards, as an eval during training would (the config's `data` and the eval
    defaults when it has no eval block). Prints the metrics and writes a JSON report (default
    `<logging.dir>/<name>/eval.json`); returns the report."""
    import ray

    from orchestrator.build import (
        eval_set,
        kill_pool,
        load_tokenizer,
        prepare_eval,
        resolve_model,
        reward_specs,
        start_generators,
        start_reward_pool,
    )
    from orchestrator.evaluator import finish_eval, submit_eval

    say = print if verbose else (lambda *a, **k: None)
    if cfg.eval is None:
        say("rayward eval: the config has no eval block: evaluating on its `data` with the eval defaults", flush=True)
        held_out = DataSource(**cfg.data.model_dump(exclude={"shuffle_dataset"}))
        cfg = cfg.model_copy(update={"eval": EvalConfig(data=held_out)})
    name = name or cfg.name or new_run_name("eval")
    model_path = resolve_model(cfg)  # the tokenizer, and the policy when no checkpoint is given
    policy, engine, step = model_path, {}, 0
    if checkpoint is not None:
        ckpt = Path(checkpoint)
        if not (ckpt / "config.json").is_file():
            raise ConfigError(f"--checkpoint {str(checkpoint)!r}: not an HF model directory (no config.json)")
        policy = str(ckpt)
        if not any((ckpt / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            engine["tokenizer"] = model_path  # checkpoints written before they carried their tokenizer
        if (ckpt / "rayward_state.json").exists():
            step = int(json.loads((ckpt / "rayward_state.json").read_text())["global_step"])
    try:
        rows, eval_specs = prepare_eval(cfg, load_tokenizer(cfg, model_path))
    except DataError as err:
        raise ConfigError(str(err)) from None
    specs = eval_specs if eval_specs is not None else reward_specs(cfg.rewards)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        init_ray(cfg.cluster, name)
    pool = generators = None
    try:
        pool = start_reward_pool(cfg, name, specs, role="eval-reward")
        generators = start_generators(cfg, name, policy, **engine)
        es = eval_set(cfg, rows, pool)
        result = finish_eval(es, submit_eval(es, generators, step))
    finally:
        if generators is not None:
            generators.kill()
        if pool is not None:
            kill_pool(pool)
        if owns_ray:
            ray.shutdown()
    out = Path(output) if output is not None else Path(cfg.logging.dir) / name / "eval.json"
    report = {
        "model": policy, "checkpoint": None if checkpoint is None else str(checkpoint), "step": step,
        "eval": cfg.eval.model_dump(mode="json"), "metrics": result.metrics, "samples": result.samples(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    e = cfg.eval
    say(f"rayward eval: {policy} (step {step}) on {e.data.path!r}: {len(rows)} prompts x {e.num_generations} "
        f"completions", flush=True)
    width = max(len(k) for k in result.metrics)
    say(f"{'metric':<{width}}  value")
    for k, v in result.metrics.items():
        say(f"{k:<{width}}  {v:.4g}")
    say(f"rayward eval: report {out}", flush=True)
    return report
