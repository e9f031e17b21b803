"""The run from its groups (`assemble_run`: the loop tests assemble theirs from fakes of the groups,
tests/fixtures/fakes.py, with the same function): the sampling, the selector, the aggregation and the evaluator
chosen here and bound to the groups; recovery's new learner; the teardown."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

from actors.types import Rollouts, Scores
from actors.weights.transfer import WeightTransfer
from orchestrator.algo.aggregation import RewardAggregator, weighted_totals
from orchestrator.algo.selection import Refill, Selection, Selector, dynamic_sampling, keep_all, without_lost
from orchestrator.config import (
    RewardConfig,
    RunConfig,
)
from orchestrator.data.sources import Prompt, PromptStream
from orchestrator.eval.evaluator import BlockingEval, EvalSet, NoEval, OverlappedEval
from orchestrator.eval.metrics import Best, EvalSchedule
from orchestrator.loop.fleet import FleetAutoscaler
from orchestrator.loop.rollout import OneTurn, RolloutKind
from orchestrator.run.build.checks import Prepared
from orchestrator.run.build.specs import rollout_kind, training_sampling
from orchestrator.run.build.start import Groups, start_groups, start_learner, weight_transfer
from orchestrator.run.checkpoints import BestCheckpoint
from orchestrator.run.groups import Generators, LearnerView, RewardScorer
from orchestrator.run.state import Evaluator, FaultLog, Run
from orchestrator.telemetry.completions import Completions, LocalCompletions
from orchestrator.telemetry.metrics import MetricsLogger
from orchestrator.telemetry.progress import Display
from orchestrator.telemetry.tool_calls import ToolCallWatch
from orchestrator.view.records import NoTokenRecord, TokenRecorder, decode_tokens


def selector(cfg: RunConfig, aggregator: RewardAggregator) -> Selector:
    """keep_all, or dynamic sampling with the run's aggregation and targets bound in."""
    if not cfg.grpo.dynamic_sampling:
        return keep_all
    return functools.partial(
        dynamic_sampling,
        totals=functools.partial(weighted_totals, aggregator),
        target_groups=cfg.generation.generation_batch_size // cfg.generation.num_generations,
        max_refill_rounds=cfg.grpo.max_refill_rounds,
    )


def observed(select: Selector, prompts: Any, aggregator: RewardAggregator) -> Selector:
    """`select` with every scored group (the first batch's and each refill's, kept or dropped) shown to a curriculum
    sampler first (PromptSource.observe: its per-prompt statistics); `select` itself for a run without one."""
    if getattr(prompts, "curriculum", None) is None:
        return select

    def observe(rollouts: Rollouts, scores: Scores) -> None:
        totals = weighted_totals(aggregator, scores, rollouts.group_size).tolist()
        prompts.observe(rollouts.prompt_index, totals, rollouts.group_size, scores.global_step)

    def selecting(rollouts: Rollouts, scores: Scores, refill: Refill) -> Selection:
        observe(rollouts, scores)

        def refilled(n: int) -> tuple[Rollouts, Scores]:
            more = refill(n)
            observe(*more)
            return more

        return select(rollouts, scores, refilled)

    return selecting


def eval_set(cfg: RunConfig, prompts: list[Prompt], pool: RewardScorer,
             rewards: list[RewardConfig] | None = None, rollout: RolloutKind | None = None) -> EvalSet:
    """What every eval of the run generates and how it is scored (cfg.eval set): the training batches' sampling,
    with eval's num_generations, and its max_completion_length and temperature where given. rewards: the
    training rewards the pool scores (Prepared.rewards: with environment rewards; default cfg.rewards), used
    unless eval has its own. rollout: the run's (rollout_kind; default one-turn)."""
    e, train = cfg.eval, training_sampling(cfg)
    sampling = replace(
        train, n=e.num_generations,
        max_tokens=e.max_completion_length if e.max_completion_length is not None else train.max_tokens,
        temperature=e.temperature if e.temperature is not None else train.temperature,
    )
    return EvalSet(
        prompts=prompts, prompt_column=e.data.prompt_column, sampling=sampling, seed=cfg.seed, pool=pool,
        aggregator=RewardAggregator(e.rewards if e.rewards is not None else rewards or cfg.rewards),
        chunk_groups=cfg.cluster.reward_chunk_groups, pass_threshold=e.pass_threshold, max_steps=cfg.grpo.max_steps,
        rollout=rollout or OneTurn(),
    )


def evaluator(cfg: RunConfig, es: EvalSet | None, *, generators: Generators, learner: LearnerView,
              logger: MetricsLogger, prompts: PromptStream, run_dir: Path, completions: Completions) -> Evaluator:
    """The run's held-out evaluator: none, blocking between steps (sync loop), or overlapped with training
    (pipelined loop); with grpo.save_best, keeping checkpoint-best."""
    if es is None:
        return NoEval()
    e, g = cfg.eval, cfg.grpo
    best = None
    if g.save_best is not None:
        best = BestCheckpoint(Best(g.save_best, g.save_best_mode), learner, run_dir, prompts.state)
    kind = OverlappedEval if cfg.loop.overlapped else BlockingEval
    return kind(
        es, EvalSchedule(e.every_n_steps, e.at_start, g.max_steps), generators=generators, logger=logger,
        display=logger.display, prompts=prompts, best=best,
        completions=completions if cfg.logging.log_completions else None,
    )


def run_logger(p: Prepared, display: Display | None = None) -> MetricsLogger:
    """The run's metrics sinks and terminal (`display`: default step lines); the trackers' run name and
    project are logging.run_name and logging.project (TRL's run_name and project)."""
    cfg = p.cfg
    return MetricsLogger(
        p.run_dir, report_to=list(cfg.logging.report_to), progress=cfg.logging.progress,
        max_steps=cfg.grpo.max_steps, run_name=p.name, config=cfg.model_dump(mode="json"), display=display,
        tracker_name=cfg.logging.run_name, project=cfg.logging.project,
    )


def assemble_run(p: Prepared, groups: Groups, logger: MetricsLogger) -> Run:
    """The run from its groups: the choices made from the config (the sampling, the rollout kind, the selector,
    the aggregation, the evaluator) bound to them."""
    cfg, gen = p.cfg, p.cfg.generation
    aggregator = RewardAggregator(p.rewards)
    run = Run(
        cfg=cfg, name=p.name, run_dir=p.run_dir, prompts=p.prompts, generators=groups.generators,
        learner=groups.learner, reward_pool=groups.reward_pool, weights=groups.weights, evaluate=NoEval(),
        aggregator=aggregator, select=without_lost(observed(selector(cfg, aggregator), p.prompts, aggregator)),
        sampling=training_sampling(cfg),
        prompts_per_step=gen.generation_batch_size // gen.num_generations, logger=logger, display=logger.display,
        faults=FaultLog(p.run_dir, logger.display.message), eval_pool=groups.eval_pool,
        rollout=rollout_kind(p.agent, p.vision, p.cfg.data.prompt_column, teacher=p.teacher is not None),
        env_pool=groups.env_pool,
        tool_watch=ToolCallWatch(logger.display.message) if p.agent is not None else None,
        tokens=token_record(cfg, p),
        completions=groups.completions if groups.completions is not None else LocalCompletions(p.run_dir),
        control=groups.control,
        fleet_autoscale=(FleetAutoscaler(cfg.cluster.generator_autoscale)
                         if cfg.cluster.generator_autoscale is not None else None),
    )
    run.evaluate = run_evaluator(run, p)
    return run


def token_record(cfg: RunConfig, p: Prepared) -> TokenRecorder | NoTokenRecord:
    """`rayward view`'s token record (logging.token_samples completions a step, decoded by the run's tokenizer), or
    none (token_samples 0, or no completions log to pair it with)."""
    n = cfg.logging.token_samples
    if not n or not cfg.logging.log_completions or p.prompts is None:
        return NoTokenRecord()
    tokenizer = p.prompts.encode.tokenizer
    return TokenRecorder(p.run_dir, n, decode=lambda ids: decode_tokens(tokenizer, ids))


def build_run(p: Prepared, display: Display | None = None) -> Run:
    """Start the actor groups (Ray must be initialised) and assemble the run. `display` shows the steps (default:
    step lines)."""
    return assemble_run(p, start_groups(p), run_logger(p, display))


def run_evaluator(run: Run, p: Prepared) -> Evaluator:
    """The run's evaluator, bound to its current learner and generators. Its samples are made as the training
    batches' (the run's rollout kind) but carry no prompt ids: a distillation teacher scores training batches only."""
    rollout = rollout_kind(p.agent, p.vision, p.cfg.data.prompt_column)
    es = (eval_set(p.cfg, p.eval_prompts, run.eval_pool or run.reward_pool, p.rewards, rollout)
          if p.eval_prompts is not None else None)
    return evaluator(p.cfg, es, generators=run.generators, learner=run.learner, logger=run.logger,
                     prompts=run.prompts, run_dir=run.run_dir, completions=run.completions)


def rebuild_learner(run: Run, p: Prepared) -> None:
    """Recovery (orchestrator/run/supervisor.py): a new learner group in place of the lost one, wherever Ray finds room
    (saying what it waits for meanwhile), its weight-transfer group formed with the generators, and an evaluator
    bound to it. The run's state (weights, step, data) is the caller's to restore (checkpoints.rewind)."""
    run.learner.kill()  # what is left of it: live ranks of a broken group, its placement group
    say = lambda text: run.display.message(f"rayward: {text}")  # noqa: E731
    learner = start_learner(p, run.reward_pool, say)
    replace_learner(run, p, learner, weight_transfer(p.cfg, learner, run.generators))


def replace_learner(run: Run, p: Prepared, learner: LearnerView, weights: WeightTransfer) -> None:
    """A new learner group in the run (the tests' fakes too), with its weight transfer, and the evaluator bound to
    it."""
    run.learner, run.weights = learner, weights
    run.evaluate = run_evaluator(run, p)


def shutdown_run(run: Run) -> None:
    run.completions.kill()  # its last write lands first
    run.logger.close()
    for group in (run.generators, run.learner, run.reward_pool, run.eval_pool, run.env_pool, run.control):
        if group is not None:
            group.kill()
