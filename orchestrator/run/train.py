"""The Python entry point of a run: `train(cfg)` does what `rayward run` does, inside or outside an existing Ray
session (`evaluate(cfg, checkpoint)`, what `rayward eval` does, is orchestrator/run/evaluate.py).

    train(cfg)   check (before Ray)  ->  start Ray  ->  build the groups, resume, parity  ->  the supervised loop
                 ->  tear down  ->  summary

Each stage is one function below; how a signal stops a run at any of them is orchestrator/run/signals.py.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.runtime import ray_compat
from orchestrator.config import ConfigError, RunConfig
from orchestrator.data.sources import DataError
from orchestrator.run import checkpoints
from orchestrator.run.build import Prepared, prepare
from orchestrator.run.cluster import check_learner_placement, init_ray, new_run_name, ray_address
from orchestrator.run.errors import RunFailed, RunStopped
from orchestrator.run.signals import Signals
from orchestrator.run.state import Run
from orchestrator.telemetry.actor_logs import ActorOutput
from orchestrator.telemetry.progress import Display, open_display, summary_footer, summary_table

# Every line the run's actors wrote, in the run directory (the terminal shows only rayward's own).
ACTOR_LOG = "actors.log"


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
    A lost learner is brought back up to cluster.max_failures times (orchestrator/run/supervisor.py).
    Raises RunFailed (the error that ended it as __cause__) or RunStopped (SIGTERM, Ctrl-C: after a checkpoint
    once the loop runs)."""
    name = name or cfg.name or new_run_name()
    try:
        prepared = prepare(cfg, name)  # reward imports, model/tokenizer, dataset: before Ray starts
    except DataError as err:
        raise ConfigError(str(err)) from None
    prepared.run_dir.mkdir(parents=True, exist_ok=True)
    display = open_display(cfg.logging.progress, cfg.grpo.max_steps) if show_progress else _Silent(cfg.grpo.max_steps)
    # Before the first line: a signal sent once a user (or a test) sees the run start stops it, never kills it.
    signals = Signals(name, display.message)
    t0 = time.time()
    try:
        mode = RESUME_MODES[resume]
        found = _announce(prepared, mode, display.message)
        session = _Session(prepared, signals, display, show_actor_output)
        history = session.run_supervised(found, mode)
    finally:
        display.close()
        signals.restore()
    run = session.run
    if show_progress and history:
        display.summary(summary_table(history, name=name, elapsed_s=time.time() - t0),
                        summary_footer(prepared.run_dir, checkpoints.latest(prepared.run_dir)))
    if run.progress.stop_requested:
        raise signals.stopped(run.progress.global_step, checkpoints.latest(prepared.run_dir))
    return history


def _announce(p: Prepared, mode: str | None, say: Any) -> list[Path]:
    """The run's first lines (where its files go, which Ray it joins, notes on its setup) and the checkpoints
    `--resume` may load (nothing to resume: fails here, cheaply)."""
    cfg = p.cfg
    address, source = ray_address(cfg.cluster)
    joins = f"; joining the Ray cluster at {address} ({source})" if source == "RAY_ADDRESS" else ""
    say(f"rayward run {p.name!r}: logs and checkpoints in {p.run_dir}{joins}")
    say(f"rayward: watch its samples and curves: rayward view {p.run_dir}")
    if p.agent is not None and p.agent.template_note is not None:
        say(f"rayward: note: {p.agent.template_note}")
    if p.agent is not None and p.agent.images_note is not None:
        say(f"rayward: note: {p.agent.images_note}")
    found = checkpoints.find(p.run_dir, mode, cfg.grpo.max_steps, say)
    # Only a budget the user asked for: by default a run without checkpoints recovers from the initial model,
    # as documented (docs/faults.md), and says nothing about it.
    if "max_failures" in cfg.cluster.model_fields_set and cfg.cluster.max_failures and cfg.grpo.save_steps is None:
        say(f"rayward: cluster.max_failures is {cfg.cluster.max_failures} but grpo.save_steps is unset: a lost "
            "learner starts the run over from the initial model (set grpo.save_steps to lose at most that many "
            "steps)")
    return found


@dataclass
class _Session:
    """One run's time on Ray: start (or join) it, build the run, resume, supervise the loop, tear down."""

    p: Prepared
    signals: Signals
    display: Display
    show_actor_output: bool
    run: Run | None = None
    owns_ray: bool = False
    embedded: bool = False  # the run started its own Ray cluster
    output: ActorOutput | None = None
    watchdog: Any = None

    def run_supervised(self, found: list[Path], mode: str | None) -> list[dict[str, Any]]:
        """Everything on Ray, errors turned into RunFailed/RunStopped, torn down whatever happens."""
        import ray

        signals, name = self.signals, self.p.name
        self.owns_ray = not ray.is_initialized()
        try:
            if self.owns_ray:
                self._start_ray()
            check_learner_placement(self.p.cfg.cluster, ray.nodes())  # the first thing once Ray is up
            signals.check()
            return self._build_and_supervise(found, mode)
        except (RunStopped, KeyboardInterrupt, ConfigError):
            raise
        except SystemExit as err:  # SIGTERM through Ray's handler (a Ray version whose init installs it elsewhere)
            if err.code == signal.SIGTERM:
                raise RunStopped(name, None, None) from None
            raise
        except Exception as err:
            looping = signals.on_stop is not None
            if signals.received is not None and not looping:  # what the interrupted start-up made of the signal
                raise signals.interrupted() from None
            run = self.run
            step = run.progress.global_step + 1 if run is not None and looping else None
            raise RunFailed(name, self.p.run_dir, step, checkpoints.latest(self.p.run_dir)) from err
        finally:
            self._teardown()

    def _start_ray(self) -> None:
        """An embedded cluster (or a join): the actors' output to actors.log, the dashboard's line."""
        cfg, name, say = self.p.cfg, self.p.name, self.display.message
        self.output = ActorOutput(self.p.run_dir / ACTOR_LOG, echo=None if self.show_actor_output else _echo)
        self.output.capture_ray_logger()
        self.embedded = ray_address(cfg.cluster)[0] is None
        with self.signals.starting_ray():
            info = init_ray(cfg.cluster, name)
        self.signals.install()  # ours again, should a Ray version have installed its own elsewhere
        self.signals.check()
        if info.get("dashboard_url"):
            say(f"rayward run {name!r}: Ray dashboard http://{info['dashboard_url']}{_sign_in()}")
        if self.output.attach(keep_ray_printing=self.show_actor_output) and not self.show_actor_output:
            say(f"rayward run {name!r}: the actors' output is in {self.p.run_dir / ACTOR_LOG} (--verbose shows it "
                "here)")
        elif not self.show_actor_output:
            say("rayward: this Ray version cannot separate the actors' output; it is shown here")

    def _build_and_supervise(self, found: list[Path], mode: str | None) -> list[dict[str, Any]]:
        from orchestrator.loop.loops import LOOPS
        from orchestrator.run.build import build_run, rebuild_learner
        from orchestrator.run.supervisor import Supervisor
        from orchestrator.run.watchdog import Watchdog

        p, signals = self.p, self.signals
        run = self.run = build_run(p, display=self.display)
        signals.check()
        start = run.prompts.state()  # where a lost learner starts over when there is no checkpoint
        _resume(run, found, mode)
        loop = LOOPS[p.cfg.loop.mode]  # chosen once, at build time
        self.watchdog = Watchdog(run)
        supervisor = Supervisor(run, loop, rebuild=lambda: rebuild_learner(run, p), start=start,
                                hung=self.watchdog.hung_learner)
        signals.check()
        signals.looping(lambda: setattr(run.progress, "stop_requested", True))
        self.display.start(run.progress.global_step)
        self.watchdog.start()
        history = supervisor()  # on a signal the loop stops at a step boundary and checkpoints (phases.finish)
        self.display.close()
        return history

    def _teardown(self) -> None:
        import ray

        from orchestrator.run.build import shutdown_run

        if self.watchdog is not None:
            self.watchdog.stop()
        self.display.close()
        self.signals.restore()  # from here a signal acts as it would without rayward: the run is over
        if self.run is not None:
            shutdown_run(self.run)
        if self.output is not None:
            self.output.drain()
        if self.owns_ray and self.embedded:
            ray_compat.shutdown_without_grace()  # its processes ignore SIGTERM (orchestrator/run/signals.py)
        elif self.owns_ray:
            ray.shutdown()
        if self.output is not None:
            self.output.close()


def _resume(run: Run, found: list[Path], mode: str | None) -> None:
    """The compute line, the checkpoint to continue from (if any), and the generator-learner parity check."""
    from actors.weights.parity import PARITY_TOKENS, logprob_parity

    cfg, say = run.cfg, run.display.message
    threads = [f"learner {run.learner.cpu_threads()}"]
    threads += [f"generator-{i} {t}" for i, t in enumerate(run.generators.cpu_threads())]
    say(f"rayward: compute: {'; '.join(threads)}")
    ckpt = checkpoints.resume(run, found)
    if ckpt is not None:
        say(f"rayward: resumed from {ckpt} at step {run.progress.global_step}")
    elif found and mode == checkpoints.RESUME_REQUIRED:
        raise ConfigError(f"--resume: none of the checkpoints in {run.run_dir} could be loaded")
    if cfg.logging.check_logprob_parity:
        stats = run.weights.push(run.progress.global_step)
        # A vision-language model's check runs on the first training prompt with its images (the vision tower
        # and projector synced too), followed by the fixed tokens.
        first = run.prompts.encode(run.prompts.rows[0], where="data row 0")
        ids = first.prompt_ids + PARITY_TOKENS if first.images else None

        def parity() -> float:
            return logprob_parity(run.learner, run.generators, cfg.generation.temperature, ids, first.images or None)

        run.parity = parity  # again after engines join the fleet (orchestrator/loop/fleet.py)
        gap = parity()
        say(
            f"rayward: weight sync {stats.bytes / 1e6:.0f} MB in {stats.seconds:.2f}s; generator-learner "
            f"logprob parity after sync: max abs diff {gap:.2e}"
        )
        check_parity(gap, cfg)


# The default `logging.max_logprob_parity_gap` (nats), by model dtype: see its docstring.
PARITY_LIMIT = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.5}


def check_parity(gap: float, cfg: RunConfig) -> None:
    """Stop before the first step when the generators and the learner disagree on the same weights by more than
    the limit: every ratio and importance weight of the run would be computed against another model."""
    limit = cfg.logging.max_logprob_parity_gap or PARITY_LIMIT[cfg.model.dtype]
    if gap > limit:
        raise ConfigError(
            f"generator-learner logprob parity after the first weight sync is {gap:.2e} nats, above "
            f"logging.max_logprob_parity_gap = {limit:g} ({cfg.model.dtype}): the engines do not compute what the "
            "learner computes with the same weights (a sync that did not land, a layer the engine loads "
            "differently, or, on a mixture of experts, routers that the two implementations break differently: "
            "grpo.router_replay: R3 replays the engine's routing, docs/moe.md). Training on it trains on a "
            "mismatch. Raise the limit, or set logging.check_logprob_parity: false, only if you know why they differ."
        )


def _sign_in() -> str:
    """How a browser gets past the dashboard's sign-in page under Ray's token auth (on by default): the token,
    from `ray get-auth-token` (never printed: the terminal may be a shared job log)."""
    import os

    from orchestrator.cli.auth import find_token

    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return ""
    token, where = find_token()
    held = f"; it is in {where}" if token is not None else ""
    return f" (sign in with the cluster's token: `ray get-auth-token`{held})"


def _echo(message: str) -> None:
    """An actor's rayward message on the driver's terminal (sys.stderr looked up now: a live bar redirects it)."""
    print(message, file=sys.stderr, flush=True)
