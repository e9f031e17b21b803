"""Python entry points: `train(cfg)` does what `rayward run` does, inside or outside an existing Ray session."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.build import prepare
from orchestrator.config import ConfigError, RunConfig
from orchestrator.data import DataError
from orchestrator.ops.actor_logs import ActorOutput
from orchestrator.ops.cluster import init_ray, new_run_name
from orchestrator.ops.errors import RunFailed, RunStopped
from orchestrator.ops.progress import open_display, summary_footer, summary_table

# Every line the run's actors wrote, in the run directory (the terminal shows only rayward's own).
ACTOR_LOG = "actors.log"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest complete checkpoint-N in a run directory (incomplete ones are *.tmp and ignored)."""
    done = [p for p in run_dir.glob("checkpoint-*") if p.suffix != ".tmp" and (p / "rayward_state.json").exists()]
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)


class _Signals:
    """SIGTERM (`rayward stop`, `ray job stop`) while the run starts ends it at once (RunStopped); once the loop
    runs, it asks the loop to stop at the next step boundary: the step in progress is trained and logged, then a
    checkpoint is written. (Ray SIGKILLs after RAY_JOB_STOP_WAIT_TIME_S, 3 s by default: raise it on the head
    above one step plus a checkpoint.) Only the main thread can install handlers; elsewhere nothing changes.
    ray.init installs its own handler (sys.exit(15)): `install` again after it."""

    def __init__(self, name: str):
        self.name, self.run, self.looping, self.requested = name, None, False, False
        main = threading.current_thread() is threading.main_thread()
        self.previous = signal.getsignal(signal.SIGTERM) if main else None
        self.install()

    def install(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.run is not None and self.looping:
            self.run.stop_requested = True
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


def train(
    cfg: RunConfig, name: str | None = None, *, verbose: bool = True, resume: bool = False,
    show_actor_output: bool = False,
) -> list[dict[str, Any]]:
    """Check the config's rewards, model and data, start (or join) Ray, build the groups, run the loop.
    Returns the per-step metrics. A Ray session already initialised by the caller is used as it is (and its
    log settings are left alone); otherwise the actors' output goes to <run dir>/actors.log, and on the terminal
    only rayward's own lines (show_actor_output=True: everything, as Ray prints it).
    resume=True continues from the run directory's latest checkpoint (same name), if there is one.
    Raises RunFailed (the error that ended it as __cause__) or RunStopped (SIGTERM)."""
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
    run_dir = prepared.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    display = open_display(cfg.logging.progress and verbose, cfg.grpo.max_steps)
    say = display.message if verbose else (lambda *a, **k: None)
    say(f"rayward run {name!r}: logs and checkpoints in {run_dir}")
    owns_ray = not ray.is_initialized()
    signals = _Signals(name)
    run, output, history, t0 = None, None, [], time.time()
    try:
        if owns_ray:
            output = ActorOutput(run_dir / ACTOR_LOG, echo=None if show_actor_output else _echo)
            output.capture_ray_logger()
            info = init_ray(cfg.cluster, name)
            signals.install()
            if info.get("dashboard_url"):
                say(f"rayward run {name!r}: Ray dashboard http://{info['dashboard_url']}")
            if output.attach(keep_ray_printing=show_actor_output) and not show_actor_output:
                say(f"rayward run {name!r}: the actors' output is in {run_dir / ACTOR_LOG} (--verbose shows it here)")
            elif not show_actor_output:
                say("rayward: this Ray version cannot separate the actors' output; it is shown here")
        signals.check()
        run = signals.run = build_run(prepared, display=display)
        signals.check()
        ckpt = latest_checkpoint(run_dir) if resume else None
        if ckpt is not None:
            restore(run, ckpt)
            say(f"rayward: resumed from {ckpt} at step {run.global_step}")
        if cfg.logging.check_logprob_parity:
            stats = run.weights.push()
            gap = logprob_parity(run.learner.handles[0], run.generators.handles, cfg.generation.temperature)
            say(
                f"rayward: weight sync {stats.bytes / 1e6:.0f} MB in {stats.seconds:.2f}s; generator-learner "
                f"logprob parity after sync: max abs diff {gap:.2e}"
            )
        loop = run_pipelined if cfg.loop.mode == "pipelined" else run_sync  # chosen once, at build time
        signals.check()
        signals.looping = True
        display.start(run.global_step)
        history = loop(run)
        display.close()
        if run.stop_requested:
            save_checkpoint(run)
    except (RunStopped, KeyboardInterrupt):
        raise
    except SystemExit as err:  # SIGTERM inside ray.init, through Ray's handler
        if err.code == signal.SIGTERM:
            raise RunStopped(name, None, None) from None
        raise
    except Exception as err:
        if signals.requested and not signals.looping:  # what the interrupted start-up made of the SIGTERM
            raise RunStopped(name, None, None) from None
        step = run.global_step + 1 if run is not None and signals.looping else None
        raise RunFailed(name, run_dir, step, latest_checkpoint(run_dir)) from err
    finally:
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
    if verbose and history:
        display.summary(summary_table(history, name=name, elapsed_s=time.time() - t0),
                        summary_footer(run_dir, latest_checkpoint(run_dir)))
    if run.stop_requested:
        raise RunStopped(name, run.global_step, latest_checkpoint(run_dir))
    return history


def _echo(message: str) -> None:
    """An actor's rayward message on the driver's terminal (sys.stderr looked up now: a live bar redirects it)."""
    print(message, file=sys.stderr, flush=True)


def restore(run: Any, ckpt: Path) -> None:
    """Learner weights, optimizer and step, and the data order, from a checkpoint; generators get the weights."""
    from orchestrator.phases import sync

    (state,) = run.learner.call("load_checkpoint", str(ckpt))
    run.global_step = int(state["global_step"])
    if "data" in state:
        run.prompts.restore(state["data"])
    sync(run)
