"""The built run, as the loop sees it: the named groups it calls, the choices made when it was built, and one
record of where it is (`Progress`).

    generators   Generators: GeneratorGroup (cluster.num_generators)   generate, rollout, streams, restarts
    rollout      OneTurn or Agentic (orchestrator/loop/rollout.py)           which generator calls make samples
    learner      LearnerView: LearnerGroup (cluster.num_learners ranks) train_step, checkpoints, losses
    reward_pool  RewardScorer: RewardPoolGroup, NAME/reward-pool        score
    env_pool     EnvPoolView: EnvPoolGroup, NAME/env-pool (tools only)  the generators' environments' stats
    weights      WeightTransfer (collective or object-store backend)   push, submit_async, drain, rejoin
    evaluate     Evaluator (NoEval, BlockingEval or OverlappedEval)     start, after_step, drain, restore
    progress     Progress                                               the loop's, and who else writes it
    faults       FaultLog                                               recoveries, restarts, hang kills
    control      Control: ControlGroup, NAME/control                   `rayward scale --generators` requests
    fleet_autoscale  FleetAutoscaler (cluster.generator_autoscale)      the fleet's size from the learner's wait
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from actors.types import Sampling
from actors.weights.transfer import WeightTransfer
from orchestrator.algo.aggregation import RewardAggregator
from orchestrator.algo.selection import Selector
from orchestrator.config import RunConfig
from orchestrator.data.sources import DataPosition, PromptStream
from orchestrator.loop.rollout import OneTurn, RolloutKind
from orchestrator.run.groups import Control, EnvPoolView, Generators, LearnerView, RewardScorer
from orchestrator.telemetry.engines import EngineMeter
from orchestrator.telemetry.metrics import MetricsLogger
from orchestrator.telemetry.progress import Display
from orchestrator.telemetry.tool_calls import ToolCallWatch
from orchestrator.view.records import NoTokenRecord, TokenRecorder


@dataclass
class Progress:
    """Where the run is. Its writers, all of them:

        global_step, policy_version   the loop (orchestrator/loop/loops.py), after each train step and weight sync;
                                      orchestrator/run/checkpoints.py, where a run goes on from a checkpoint (or its
                                      start): `resume` before the loop starts, `rewind` from the supervisor
                                      between two runs of the loop
        resume_data                   the pipelined loop, after each step; resume and rewind clear it
        stop_requested                the SIGTERM handler (orchestrator/run/train.py), on the main thread, mid-step
        move_learner                  the watchdog's thread (orchestrator/run/watchdog.py: a preemption notice),
                                      any time; the supervisor clears it before it moves the learner
        fleet_size                    `resume` (the checkpoint's generator fleet); the loop's `rescale` applies it
                                      at the first step boundary and clears it

    The loop reads stop_requested and move_learner at each step boundary (phases.done)."""

    global_step: int = 0  # optimizer steps done (the learner's TrainResult.global_step)
    policy_version: int = 0  # learner step whose weights the generators hold, or will once the last sync lands
    stop_requested: bool = False  # SIGTERM: the loops stop at the next step boundary, then checkpoint
    # The learner's node is drained for preemption (why, for the log): the loops stop at the next step boundary
    # and checkpoint, and the supervisor moves the learner (orchestrator/run/supervisor.py)
    move_learner: str | None = None
    # Pipelined: the prompt stream's position of the next batch to train (PromptSource.untrained_position), which
    # a checkpoint keeps; None: the stream's own position (the sync loop draws each batch when it trains it)
    resume_data: DataPosition | None = None
    # The generator fleet's size a resumed checkpoint had (engines running or starting then), where it differs from
    # this start's: the run resizes to it at its first step boundary (orchestrator/loop/fleet.py rescale)
    fleet_size: int | None = None


# The run directory's fault log: one JSON object per line.
FAULTS_FILE = "faults.jsonl"


class FaultLog:
    """What went wrong and how the run came back, one JSON line each in <run dir>/FAULTS_FILE (`kind`: learner
    recovered, learner moved, generator restarted, hung actor killed, preemption notice), each also said on the
    terminal in one line."""

    def __init__(self, run_dir: Path, say: Any):
        self.path, self.say = run_dir / FAULTS_FILE, say

    def record(self, kind: str, message: str, **fields: Any) -> None:
        self.say(f"rayward: {message}")
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": time.time(), "kind": kind, "message": message, **fields}, default=str) + "\n")


class Evaluator(Protocol):
    """Held-out eval as both loops call it (orchestrator/eval/evaluator.py; chosen in build.evaluator)."""

    def start(self, step: int) -> None:
        """Before the first step (eval.at_start)."""

    def after_step(self, step: int) -> None:
        """After each step's weight sync (every eval.every_n_steps, and the last step)."""

    def drain(self) -> None:
        """At the end of the loop: an eval still on its way is recorded."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of it: {"best": the best eval so far (grpo.save_best), or None}."""

    def restore(self, state: dict[str, Any]) -> None:
        """On resume: `state` from the checkpoint (or {"best": None}: the run's start)."""


@dataclass
class Run:
    """The built run (orchestrator/run/build.py: assemble_run, from the groups build_run starts or the tests' fakes).
    The loop calls one phase at a time on it. Its groups are typed by what the driver calls on them
    (orchestrator/run/groups.py)."""

    cfg: RunConfig
    name: str
    run_dir: Path
    prompts: PromptStream  # in memory (PromptSource) or streamed from shards (StreamSource)
    generators: Generators
    learner: LearnerView
    reward_pool: RewardScorer
    weights: WeightTransfer
    evaluate: Evaluator
    aggregator: RewardAggregator
    select: Selector  # group selection between scoring and advantages: keep_all or dynamic sampling (DAPO)
    sampling: Sampling  # how the training batches are sampled (generation.*)
    prompts_per_step: int
    logger: MetricsLogger
    display: Display  # the one way the driver tells the user something: display.message(text)
    faults: FaultLog  # recoveries, restarts and hang kills: a line on the display and a record in faults.jsonl
    eval_pool: RewardScorer | None = None  # NAME/eval-reward-pool, when eval.rewards has rewards of its own
    rollout: RolloutKind = field(default_factory=OneTurn)  # one-turn completions, or agentic rollouts with tools
    env_pool: EnvPoolView | None = None  # NAME/env-pool: the environments of agentic rollouts (None: one-turn)
    tool_watch: ToolCallWatch | None = None  # agentic: says on the terminal when tool calls mostly fail
    tokens: TokenRecorder | NoTokenRecord = field(default_factory=NoTokenRecord)  # rayward view's token record
    completions: Any = None  # where the completions logs are written (orchestrator/telemetry/completions.py)
    control: Control | None = None  # NAME/control: `rayward scale --generators` (orchestrator/loop/fleet.py)
    # cluster.generator_autoscale: the fleet's size from the learner's wait (a FleetAutoscaler; None: off)
    fleet_autoscale: Any = None
    engines: EngineMeter = field(default_factory=EngineMeter)  # the engines' occupancy per step, from their streams
    # logging.check_logprob_parity: the generator-learner parity check (max abs logprob gap over every engine), run
    # again when engines join the fleet (None: not checked, or the loop tests' fakes)
    parity: Callable[[], float] | None = None
    progress: Progress = field(default_factory=Progress)
