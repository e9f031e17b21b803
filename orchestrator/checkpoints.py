"""A run's checkpoints in one place: the run directory's layout, when each checkpoint is written, and what
`--resume` loads.

    <run dir>/checkpoint-<step>/            the learner's state after optimizer step <step>: the policy (an HF
                                            model directory with its tokenizer; LoRA: the adapter in PEFT's
                                            format), optimizer.pt (optimizer and scheduler), and STATE_FILE
                                            (rayward_state.json: global_step, `data`: the prompt order's position)
    <run dir>/checkpoint-best/              grpo.save_best: the best eval's checkpoint; its STATE_FILE adds `best`
                                            (metric, value, step)
    <run dir>/checkpoint-best.candidate/    pipelined save_best: the evaluated weights until the eval's result
    <name>.tmp/                             a checkpoint being written (the learner writes a directory, then
                                            renames it: actors/learner/checkpoint.py)

When: every grpo.save_steps steps (`save_periodic`); at the end of a finished run with grpo.save_steps set, and
at the step boundary where a SIGTERM stopped the run (`save_final`, from phases.finish); checkpoint-best after an
eval that beats the best so far (`BestCheckpoint`, from the evaluator).

--resume (`resume`): the latest complete checkpoint-<step> (never checkpoint-best: a run continues from where it
stopped, not from its best eval). The learner loads its weights, optimizer, scheduler and global_step, the
prompt source its position, a weight sync brings every generator those weights, the run's progress is set to
the checkpoint's step, and checkpoint-best's record gives the best eval so far.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.group import LearnerGroup, Pending
from actors.learner.checkpoint import STATE_FILE
from orchestrator.eval_metrics import Best
from orchestrator.run import Run

BEST = "checkpoint-best"
# Where the pipelined loop's learner writes the evaluated weights until the eval's result is known.
BEST_CANDIDATE = "checkpoint-best.candidate"
PERIODIC = re.compile(r"^checkpoint-(\d+)$")  # not checkpoint-best, nor *.tmp / *.candidate


def path_at(run_dir: Path, step: int) -> Path:
    return run_dir / f"checkpoint-{step}"


def latest(run_dir: Path) -> Path | None:
    """The highest complete checkpoint-<step> in a run directory (one without its STATE_FILE is incomplete)."""
    done = [p for p in run_dir.glob("checkpoint-*") if PERIODIC.match(p.name) and (p / STATE_FILE).exists()]
    return max(done, key=lambda p: int(PERIODIC.match(p.name).group(1)), default=None)


def saved_step(ckpt: Path) -> int | None:
    """The optimizer step a checkpoint holds (None: a model directory rayward did not write)."""
    state = ckpt / STATE_FILE
    return int(json.loads(state.read_text())["global_step"]) if state.exists() else None


# --- writing ------------------------------------------------------------------------------------------------


def save(run: Run) -> str:
    """checkpoint-<global_step>: the learner's state and the prompt order's position, written atomically."""
    path = path_at(run.run_dir, run.progress.global_step)
    return run.learner.save_checkpoint(str(path), extra={"data": run.prompts.state()})


def save_periodic(run: Run) -> None:
    """Every grpo.save_steps optimizer steps."""
    every = run.cfg.grpo.save_steps
    if every is not None and run.progress.global_step % every == 0:
        save(run)


def save_final(run: Run) -> None:
    """The end of the loop: where SIGTERM stopped the run (always: the job is going away), or a finished run's last
    step with grpo.save_steps set; not twice when save_periodic just wrote this step."""
    every, step = run.cfg.grpo.save_steps, run.progress.global_step
    if not (run.progress.stop_requested or every is not None):
        return
    if every is not None and step > 0 and step % every == 0:
        return
    save(run)


# --- resuming -----------------------------------------------------------------------------------------------


def restore(run: Run, ckpt: Path) -> None:
    """The learner's weights, optimizer, scheduler and global_step, the prompt order's position, then the
    generators get the weights; the run's progress starts at the checkpoint's step."""
    state = run.learner.load_checkpoint(str(ckpt))
    if "data" in state:
        run.prompts.restore(state["data"])
    run.weights.push(int(state["global_step"]))  # labelled with the checkpoint's step (Sample.versions)
    run.progress.global_step = run.progress.policy_version = int(state["global_step"])
    run.evaluate.restore()  # the best eval so far, from checkpoint-best (grpo.save_best)


def resume(run: Run) -> Path | None:
    """Restore the run directory's latest checkpoint-<step>; returns it (None: nothing to resume, a fresh start)."""
    ckpt = latest(run.run_dir)
    if ckpt is not None:
        restore(run, ckpt)
    return ckpt


# --- checkpoint-best ----------------------------------------------------------------------------------------


class BestCheckpoint:
    """grpo.save_best: `<run dir>/checkpoint-best` is the checkpoint of the best eval so far (a full checkpoint),
    its STATE_FILE recording the metric, value and step."""

    def __init__(self, best: Best, learner: LearnerGroup, run_dir: Path, data_state: Callable[[], dict[str, Any]]):
        self.best, self.learner, self.data_state = best, learner, data_state
        self.path, self.candidate_path = run_dir / BEST, run_dir / BEST_CANDIDATE

    def restore(self) -> None:
        """On resume: the best so far is the one checkpoint-best recorded (for the same metric)."""
        state = self.path / STATE_FILE
        if state.exists():
            rec = json.loads(state.read_text()).get("best", {})
            if rec.get("metric") == self.best.metric:
                self.best.value, self.best.step = rec["value"], rec["step"]

    def capture(self) -> Pending[str]:
        """Pipelined: the learner saves the current weights as the candidate, queued before its next train step."""
        return self.learner.submit_save_checkpoint(str(self.candidate_path), extra={"data": self.data_state()})

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
            self.learner.save_checkpoint(str(self.candidate_path), extra={"data": self.data_state()})
        state_file = self.candidate_path / STATE_FILE
        state = json.loads(state_file.read_text())
        state["best"] = {"metric": self.best.metric, "value": value, "step": step}
        state_file.write_text(json.dumps(state))
        if self.path.exists():
            shutil.rmtree(self.path)
        os.replace(self.candidate_path, self.path)
        self.best.value, self.best.step = value, step
        return True
