"""The supervisor: the training loop inside a recovery loop, so that a run outlives the loss of its learner.

    history = Supervisor(run, loop, rebuild, start, hung)()

The loop (orchestrator/loop/loops.py) knows nothing of it. When the loop ends with an error, the supervisor asks the
learner group whether it is gone (`LearnerGroup.lost`: the error names a dead rank, or a rank is dead or does
not answer a ping). If it is, the learner is rebuilt (`rebuild`: orchestrator/run/build.py rebuild_learner, where
Ray finds room, saying what it waits for), the run is rewound to the latest checkpoint
(orchestrator/run/checkpoints.py `rewind`: the learner's state, the prompt stream's position, the reward pool's
trainer_state, the best eval so far; with no checkpoint, the run's start) and the loop runs again. Up to
cluster.max_failures losses; one more and the run ends with that loss's error. A loss Ray blames on a
preemption does not count (Ray Train's separate preemption budget, unbounded by default).

A preemption notice (orchestrator/run/watchdog.py sets progress.move_learner) makes the loop stop at the next step
boundary and checkpoint (phases.finish); the supervisor then moves the learner the same way, from that
checkpoint: nothing is lost and nothing is counted.

What a recovery loses: the steps since the checkpoint, which are trained again on the same prompts (the sync loop
draws the same completions too: every request is seeded); the pipelined loop's batches generated ahead are
dropped and their prompts drawn again, so no sample is trained on twice. Each recovery is one line on the
terminal and a record in faults.jsonl: its cause, the steps lost, the seconds it took.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.data.sources import DataPosition
from orchestrator.run import checkpoints
from orchestrator.run.state import Run


class Supervisor:
    """Runs `loop(run)` until it returns, bringing the learner back as the module docstring says."""

    def __init__(self, run: Run, loop: Callable[[Run], list[dict[str, Any]]], rebuild: Callable[[], None],
                 start: DataPosition, hung: Callable[[], str | None] = lambda: None):
        """rebuild: a new learner group in place of the run's (and its weight transfer, its evaluator). start: the
        prompt stream's state the run started from (the rewind point without a checkpoint). hung: the hang
        check's word on the learner, if it killed it (orchestrator/run/watchdog.py)."""
        self.run, self.loop, self.rebuild, self.start, self.hung = run, loop, rebuild, start, hung
        self.failures = 0  # losses counted against cluster.max_failures

    def __call__(self) -> list[dict[str, Any]]:
        run = self.run
        limit = run.cfg.cluster.max_failures
        while True:
            try:
                history = self.loop(run)
            except Exception as err:
                loss = run.learner.lost(err, run.cfg.cluster.hang_timeout_s)
                if loss is None:
                    raise
                counted = not loss.preempted
                if counted and self.failures >= limit:
                    run.display.message(f"rayward: the learner is lost again ({self.hung() or loss.cause}); "
                                        f"cluster.max_failures ({limit}) is spent: the run ends")
                    raise
                self.failures += counted
                self.recover("learner_recovered", self.hung() or loss.cause, counted=counted)
                continue
            move = run.progress.move_learner
            if move is None or run.progress.stop_requested:
                return history
            self.recover("learner_moved", move, counted=False)

    def recover(self, kind: str, cause: str, *, counted: bool) -> None:
        """Rebuild the learner, rewind the run to its latest checkpoint, record what it cost."""
        run = self.run
        t0, failed_at = time.monotonic(), run.progress.global_step
        budget = f" ({self.failures}/{run.cfg.cluster.max_failures})" if counted else ""
        run.display.message(f"rayward: {cause}: rebuilding the learner{budget}")
        run.progress.move_learner = None
        self.rebuild()
        ckpt = checkpoints.rewind(run, self.start)
        step, seconds = run.progress.global_step, time.monotonic() - t0
        run.logger.rewind(step)
        where = ckpt.name if ckpt is not None else "the initial model (no checkpoint)"
        run.faults.record(
            kind, f"learner back at step {step} from {where} after {seconds:.1f} s; {failed_at - step} step(s) lost",
            cause=cause, failed_at_step=failed_at, restored_step=step, checkpoint=_name(ckpt),
            steps_lost=failed_at - step, seconds=seconds, failures=self.failures,
            max_failures=run.cfg.cluster.max_failures,
        )


def _name(ckpt: Path | None) -> str | None:
    return None if ckpt is None else ckpt.name
