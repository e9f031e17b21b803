"""Python entry points: `train(cfg)` does what `rayward run` does, and `evaluate(cfg, checkpoint)` what
`rayward eval` does, inside or outside an existing Ray session."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator import checkpoints
from orchestrator.build import prepare
from orchestrator.cluster import check_learner_placement, init_ray, new_run_name
from orchestrator.config import ConfigError, DataSource, EvalConfig, RunConfig
from orchestrator.data import DataError
from orchestrator.errors import RunFailed, RunStopped
from orchestrator.run import Run
from orchestrator.telemetry.actor_logs import ActorOutput
from orchestrator.telemetry.progress import Display, open_display, summary_footer, summary_table

# Every line the run's actors wrote, in the run directory (the terminal shows only rayward's own).
ACTOR_LOG = "actors.log"


class _Signals:
    """SIGTERM (`rayward stop`, `ray job stop`) while the run starts ends it at once (RunStopped); once the loop
    runs, it asks the loop to stop at the next step boundary: the step in progress is trained and logged, then a
    checkpoint is written. (Ray SIGKILLs after RAY_JOB_STOP_WAIT_TIME_S, 3 s by default: raise it on the head
    above one step plus a checkpoint.) Only the main thread can install handlers; elsewhere nothing changes.
    ray.init would install its own (sys.exit(15)): `kept_through_ray_init` keeps this one."""

    def __init__(self, name: str):
        self.name, self.looping, self.requested = name, False, False
        self.run: Run | None = None
        main = threading.current_thread() is threading.main_thread()
        self.previous = signal.getsignal(signal.SIGTERM) if main else None
        self.previous_unraisable = sys.unraisablehook if main else None
        if main:
            sys.unraisablehook = self._unraisable
        self.install()

    def _unraisable(self, unraisable: Any) -> None:
        """Where Python drops an exception (a finalizer, a fork hook) it prints a traceback; the dropped RunStopped
        is already recorded (`requested`, then `check`), so it prints nothing. Anything else as before."""
        if not isinstance(unraisable.exc_value, RunStopped) and self.previous_unraisable is not None:
            self.previous_unraisable(unraisable)

    def install(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self._on_term)

    @contextlib.contextmanager
    def kept_through_ray_init(self) -> Iterator[None]:
        """ray.init's first act is to install its own SIGTERM handler (sys.exit(15)). A SystemExit raised where
        Python ignores exceptions (a finalizer, logging's at-fork hook while Ray spawns its processes) is printed
        and dropped, and the run then trained on to exit 0. So ours stays installed through ray.init: it records
        the request before it raises, and `check` after the start-up stage stops a run whose exception was lost."""
        from actors.ray_compat import ray_init_keeps_sigterm

        if self.previous is None:
            yield
            return
        with ray_init_keeps_sigterm():
            yield

    def _on_term(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.run is not None and self.looping:
            self.run.progress.stop_requested = True
        else:  # raised wherever the start is (C code may turn it into a SystemError: train() checks `requested`)
            raise RunStopped(self.name, None, None)

    def check(self) -> None:
        """Between start-up stages: a SIGTERM whose exception something swallowed still stops the run."""
        if self.requested:
            raise RunStopped(self.name, None, None)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None
        if self.previous_unraisable is not None:
            sys.unraisablehook = self.previous_unraisable
            self.previous_unraisable = None


class _Silent(Display):
    """show_progress=False: rayward's own output goes nowhere (the metrics still go to their sinks)."""

    def message(self, text: str) -> None:
        pass


# train(resume=...) -> checkpoints.find's mode
RESUME_MODES = {False: None, True: checkpoints.RESUME_REQUIRED, checkpoints.RESUME_AUTO: checkpoints.RESUME_AUTO}


def train(
    cfg: RunConfig, name: str | None = None, *, show_progress: bool = True, resume: bool | str = False,
    show_actor_output: bool = False,
) -> list[dict[str, Any]]:
    """Check the config's rewards, model and data, start (or join) Ray, build the groups, run the loop.
    Returns the logged rows: one per step, and one per held-out eval (keys `eval/...`, step = the step whose
    weights it evaluated). show_progress=False: nothing of rayward's own on the terminal (no progress, messages
    or summary). A Ray session already initialised by the caller is used as it is (and its log settings are left
    alone); otherwise the actors' output goes to <run dir>/actors.log, and on the terminal only rayward's own
    lines (show_actor_output=True: everything, as Ray prints it).
    resume=True (`--resume`) continues from the run directory's latest usable checkpoint (same name) and fails if
    there is none; resume="auto" (`--resume auto`, what a retried driver runs) continues from it if there is one,
    else starts afresh. A resume with nothing left to train fails before anything starts (ConfigError).
    A lost learner is brought back up to cluster.max_failures times (orchestrator/supervisor.py).
    Raises RunFailed (the error that ended it as __cause__) or RunStopped (SIGTERM)."""
    import ray

    from actors.weights.parity import logprob_parity
    from orchestrator.build import build_run, rebuild_learner, shutdown_run
    from orchestrator.loop import run_pipelined, run_sync
    from orchestrator.supervisor import Supervisor
    from orchestrator.watchdog import Watchdog

    name = name or cfg.name or new_run_name()
    try:
        prepared = prepare(cfg, name)  # reward imports, model/tokenizer, dataset: before Ray starts
    except DataError as err:
        raise ConfigError(str(err)) from None
    run_dir = prepared.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    display = open_display(cfg.logging.progress, cfg.grpo.max_steps) if show_progress else _Silent(cfg.grpo.max_steps)
    say = display.message  # the one channel: the evaluator and the phases reach it as run.display
    # Before the first line: a SIGTERM sent once a user (or a test) sees the run start is RunStopped, never the
    # default kill.
    signals = _Signals(name)
    try:
        say(f"rayward run {name!r}: logs and checkpoints in {run_dir}")
        if prepared.agent is not None and prepared.agent.template_note is not None:
            say(f"rayward: note: {prepared.agent.template_note}")
        mode = RESUME_MODES[resume]
        found = checkpoints.find(run_dir, mode, cfg.grpo.max_steps, say)  # nothing to resume: fails here, cheaply
        if cfg.cluster.max_failures and cfg.grpo.save_steps is None:
            say(f"rayward: cluster.max_failures is {cfg.cluster.max_failures} but grpo.save_steps is unset: a lost "
                "learner starts the run over from the initial model (set grpo.save_steps to lose at most that many "
                "steps)")
    except BaseException:
        signals.restore()
        display.close()
        raise
    owns_ray = not ray.is_initialized()
    run, output, history, t0, watchdog = None, None, [], time.time(), None
    try:
        if owns_ray:
            output = ActorOutput(run_dir / ACTOR_LOG, echo=None if show_actor_output else _echo)
            output.capture_ray_logger()
            with signals.kept_through_ray_init():
                info = init_ray(cfg.cluster, name)
            signals.install()  # ours again, should a Ray version have installed its own elsewhere
            signals.check()
            if info.get("dashboard_url"):
                say(f"rayward run {name!r}: Ray dashboard http://{info['dashboard_url']}")
            if output.attach(keep_ray_printing=show_actor_output) and not show_actor_output:
                say(f"rayward run {name!r}: the actors' output is in {run_dir / ACTOR_LOG} (--verbose shows it here)")
            elif not show_actor_output:
                say("rayward: this Ray version cannot separate the actors' output; it is shown here")
        check_learner_placement(cfg.cluster, ray.nodes())  # needs the cluster: the first thing once Ray is up
        signals.check()
        run = signals.run = build_run(prepared, display=display)
        signals.check()
        threads = [f"learner {run.learner.cpu_threads()}"]
        threads += [f"generator-{i} {t}" for i, t in enumerate(run.generators.cpu_threads())]
        say(f"rayward: compute: {'; '.join(threads)}")
        start = run.prompts.state()  # where a lost learner starts over when there is no checkpoint
        ckpt = checkpoints.resume(run, found)
        if ckpt is not None:
            say(f"rayward: resumed from {ckpt} at step {run.progress.global_step}")
        elif found and mode == checkpoints.RESUME_REQUIRED:
            raise ConfigError(f"--resume: none of the checkpoints in {run_dir} could be loaded")
        if cfg.logging.check_logprob_parity:
            stats = run.weights.push(run.progress.global_step)
            gap = logprob_parity(run.learner, run.generators, cfg.generation.temperature)
            say(
                f"rayward: weight sync {stats.bytes / 1e6:.0f} MB in {stats.seconds:.2f}s; generator-learner "
                f"logprob parity after sync: max abs diff {gap:.2e}"
            )
        loop = run_pipelined if cfg.loop.mode == "pipelined" else run_sync  # chosen once, at build time
        watchdog = Watchdog(run)
        supervisor = Supervisor(run, loop, rebuild=lambda: rebuild_learner(run, prepared), start=start,
                                hung=watchdog.hung_learner)
        signals.check()
        signals.looping = True
        display.start(run.progress.global_step)
        watchdog.start()
        history = supervisor()  # on SIGTERM the loop stops at a step boundary and checkpoints (phases.finish)
        display.close()
    except (RunStopped, KeyboardInterrupt, ConfigError):
        raise
    except SystemExit as err:  # SIGTERM through Ray's handler (a Ray version whose init installs it elsewhere)
        if err.code == signal.SIGTERM:
            raise RunStopped(name, None, None) from None
        raise
    except Exception as err:
        if signals.requested and not signals.looping:  # what the interrupted start-up made of the SIGTERM
            raise RunStopped(name, None, None) from None
        step = run.progress.global_step + 1 if run is not None and signals.looping else None
        raise RunFailed(name, run_dir, step, checkpoints.latest(run_dir)) from err
    finally:
        if watchdog is not None:
            watchdog.stop()
        display.close()
        signals.restore()
        if run is not None:
            shutdown_run(run)
        if output is not None:
            output.drain()
        if owns_ray:
            ray.shutdown()
        if output is not None:
            output.close()
    if show_progress and history:
        display.summary(summary_table(history, name=name, elapsed_s=time.time() - t0),
                        summary_footer(run_dir, checkpoints.latest(run_dir)))
    if run.progress.stop_requested:
        raise RunStopped(name, run.progress.global_step, checkpoints.latest(run_dir))
    return history


def _echo(message: str) -> None:
    """An actor's rayward message on the driver's terminal (sys.stderr looked up now: a live bar redirects it)."""
    print(message, file=sys.stderr, flush=True)


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
        agent_kwargs,
        eval_set,
        load_tokenizer,
        prepare_eval,
        resolve_model,
        reward_specs,
        rollout_kind,
        start_env_pool,
        start_generators,
        start_reward_pool,
    )
    from orchestrator.environments import prepare_agent
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
        step = checkpoints.saved_step(ckpt) or 0
    tokenizer = load_tokenizer(cfg, model_path)
    try:
        rows, eval_specs = prepare_eval(cfg, tokenizer)
    except DataError as err:
        raise ConfigError(str(err)) from None
    train_specs = reward_specs(cfg.rewards)
    dataset = [p.row for p in rows]
    agent = prepare_agent(cfg, tokenizer, dataset, train_specs, dataset)  # tools: checked as a run checks them
    env_specs, env_rewards = (agent.env_reward_specs, agent.env_rewards) if agent is not None else ([], [])
    specs = eval_specs if eval_specs is not None else train_specs + env_specs
    owns_ray = not ray.is_initialized()
    if owns_ray:
        init_ray(cfg.cluster, name)
    groups: list[Any] = []  # started so far, killed at the end
    try:
        pool = start_reward_pool(cfg, name, specs, role="eval-reward")
        groups.append(pool)
        agent_args = None
        if agent is not None:  # the environments the eval's trajectories run their tools in
            env_pool = start_env_pool(cfg, name, agent.spec)
            groups.append(env_pool)
            agent_args = agent_kwargs(cfg, agent, env_pool, cfg.eval.data.prompt_column)
        generators = start_generators(cfg, name, policy, agent=agent_args, **engine)
        groups.append(generators)
        es = eval_set(cfg, rows, pool, [*cfg.rewards, *env_rewards], rollout_kind(agent))
        result = finish_eval(es, submit_eval(es, generators, step))
    finally:
        for group in reversed(groups):
            group.kill()
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
