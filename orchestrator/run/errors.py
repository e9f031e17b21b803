"""What a user sees when a run fails: one short block instead of Ray's, asyncio's and rayward's tracebacks.

An error raised inside an actor reaches the driver wrapped by Ray, once per actor it crossed (a reward
worker's error comes through the reward pool): `root_cause` unwraps it. `explain` writes the block: where the
run stood, what failed in the user's terms (for a reward: its name, the sample, the start of the sample's prompt
and completion, the exception, and the frames of the user's own file), the last checkpoint, and where the full
story is (`--debug`, the actors' log). Ray, torch and the actors are imported only when an error is explained:
the CLI's light commands (samples, plot) fail through here too.
"""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path
from typing import Any

# Characters of a prompt or completion shown in an error (the worker keeps a little more).
SHOWN_CHARS = 72
# Which part of a run each actor class is, in the words of the README.
ROLES = {
    "Learner": "the learner",
    "Generator": "a generator",
    "RewardPool": "the reward pool",
    "RewardWorker": "a reward worker",
}
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_TASK_RE = re.compile(r"ray::(\w+)\.\w+\(")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


class RunFailed(RuntimeError):
    """A run ended by an error (the original is `__cause__`): where it stood, for the message the CLI prints.
    `step` is the step being worked on (None: while starting), `checkpoint` the last complete one."""

    def __init__(self, name: str, run_dir: Path, step: int | None, checkpoint: Path | None):
        super().__init__(f"run {name!r} failed " + (f"at step {step}" if step is not None else "while starting"))
        self.name, self.run_dir, self.step, self.checkpoint = name, run_dir, step, checkpoint


# How a stop's signal is named to the user (orchestrator/run/signals.py HANDLED's names).
SIGNAL_WORDS = {"SIGTERM": "SIGTERM", "SIGINT": "Ctrl-C"}


class RunStopped(Exception):
    """A signal ended a run (orchestrator/run/signals.py): SIGTERM (`rayward stop`, `ray job stop`, `kill`, `timeout`,
    a scheduler) or Ctrl-C (SIGINT), at a step boundary with a checkpoint written, or while it was still starting
    (`step` None, nothing trained). `signal`: the signal's name; the CLI exits with 128 + its number."""

    def __init__(self, name: str, step: int | None, checkpoint: Path | None, signal: str = "SIGTERM"):
        where = f"at step {step}" if step is not None else "before training started"
        saved = (f"; checkpoint {shown_path(str(checkpoint))} (continue with --name {name} --resume)"
                 if checkpoint else "")
        super().__init__(f"stopped {where} ({SIGNAL_WORDS.get(signal, signal)}){saved}")
        self.name, self.step, self.checkpoint, self.signal = name, step, checkpoint, signal


def root_cause(err: BaseException) -> BaseException:
    """The error an actor (or the driver) actually raised: Ray's RayTaskError wrappers and RunFailed removed."""
    from ray.exceptions import RayTaskError

    seen: set[int] = set()
    while id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, RunFailed) and err.__cause__ is not None:
            err = err.__cause__
        elif isinstance(err, RayTaskError) and getattr(err, "cause", None) is not None:
            err = err.cause
        else:
            break
    return err


def _task_errors(err: BaseException) -> list[BaseException]:
    """The RayTaskErrors an error came through, outermost first (RunFailed skipped)."""
    from ray.exceptions import RayTaskError

    out, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, RayTaskError):
            out.append(err)
            err = vars(err).get("cause")  # vars: the dual class of ray.get delegates unknown attributes to the cause
        elif isinstance(err, RunFailed):
            err = err.__cause__
        else:
            break
    return out


def _remote_text(err: BaseException) -> str:
    """A RayTaskError's text: its remote traceback (`ray::Class.method()` and the frames), without colours.
    What ray.get raises is a class made on the fly whose str() is that text (it has no traceback_str of its own)."""
    return _ANSI_RE.sub("", vars(err).get("traceback_str") or str(err))


def failed_in(err: BaseException) -> str | None:
    """The actor role whose method raised (the innermost RayTaskError's `ray::Class.method`)."""
    for task_error in reversed(_task_errors(err)):
        m = _TASK_RE.search(_remote_text(task_error))
        if m and m.group(1) in ROLES:
            return ROLES[m.group(1)]
    return None


def shown_path(path: str) -> str:
    """A path relative to the current directory when it is under it (shorter, and what the user typed)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def shorten(text: str | None, limit: int = SHOWN_CHARS) -> str:
    text = text or ""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _reward_lines(err: Any) -> list[str]:
    """actors.rewards.worker.RewardFunctionError's fields, as the block's lines."""
    lines = [str(err)]
    if err.prompt is not None:
        lines.append(f"  prompt:     {shorten(err.prompt)}")
    if err.completion is not None:
        lines.append(f"  completion: {shorten(err.completion)}")
    for file, line, func, source in err.frames:
        lines.append(f'  File "{shown_path(file)}", line {line}, in {func}')
        if source:
            lines.append(f"    {source}")
    if err.defined_at and not err.frames:
        file, _, line = err.defined_at.rpartition(":")
        lines.append(f"  the reward function is defined at {shown_path(file)}:{line}")
    return lines


def _innermost_frame(text: str) -> str | None:
    """`file:line in function` of the last frame of a formatted traceback."""
    frames = _FRAME_RE.findall(text or "")
    if not frames:
        return None
    file, line, func = frames[-1]
    return f"{shown_path(file)}:{line} in {func}"


def _actor_died_lines(err: BaseException) -> list[str]:
    """An actor that died (crash, OOM kill, node lost, error in its constructor): its name and Ray's reason."""
    text = str(err)
    fields = dict(re.findall(r"^\t(\w+): (.*)$", text, re.M))
    who = fields.get("name") or fields.get("class_name") or "an actor"
    reason = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("\t")]
    if getattr(err, "actor_init_failed", False):
        # "The actor died because of an error raised in its creation task, <traceback>": its last line is the error
        return [f"{who} failed to start: {reason[-1] if reason else text}"]
    detail = reason[-1] if len(reason) > 1 else "it died"
    return [f"{who} died: {detail}"]


def explain(
    err: BaseException, *, debug: bool = False, run_dir: Path | None = None, headline: str = "rayward: the run failed"
) -> str:
    """The text the CLI prints for a failed run or command (no traceback unless debug). A RunFailed's first line
    names the run and step; other errors get `headline`."""
    from ray.exceptions import RayActorError

    from actors.rewards.worker import RewardFunctionError
    from actors.weights.collective import WeightTransferError

    cause = root_cause(err)
    run = err if isinstance(err, RunFailed) else None
    run_dir = run.run_dir if run is not None else run_dir
    lines = [f"rayward: {run}" if run is not None else headline]
    if isinstance(cause, RewardFunctionError):
        lines += _reward_lines(cause)
    elif isinstance(cause, WeightTransferError):
        lines.append(f"weight transfer: {cause}")
    elif isinstance(cause, RayActorError):
        lines += _actor_died_lines(cause)
    else:
        role = failed_in(err)
        text = str(cause).strip().splitlines()
        message = f"{type(cause).__name__}: {text[0] if text else ''}".rstrip(": ")
        lines.append(f"{role} raised {message}" if role else message)
        source = _remote_traceback(err) if role else "".join(traceback.format_exception(cause))
        where = _innermost_frame(source)
        if where:
            lines.append(f"  at {where}")
    if run is not None and run.checkpoint is not None:
        lines.append(f"last checkpoint: {shown_path(str(run.checkpoint))} (continue with --name {run.name} --resume)")
    if debug:
        lines += ["", "--- full traceback (--debug) ---", _full_traceback(err)]
    else:
        hint = "--debug shows the full traceback"
        if run_dir is not None and (Path(run_dir) / "actors.log").exists():
            hint += f"; the actors' output is in {shown_path(str(Path(run_dir) / 'actors.log'))}"
        lines.append(f"({hint})")
    return "\n".join(lines)


def _remote_traceback(err: BaseException) -> str:
    """The innermost RayTaskError's traceback text (where the actor raised)."""
    chain = _task_errors(err)
    return _remote_text(chain[-1]) if chain else ""


def _full_traceback(err: BaseException) -> str:
    """Everything: the driver's traceback (Ray's remote tracebacks included), plus a reward error's own."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    cause = root_cause(err)
    if getattr(cause, "traceback", None) and isinstance(cause.traceback, str):  # a RewardFunctionError's own
        text += "\nIn the reward worker:\n" + cause.traceback
    return text.rstrip()
