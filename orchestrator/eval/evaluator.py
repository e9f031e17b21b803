"""Held-out evaluation on the engines, driver side: generate with the current weights at a step boundary, score
with the eval rewards, log `eval/...`, keep checkpoint-best. The pure part (pass@k, the schedule, the metrics)
is `orchestrator/eval/metrics.py`.

Which evaluator a run has is chosen when it is built (`orchestrator/run/build.py: evaluator`); both loops call it
the same way, one call per phase:

    run.evaluate.start(step)        before the first step (eval.at_start)
    run.evaluate.after_step(step)   after each step's weight sync (every eval.every_n_steps, and the last step)
    run.evaluate.drain()            at the end of the loop (phases.finish)
    run.evaluate.state()            for a checkpoint (orchestrator/run/checkpoints.py): the best eval so far
    run.evaluate.restore(state)     on resume: that state back

- `NoEval`: the run has no eval block; every call does nothing.
- `BlockingEval` (sync loop): between two steps the generators are idle; the eval generates there, is scored
  and recorded, and the next step starts after it.
- `OverlappedEval` (pipelined loop): the eval's generation is submitted right behind the step's weight sync,
  so every generator runs it with the new weights between two training batches (a generator runs its calls
  in submission order), and the learner waits at most one eval generation longer for the batch queued behind
  it. Its scoring and recording happen at later step boundaries, as its pieces finish. With grpo.save_best the
  learner saves a candidate checkpoint at submission (queued before its next train step, so it holds the
  evaluated weights); the eval's result decides whether the candidate becomes checkpoint-best.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from actors.runtime.group import Pending
from actors.types import GroupOut, Rollouts, Sampling, Scores, TrainerState
from orchestrator.algo.aggregation import RewardAggregator, raw_matrix, weighted_totals
from orchestrator.algo.grpo import nan_to_none
from orchestrator.data.sources import Prompt, PromptStream, to_rollouts
from orchestrator.eval.metrics import EvalSchedule, eval_metrics
from orchestrator.loop.rollout import OneTurn, RolloutKind, agent_metrics, row_seeds
from orchestrator.run.checkpoints import BestCheckpoint
from orchestrator.run.groups import Generators, RewardScorer
from orchestrator.telemetry.completions import Completions
from orchestrator.telemetry.metrics import MetricsLogger
from orchestrator.telemetry.progress import Display

# The eval's completions log, beside the training one (completions.jsonl).
EVAL_COMPLETIONS_FILE = "eval_completions.jsonl"


@dataclass
class EvalSet:
    """What an eval runs on, built once per run: the held-out prompts (tokenized), how to sample them, and the
    reward pool and aggregation that score them."""

    prompts: list[Prompt]  # the held-out prompts (draw EVAL_DRAW)
    prompt_column: str
    sampling: Sampling  # the training batches' (generation.*), eval.* over them
    seed: int  # row i's completions are drawn with seeds seed + i*n .. seed + i*n + n-1, at every eval
    pool: RewardScorer  # the pool that scores eval completions
    aggregator: RewardAggregator  # weights, gates and schedules of the eval rewards
    chunk_groups: int
    pass_threshold: float
    max_steps: int  # trainer_state.max_steps the eval rewards see
    rollout: RolloutKind = field(default_factory=OneTurn)  # one-turn, or agentic with the run's tools (as training)

    @property
    def group_size(self) -> int:
        return self.sampling.n


@dataclass
class PendingEval:
    """One eval on its way: the generators' calls, then the pool's scoring of what they returned."""

    step: int  # the optimizer step whose weights are evaluated
    epoch: float
    generation: list[Pending[list[GroupOut]]]  # the generators' calls, one per shard, in row order
    t0: float = field(default_factory=time.perf_counter)
    scoring: tuple[Rollouts, Pending[Scores]] | None = None  # once generated: the rollouts and their scoring
    candidate: Pending[str] | None = None  # pipelined save_best: the learner's candidate checkpoint


@dataclass
class EvalResult:
    step: int
    metrics: dict[str, float]
    rollouts: Rollouts
    table: dict[str, list[Any]]  # per completion: total, passed, rewards/<name>

    def rows(self) -> list[dict[str, Any]]:
        """One record per completion (the eval log and the `rayward eval` report), its completion still in its
        group's payload (actors/runtime/completions.py with_completions fills it in)."""
        r = self.rollouts
        return [
            {"step": self.step, "prompt": r.prompts[i], "completion": None,
             "completion_length": r.infos[i].model_tokens, **{k: v[i] for k, v in self.table.items()}}
            for i in range(len(r))
        ]


def submit_eval(es: EvalSet, generators: Generators, step: int, epoch: float = 0.0,
                min_version: int | None = None) -> PendingEval:
    """Submit the eval's generation (the prompts sharded over the generators); returns without waiting. min_version:
    the engines' version of the weights evaluated (a run's: `step`; None: whatever they hold, `rayward eval`)."""
    # Seeds per row, fixed across evals: two evals differ by the policy, not by the dice; vLLM adds j to a
    # prompt's seed for its j-th completion, so rows are n apart and repeated prompts still differ.
    seeds = row_seeds(es.seed, 0, len(es.prompts), es.group_size)
    return PendingEval(step, epoch, es.rollout.submit(generators, es.prompts, seeds, es.sampling, min_version))


def advance(es: EvalSet, p: PendingEval, *, block: bool = False) -> bool:
    """Move an eval on: once its generation is done, submit its scoring. Returns whether its scores are ready
    (block=True waits for the generation, not for the scores)."""
    if p.scoring is None:
        if not block and not all(part.done() for part in p.generation):
            return False
        groups = [g for part in p.generation for g in part.result()]
        rollouts = to_rollouts(es.prompts, groups, p.step, prompt_column=es.prompt_column,
                               group_size=es.group_size)
        state = TrainerState(global_step=p.step, max_steps=es.max_steps, epoch=p.epoch)
        p.scoring = (rollouts, es.pool.submit_score(es.rollout.reward_batch(rollouts), es.chunk_groups, state=state))
    return p.scoring[1].done()


def finish_eval(es: EvalSet, p: PendingEval) -> EvalResult:
    """Wait for an eval and compute its metrics."""
    advance(es, p, block=True)
    rollouts, scoring = p.scoring
    metrics, table = summarize(es, rollouts, scoring.result(), p.step)
    metrics["eval/seconds"] = time.perf_counter() - p.t0
    return EvalResult(p.step, metrics, rollouts, table)


def summarize(
    es: EvalSet, rollouts: Rollouts, scores: Scores, step: int
) -> tuple[dict[str, float], dict[str, list[Any]]]:
    """The eval metrics (weights and gates at the evaluated step) and the per-completion table."""
    raw = raw_matrix(scores)
    total = weighted_totals(es.aggregator, scores, es.group_size, step=step)
    lengths = rollouts.lengths()  # agentic: the model's tokens, not the tool results
    metrics = eval_metrics(es.aggregator.names, raw, total, lengths, rollouts.truncated, es.group_size,
                           es.pass_threshold)
    metrics.update({f"eval/{k}": v for k, v in agent_metrics(rollouts).items()})
    metrics["eval/policy_version"] = step
    table: dict[str, list[Any]] = {
        "total": nan_to_none(total.tolist()), "passed": (total >= es.pass_threshold).tolist(),
    }
    for k, name in enumerate(es.aggregator.names):
        table[f"rewards/{name}"] = nan_to_none(raw[:, k].tolist())
    return metrics, table


# --- the evaluators the loops call --------------------------------------------------------------------------


class NoEval:
    """No eval block: nothing to do at any step."""

    def start(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def drain(self) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {"best": None}

    def restore(self, state: dict[str, Any]) -> None:
        pass


class _Evaluator:
    """What both evaluators share: the eval set, the schedule, and recording a finished eval."""

    def __init__(
        self, es: EvalSet, schedule: EvalSchedule, *, generators: Generators, logger: MetricsLogger, display: Display,
        prompts: PromptStream, best: BestCheckpoint | None, completions: Completions | None,
    ):
        """completions: where the eval's completions log is written (None: logging.log_completions off)."""
        self.es, self.schedule, self.generators, self.logger, self.display = es, schedule, generators, logger, display
        self.prompts, self.best_checkpoint, self.completions = prompts, best, completions

    def state(self) -> dict[str, Any]:
        return {"best": self.best_checkpoint.state() if self.best_checkpoint is not None else None}

    def restore(self, state: dict[str, Any]) -> None:
        if self.best_checkpoint is not None:
            self.best_checkpoint.restore(state["best"])

    def _submit(self, step: int) -> PendingEval:
        return submit_eval(self.es, self.generators, step, self.prompts.epoch_progress, min_version=step)

    def _record(self, result: EvalResult, candidate: Pending[str] | None) -> None:
        self.logger.log_eval(result.step, result.metrics)
        if self.completions is not None:  # the writer reads the completions from their payloads
            self.completions.write(EVAL_COMPLETIONS_FILE, result.rows(), result.rollouts.payloads,
                                   result.rollouts.group_size)
        keeper = self.best_checkpoint
        if keeper is not None and keeper.offer(result.step, result.metrics, candidate):
            self.display.message(
                f"rayward: checkpoint-best: step {result.step} ({keeper.best.metric} {keeper.best.value:.4g})"
            )


class BlockingEval(_Evaluator):
    """Sync loop: evaluate between steps and wait for it (the generators are idle there anyway)."""

    def start(self, step: int) -> None:
        if self.schedule.at_start:
            self._evaluate(step)

    def after_step(self, step: int) -> None:
        if self.schedule.due(step):
            self._evaluate(step)

    def drain(self) -> None:
        pass

    def _evaluate(self, step: int) -> None:
        self._record(finish_eval(self.es, self._submit(step)), candidate=None)


class OverlappedEval(_Evaluator):
    """Pipelined loop: the eval's generation queued behind the weight sync, finished at later step boundaries."""

    pending: PendingEval | None = None

    def start(self, step: int) -> None:
        if self.schedule.at_start:
            self._submit_overlapped(step)

    def after_step(self, step: int) -> None:
        if self.pending is not None and advance(self.es, self.pending):
            self._finish()
        if self.schedule.due(step):
            self._submit_overlapped(step)

    def drain(self) -> None:
        if self.pending is not None:
            self._finish()

    def _submit_overlapped(self, step: int) -> None:
        if self.pending is not None:  # generated long ago (it was queued before the batches since): its scoring
            self._finish()
        candidate = self.best_checkpoint.capture() if self.best_checkpoint is not None else None
        self.pending = self._submit(step)
        self.pending.candidate = candidate

    def _finish(self) -> None:
        p, self.pending = self.pending, None
        self._record(finish_eval(self.es, p), p.candidate)
