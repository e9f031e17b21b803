"""A run's checkpoints in one place: the run directory's layout, what a checkpoint holds, when each is written,
what `--resume` loads, and where a lost learner starts again (`rewind`, for orchestrator/run/supervisor.py).

    <run dir>/checkpoint-<step>/            the run after optimizer step <step>: the policy (an HF model
                                            directory with its tokenizer; LoRA: the adapter in PEFT's format),
                                            optimizer.pt (optimizer, scheduler, the learner's random number
                                            generators: actors/learner/checkpoint.py) and STATE_FILE
    <run dir>/checkpoint-best/              grpo.save_best: the best eval's checkpoint; its STATE_FILE adds `best`
                                            (metric, value, step)
    <run dir>/checkpoint-best.candidate/    pipelined save_best: the evaluated weights until the eval's result
    <name>.tmp/, <name>.old/                a checkpoint being written, and one being replaced by it (the learner
                                            writes a directory, then renames it: a crash leaves one of them whole)

STATE_FILE (rayward_state.json), written last: global_step, `files` (every other file's size: a checkpoint whose
files differ is damaged), and the run's state (`RunState`, from `run_state`), everything a resumed run needs to go
on as the stopped one would have:
    data            the prompt stream's position of the next batch to train (with the draws to skip)
    trainer_state   what the reward pool holds: global_step, max_steps, epoch (the rewards' curriculum)
    eval            the evaluator's bookkeeping: the best eval so far (grpo.save_best)
    reward_pool     how the reward pool is sized: what `rayward scale` set (count or autoscaling bounds)
    generators      the generator fleet's size (engines taking work or starting): what `rayward scale
                    --generators` or the autoscaler made it; a resumed run resizes to it at its first step boundary

When: every grpo.save_steps steps (`save_periodic`); at the end of a finished run with grpo.save_steps set, and
at the step boundary where a SIGTERM stopped the run or a preemption notice moves the learner (`save_final`, from
phases.finish); checkpoint-best after an eval that beats the best so far (`BestCheckpoint`, from the evaluator).

--resume (`find`, before anything starts, then `resume`): the latest usable checkpoint-<step> (never
checkpoint-best: a run continues from where it stopped, not from its best eval). A damaged one, or one that
fails to load, is passed over with a message for the one before. A resume that finds nothing to do fails
(exit 2) instead of "finishing" a run that did not train: no checkpoint (`--resume`; `--resume auto` starts
afresh), or one at grpo.max_steps already.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError

from actors.learner.checkpoint import REPLACED_SUFFIX, STATE_FILE, damaged
from actors.runtime.error_text import one_line
from actors.runtime.group import Pending
from actors.types import TrainerState
from orchestrator.config import ConfigError
from orchestrator.data.shards import StreamPosition, position_from_json
from orchestrator.data.sources import DataPosition
from orchestrator.eval.metrics import Best
from orchestrator.run.groups import LearnerView
from orchestrator.run.state import Run

BEST = "checkpoint-best"
# Where the pipelined loop's learner writes the evaluated weights until the eval's result is known.
BEST_CANDIDATE = "checkpoint-best.candidate"
PERIODIC = re.compile(r"^checkpoint-(\d+)$")  # not checkpoint-best, nor *.tmp / *.old / *.candidate
# `--resume` modes: a checkpoint is required, or used if there is one (a retried driver).
RESUME_REQUIRED, RESUME_AUTO = "required", "auto"


def path_at(run_dir: Path, step: int) -> Path:
    return run_dir / f"checkpoint-{step}"


def _step_of(p: Path) -> int:
    return int(PERIODIC.match(p.name).group(1))


def complete(run_dir: Path) -> list[Path]:
    """Every checkpoint-<step> with its STATE_FILE (written last: one without it is incomplete), newest first."""
    found = [p for p in run_dir.glob("checkpoint-*") if PERIODIC.match(p.name) and (p / STATE_FILE).exists()]
    return sorted(found, key=_step_of, reverse=True)


def usable(run_dir: Path, say: Callable[[str], None] | None = None) -> list[Path]:
    """The complete checkpoints whose files are whole, newest first; each damaged one is named to `say`."""
    out = []
    for p in complete(run_dir):
        why = damaged(p)
        if why is None:
            out.append(p)
        elif say is not None:
            say(f"rayward: {p.name} is damaged ({why}): using the checkpoint before it")
    return out


def latest(run_dir: Path) -> Path | None:
    """The newest usable checkpoint-<step> of a run directory."""
    found = usable(run_dir)
    return found[0] if found else None


def saved_step(ckpt: Path) -> int | None:
    """The optimizer step a checkpoint holds (None: a model directory rayward did not write)."""
    state = ckpt / STATE_FILE
    return int(json.loads(state.read_text())["global_step"]) if state.exists() else None


# --- writing ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunState:
    """What a checkpoint keeps of the run besides the learner's state (the module docstring's STATE_FILE, under
    these keys)."""

    data: DataPosition | StreamPosition  # the prompt stream's position of the next batch to train
    trainer_state: TrainerState  # what the reward pool holds
    eval: dict[str, Any]  # the evaluator's bookkeeping (Evaluator.state: the best eval so far)
    reward_pool: dict[str, Any]  # how the reward pool is sized (RewardPoolGroup.scaling)
    # the generator fleet's size: engines taking work or starting (None: a checkpoint from before it was kept)
    generators: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data.to_json(), "trainer_state": asdict(self.trainer_state), "eval": self.eval,
                "reward_pool": self.reward_pool, "generators": self.generators}

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> RunState:
        """From a STATE_FILE's contents (its other keys, global_step and files, are the learner's)."""
        return cls(position_from_json(state["data"]), TrainerState(**state["trainer_state"]), state["eval"],
                   state["reward_pool"], state.get("generators"))


def run_state(run: Run) -> RunState:
    """The run's state now: at a step boundary, what a checkpoint of this step keeps."""
    p = run.progress
    trainer = TrainerState(global_step=p.global_step, max_steps=run.cfg.grpo.max_steps,
                           epoch=run.prompts.epoch_progress)
    data = p.resume_data if p.resume_data is not None else run.prompts.state()
    fleet = run.generators.active + len(run.generators.pending())  # retiring ones are leaving: not counted
    return RunState(data, trainer, run.evaluate.state(), run.reward_pool.scaling(), fleet)


def save(run: Run) -> str:
    """checkpoint-<global_step>: the learner's state and the run's, written atomically."""
    path = str(path_at(run.run_dir, run.progress.global_step))
    return run.learner.save_checkpoint(path, extra=run_state(run).to_json())


def save_periodic(run: Run) -> None:
    """Every grpo.save_steps optimizer steps."""
    every = run.cfg.grpo.save_steps
    if every is not None and run.progress.global_step % every == 0:
        save(run)


def save_final(run: Run) -> None:
    """The end of the loop: where SIGTERM stopped the run or a preemption notice moves the learner (always: the job
    or the node is going away), or a finished run's last step with grpo.save_steps set; not twice when
    save_periodic just wrote this step."""
    every, step = run.cfg.grpo.save_steps, run.progress.global_step
    leaving = run.progress.stop_requested or run.progress.move_learner is not None
    if not (leaving or every is not None):
        return
    if every is not None and step > 0 and step % every == 0:
        return
    save(run)


# --- resuming -----------------------------------------------------------------------------------------------


def find(run_dir: Path, mode: str | None, max_steps: int, say: Callable[[str], None]) -> list[Path]:
    """Before anything starts: the checkpoints `--resume` may load, newest first ([] for a fresh start). Raises
    ConfigError when a resume has nothing to do: no checkpoint (mode RESUME_REQUIRED), or the latest one is at
    max_steps already."""
    if mode is None:
        return []
    found = usable(run_dir, say)
    if not found:
        if mode == RESUME_AUTO:
            say(f"rayward: no checkpoint in {run_dir} yet: starting from the initial model")
            return []
        raise ConfigError(f"--resume: no checkpoint in {run_dir} (grpo.save_steps writes them, and so does a "
                          "SIGTERM): nothing to resume")
    step = saved_step(found[0])
    if step >= max_steps:
        raise ConfigError(f"--resume: {found[0]} is at step {step} and grpo.max_steps is {max_steps}: the run has "
                          "nothing left to train (raise grpo.max_steps to train on)")
    return found


def restore(run: Run, ckpt: Path, *, scaling: bool = True) -> None:
    """The learner's weights, optimizer, scheduler, RNGs and global_step, the prompt stream's position, the reward
    pool's trainer_state (and, scaling=True, its size and the generator fleet's: `_restore_fleet`), the evaluator's
    best so far; then the generators get the weights and the run's progress is set to the checkpoint's step."""
    state = run.learner.load_checkpoint(str(ckpt))
    step, saved = int(state["global_step"]), RunState.from_json(state)
    run.prompts.restore(saved.data)
    run.reward_pool.set_state(saved.trainer_state)
    if scaling:
        run.reward_pool.restore_scaling(saved.reward_pool)
        _restore_fleet(run, saved.generators)
    run.evaluate.restore(saved.eval)
    _go_on_from(run, step)


def _restore_fleet(run: Run, size: int | None) -> None:
    """The generator fleet goes back to the size it had at the checkpoint (what `rayward scale --generators` or
    the autoscaler made it; within cluster.generator_autoscale's bounds where it is set): asked of the loop, which
    resizes at its first step boundary while the run trains (orchestrator/loop/fleet.py)."""
    if size is None:
        return
    auto = run.cfg.cluster.generator_autoscale
    size = auto.clamp(size) if auto is not None else size
    now = run.generators.active
    if size == now:
        return
    run.progress.fleet_size = size
    run.display.message(f"rayward: generators: the checkpoint's fleet had {size} (this start has {now}): resizing "
                        "to it at the first step boundary")


def _go_on_from(run: Run, step: int) -> None:
    run.weights.push(step)  # labelled with the checkpoint's step (Sample.versions)
    p = run.progress
    p.global_step = p.policy_version = step
    p.resume_data = None


def resume(run: Run, candidates: list[Path], *, scaling: bool = True) -> Path | None:
    """Restore the first of `candidates` (newest first) that loads; one that fails to load is named and passed
    over. Returns the checkpoint restored (None: none did, and the run starts afresh)."""
    for i, ckpt in enumerate(candidates):
        try:
            restore(run, ckpt, scaling=scaling)
            return ckpt
        except RayActorError:  # the learner died: not the checkpoint's fault
            raise
        except Exception as err:  # noqa: BLE001 - any failure to load it
            then = f"using {candidates[i + 1].name}" if i + 1 < len(candidates) else "starting afresh"
            run.display.message(f"rayward: {ckpt.name} could not be loaded ({one_line(err)}): {then}")
    return None


def rewind(run: Run, start: DataPosition) -> Path | None:
    """A rebuilt learner's starting point: the latest usable checkpoint (older ones if it is damaged), or, with
    none, the run's start: the initial weights the new learner holds, `start` (the prompt stream's first
    position), step 0. Returns the checkpoint (None: the start)."""
    ckpt = resume(run, usable(run.run_dir, run.display.message), scaling=False)
    if ckpt is None:
        run.prompts.restore(start)
        run.reward_pool.set_state(TrainerState(max_steps=run.cfg.grpo.max_steps))
        run.evaluate.restore({"best": None})
        _go_on_from(run, 0)
    return ckpt


# --- checkpoint-best ----------------------------------------------------------------------------------------


class BestCheckpoint:
    """grpo.save_best: `<run dir>/checkpoint-best` is the checkpoint of the best eval so far (a full checkpoint),
    its STATE_FILE recording the metric, value and step."""

    def __init__(self, best: Best, learner: LearnerView, run_dir: Path, data_state: Callable[[], DataPosition]):
        self.best, self.learner, self.data_state = best, learner, data_state
        self.path, self.candidate_path = run_dir / BEST, run_dir / BEST_CANDIDATE

    def state(self) -> dict[str, Any]:
        return {"metric": self.best.metric, "value": self.best.value, "step": self.best.step}

    def restore(self, rec: dict[str, Any] | None) -> None:
        """The best so far as a checkpoint recorded it (`state()`; None: none yet)."""
        if rec is None or rec.get("metric") != self.best.metric:
            self.best.value = self.best.step = None
        else:
            self.best.value, self.best.step = rec["value"], rec["step"]

    def capture(self) -> Pending[str]:
        """Pipelined: the learner saves the current weights as the candidate, queued before its next train step."""
        return self.learner.submit_save_checkpoint(str(self.candidate_path),
                                                   extra={"data": self.data_state().to_json()})

    def offer(self, step: int, metrics: dict[str, float], candidate: Pending[str] | None) -> bool:
        """Keep the evaluated checkpoint if its metric beats the best so far: the candidate (pipelined), or a
        checkpoint saved now (sync: the learner still holds the evaluated weights). Returns whether it did."""
        value = metrics[self.best.metric]
        if candidate is not None:
            candidate.result()
        if not self.best.improves(value):
            if candidate is not None:
                shutil.rmtree(self.candidate_path, ignore_errors=True)
            return False
        if candidate is None:
            self.learner.save_checkpoint(str(self.candidate_path), extra={"data": self.data_state().to_json()})
        state_file = self.candidate_path / STATE_FILE
        state = json.loads(state_file.read_text())
        state["best"] = {"metric": self.best.metric, "value": value, "step": step}
        state_file.write_text(json.dumps(state))
        old = self.path.with_name(self.path.name + REPLACED_SUFFIX)  # a crash leaves one of the two whole
        shutil.rmtree(old, ignore_errors=True)
        if self.path.exists():
            os.replace(self.path, old)
        os.replace(self.candidate_path, self.path)
        shutil.rmtree(old, ignore_errors=True)
        self.best.value, self.best.step = value, step
        return True
