"""The built run, as the loop sees it: the named groups it calls, the choices made when it was built, and one
record of where it is (`Progress`).

    generators   ActorGroup of actors.generation.generator.Generator    generate, stream, the weights they load
    rollout      OneTurn or Agentic (orchestrator/rollout.py)           which generator calls make samples
    learner      LearnerGroup (cluster.num_learners ranks, one member)  train_step, checkpoints, weight send
    reward_pool  RewardPoolGroup, NAME/reward-pool                      score
    env_pool     EnvPoolGroup, NAME/env-pool (tools only)               the generators' environments
    weights      WeightTransfer (collective or object-store backend)   push, submit_async, drain, rejoin
    evaluate     Evaluator (NoEval, BlockingEval or OverlappedEval)     start, after_step, drain, restore
    progress     Progress                                               written by the loop
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from actors.group import ActorGroup, EnvPoolGroup, LearnerGroup, RewardPoolGroup
from actors.weights.transfer import WeightTransfer
from orchestrator.aggregation import RewardAggregator
from orchestrator.config import RunConfig
from orchestrator.data import PromptSource
from orchestrator.rollout import OneTurn, Rollout
from orchestrator.selection import Selector
from orchestrator.telemetry.metrics import MetricsLogger
from orchestrator.telemetry.progress import Display


@dataclass
class Progress:
    """Where the run is. The loop (orchestrator/loop.py) writes global_step after each train step and
    policy_version after each weight sync; `checkpoints.restore` writes both before the loop starts; the SIGTERM
    handler (train.py) sets stop_requested. Nothing else writes it."""

    global_step: int = 0  # optimizer steps done (the learner's TrainResult.global_step)
    policy_version: int = 0  # learner step whose weights the generators hold, or will once the last sync lands
    stop_requested: bool = False  # SIGTERM: the loops stop at the next step boundary, then checkpoint


class Evaluator(Protocol):
    """Held-out eval as both loops call it (orchestrator/evaluator.py; chosen in build.evaluator)."""

    def start(self, step: int) -> None:
        """Before the first step (eval.at_start)."""

    def after_step(self, step: int) -> None:
        """After each step's weight sync (every eval.every_n_steps, and the last step)."""

    def drain(self) -> None:
        """At the end of the loop: an eval still on its way is recorded."""

    def restore(self) -> None:
        """On resume: the best eval so far (grpo.save_best)."""


@dataclass
class Run:
    """The built run (orchestrator/build.py: build_run). The loop calls one phase at a time on it."""

    cfg: RunConfig
    name: str
    run_dir: Path
    prompts: PromptSource
    generators: ActorGroup
    learner: LearnerGroup
    reward_pool: RewardPoolGroup
    weights: WeightTransfer
    evaluate: Evaluator
    aggregator: RewardAggregator
    select: Selector  # group selection between scoring and advantages: keep_all or dynamic sampling (DAPO)
    sampling: dict[str, Any]  # vLLM sampling arguments for training batches (n, max_tokens, temperature, ...)
    prompts_per_step: int
    logger: MetricsLogger
    display: Display  # the one way the driver tells the user something: display.message(text)
    eval_pool: RewardPoolGroup | None = None  # NAME/eval-reward-pool, when eval.rewards has rewards of its own
    rollout: Rollout = field(default_factory=OneTurn)  # one-turn completions, or agentic rollouts with tools
    env_pool: EnvPoolGroup | None = None  # NAME/env-pool: the environments of agentic rollouts (None: one-turn)
    progress: Progress = field(default_factory=Progress)
