"""`cluster:` the Ray cluster, where each stage runs and how its pools scale."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from orchestrator.config.base import _Section

# Reward-pool autoscaling defaults (cluster.reward_autoscale; `rayward scale --min/--max` on a pool without
# autoscaling starts from them too), for runs that last hours, after Ray Serve's AutoscalingConfig: grow after
# 30 s of sustained load, shrink only after 10 minutes of sustained slack (a worker started costs seconds of
# imports; an idle one only its reservation), decide on about 30 s of history.
DEFAULT_UPSCALE_DELAY_S = 30.0
DEFAULT_DOWNSCALE_DELAY_S = 600.0
DEFAULT_LOOK_BACK_S = 30.0
# Busy fraction each reward worker should settle at. In the synchronous loop the reward phase then takes about
# target / (1 - target) of the rest of the step (0.5: as long as generation + training + sync); in the
# pipelined loop workers are busy about half the time, with room to absorb a slower batch.
DEFAULT_TARGET_UTILIZATION = 0.5
# Generator autoscaling defaults (cluster.generator_autoscale). A new engine costs a model load (on a GPU node most
# of it reading the weights; a fresh node from the Ray autoscaler minutes more), so the fleet grows only after a
# minute of a starving learner, and shrinks only after ten minutes of engines idle enough that one fewer keeps up.
DEFAULT_GENERATOR_UPSCALE_DELAY_S = 60.0
# Share of a step the learner may wait for its batch before the fleet counts as too small: pipelined and async
# runs that keep up wait a few percent (the pump's polling, scoring the batch's last groups).
DEFAULT_MAX_LEARNER_WAIT = 0.1
# Busy share of a step the engines left after a shrink may have: below 1 by a margin, so the next step's longer
# completions do not make the learner wait at once (and the fleet grow back).
DEFAULT_GENERATOR_TARGET_UTILIZATION = 0.8


class RewardAutoscaleConfig(_Section):
    min_workers: int = Field(1, ge=1)
    """Fewest reward workers; idle workers are retired down to this many."""
    max_workers: int = Field(ge=1)
    """Most reward workers; the pool adds workers up to this many while work waits."""
    target_utilization: float = Field(DEFAULT_TARGET_UTILIZATION, gt=0, le=1)
    """Fraction of the time each worker should be busy (scoring at least one chunk); the pool sizes itself so
    that each batch keeps its workers busy that fraction of the batch cycle (pipelined: busy workers / target). In the
    synchronous loop the reward phase then settles at about target / (1 - target) of the rest of the step (0.5: as long
    as generate + train + sync; 0.2: a quarter of it, with more workers). Like Ray Serve's target_ongoing_requests."""
    look_back_s: float = Field(DEFAULT_LOOK_BACK_S, gt=0)
    """Seconds of history each decision averages over (Serve's look_back_period_s), stretched to whole batch
    cycles (in the synchronous loop the window always holds at least one whole step) and cut at the newest
    regime: cycles of more than 2x or less than half the newest one's work are left out, so the pool follows a
    reward that became slower or faster at once."""
    upscale_delay_s: float = Field(DEFAULT_UPSCALE_DELAY_S, ge=0)
    """The load must call for more workers this long before the pool grows (Ray Serve's default: 30 s)."""
    downscale_delay_s: float = Field(DEFAULT_DOWNSCALE_DELAY_S, ge=0)
    """The load must call for fewer workers this long before the pool retires any (Ray Serve's default:
    600 s); retiring workers finish their chunks first."""

    @model_validator(mode="after")
    def _bounds(self) -> RewardAutoscaleConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed max_workers ({self.max_workers})")
        return self


class Resources(_Section):
    num_cpus: float = Field(1.0, ge=0)
    """Logical CPUs reserved per actor."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs per actor (fractions share a GPU)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per actor: a resource only some nodes declare (e.g. {"reward_node": 1}) places the
    actor on those nodes."""


class GeneratorResources(Resources):
    num_cpus: float = Field(0.5, ge=0)
    """Logical CPUs reserved per generator actor."""


class LearnerResources(Resources):
    num_cpus: float = Field(0.5, ge=0)
    """Logical CPUs reserved for the learner actor."""


class RewardWorkerResources(Resources):
    num_cpus: float = Field(0.25, ge=0)
    """Logical CPUs reserved per reward worker (latency-bound rewards need little; CPU-bound ones want 1)."""


class EnvWorkerResources(Resources):
    num_cpus: float = Field(0.25, ge=0)
    """Logical CPUs reserved per environment worker (tools that wait on a service need little; ones that compute
    want 1)."""


class EnvAutoscaleConfig(_Section):
    min_workers: int = Field(1, ge=1)
    """Fewest environment workers; idle workers are retired down to this many (once their sessions end)."""
    max_workers: int = Field(ge=1)
    """Most environment workers; the pool adds workers up to this many while tool calls keep them busy or
    sessions wait for room."""
    target_utilization: float = Field(DEFAULT_TARGET_UTILIZATION, gt=0, le=1)
    """Fraction of the time each worker should be busy (running a tool turn, a reset or a get_reward, or full of
    sessions); the pool sizes itself to busy workers / target, as the reward pool does (docs/agents.md)."""
    look_back_s: float = Field(DEFAULT_LOOK_BACK_S, gt=0)
    """Seconds of history each decision averages over (Serve's look_back_period_s), stretched to whole cycles
    between session opens."""
    upscale_delay_s: float = Field(DEFAULT_UPSCALE_DELAY_S, ge=0)
    """The load must call for more workers this long before the pool grows (Ray Serve's default: 30 s)."""
    downscale_delay_s: float = Field(DEFAULT_DOWNSCALE_DELAY_S, ge=0)
    """The load must call for fewer workers this long before the pool retires any (Ray Serve's default: 600 s);
    a retiring worker takes no new sessions and goes once its open ones have closed."""

    @model_validator(mode="after")
    def _bounds(self) -> EnvAutoscaleConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed max_workers ({self.max_workers})")
        return self


class GeneratorAutoscaleConfig(_Section):
    min_generators: int = Field(1, ge=1)
    """Fewest generators; the fleet shrinks down to this many while generation outruns training."""
    max_generators: int = Field(ge=1)
    """Most generators; the fleet grows up to this many while the learner waits for data (and the cluster has
    room: where it has none, the run says so in one line and goes on at its size; on a cluster with the Ray
    autoscaler, the engines' resource request makes it add a node: docs/cluster.md)."""
    max_learner_wait: float = Field(DEFAULT_MAX_LEARNER_WAIT, ge=0, lt=1)
    """Share of a step the learner may wait for its batch (time/wait_rollouts / time/step); above it for
    upscale_delay_s, the fleet grows by one engine."""
    target_utilization: float = Field(DEFAULT_GENERATOR_TARGET_UTILIZATION, gt=0, le=1)
    """The fleet shrinks by one engine when the learner does not wait and one engine fewer would be generating
    at most this share of a step (measured: the step's seconds with any call generating, times n / (n - 1)),
    for downscale_delay_s."""
    upscale_delay_s: float = Field(DEFAULT_GENERATOR_UPSCALE_DELAY_S, ge=0)
    """The learner must wait this long (every step in it above max_learner_wait) before the fleet grows."""
    downscale_delay_s: float = Field(DEFAULT_DOWNSCALE_DELAY_S, ge=0)
    """The engines must have this much slack this long before the fleet shrinks; a leaving engine finishes its
    calls first (as `rayward scale --generators`)."""

    @model_validator(mode="after")
    def _bounds(self) -> GeneratorAutoscaleConfig:
        if self.min_generators > self.max_generators:
            raise ValueError(f"min_generators ({self.min_generators}) must not exceed max_generators "
                             f"({self.max_generators})")
        return self

    def clamp(self, size: int) -> int:
        """`size` generators, within the bounds."""
        return min(max(size, self.min_generators), self.max_generators)


class ClusterConfig(_Section):
    address: str | None = None
    """Ray cluster to join (`auto`, `host:6379`). null: the cluster $RAY_ADDRESS names (as inside a Ray job; the
    run's first line says so), else an embedded local cluster of the run's own (laptop, CI), whatever other Ray
    cluster runs on the machine."""
    local_num_cpus: int | None = Field(None, ge=1)
    """CPUs of the embedded local cluster (default: this machine's count). Logical: actors ask for fractions."""
    num_generators: int = Field(1, ge=1)
    """vLLM generator actors at start; prompts are split across them (resize later with `rayward scale
    --generators`); with generator_autoscale, clamped to its bounds."""
    generator_autoscale: GeneratorAutoscaleConfig | None = None
    """Let the generator fleet size itself between min_generators and max_generators from the learner's wait for
    data (loop.mode pipelined or async; docs/pipelined.md, "An elastic generator fleet"). null: the fleet stays
    at num_generators unless `rayward scale --generators` resizes it."""
    num_learners: int = Field(1, ge=1)
    """Learner ranks (data parallel), one actor each with the `learner` resources, placed by a placement group
    as `learner_placement` says. Above 1 needs `learner_strategy: fsdp`."""
    learner_placement: Literal["pack", "spread"] = "pack"
    """Where the learner ranks go. `pack`: all on one node (Ray STRICT_PACK; NCCL over NVLink/PCIe). `spread`:
    each rank on its own node (Ray STRICT_SPREAD), for a model or batch that needs several nodes; the cluster
    must have num_learners nodes with room for one rank each (checked when Ray starts)."""
    learner_strategy: Literal["single", "fsdp"] = "single"
    """`single`: one learner process on one device. `fsdp`: the num_learners ranks form a torch.distributed
    process group (gloo on CPU, NCCL on GPUs), shard the policy and reference model with FSDP2 (per decoder
    layer) and each trains on its share of every batch's micro-batches, with the single learner's numbers.
    On GPUs with model.dtype bfloat16: float32 master weights and optimizer state, bfloat16 compute."""
    num_reward_workers: int = Field(2, ge=1)
    """Reward worker actors at start (scale later with `rayward scale`); with reward_autoscale, clamped to its
    bounds."""
    reward_autoscale: RewardAutoscaleConfig | None = None
    """Let the reward pool size itself between min_workers and max_workers from its load (docs/reward-pool.md,
    "Autoscaling"). null: a fixed pool of num_reward_workers."""
    cpu_split: float = Field(0.5, gt=0, lt=1)
    """CPU nodes, pipelined loop: the generator's engine gets the last (1 - cpu_split) of its node's cores, a
    thread per core; the learner trains on every core. The sync loop splits nothing. Why: actors/runtime/cpus.py."""
    generator_max_restarts: int = Field(3, ge=0)
    """How often Ray restarts a generator actor that died (vLLM crash, OOM, lost node). A restarted generator
    rejoins the weight-transfer group and gets the current weights before it generates again."""
    max_failures: int = Field(3, ge=0)
    """How many times a run brings its learner back by itself (Ray Train's name): when a learner rank dies, its
    node is lost or it hangs, the learner is rebuilt from the latest checkpoint (grpo.save_steps; without one,
    from the initial model), the steps since that checkpoint are trained again, and the run goes on. One more
    loss ends the run naming the last cause. A learner moved off a node drained for preemption (it checkpoints
    first, nothing is lost) does not count. 0: the first loss ends the run."""
    hang_timeout_s: float = Field(120.0, gt=0)
    """How long a live generator, learner rank or reward worker may go without answering before it counts as
    hung, is killed and is replaced like a dead one (the message names it). Generators and learner ranks answer
    a driver-side ping; a reward worker's chunk may take its rewards' timeout_s plus this. Long enough for the
    longest pause a healthy actor makes (a GIL-holding call, a swap storm)."""
    reward_chunk_groups: int = Field(1, ge=1)
    """Groups (prompts x num_generations completions) per scoring chunk sent to one reward worker."""
    generator: GeneratorResources = GeneratorResources()
    """Resources of each generator actor."""
    learner: LearnerResources = LearnerResources()
    """Resources of the learner actor (of each rank, with num_learners > 1)."""
    reward_worker: RewardWorkerResources = RewardWorkerResources()
    """Resources of each reward worker actor."""
    num_env_workers: int = Field(2, ge=1)
    """With tools or environment_factory: environment worker actors at start (they hold the trajectories'
    environments and run the tools; scale later with `rayward scale --env-workers`); with env_autoscale,
    clamped to its bounds."""
    env_autoscale: EnvAutoscaleConfig | None = None
    """Let the environment pool size itself between min_workers and max_workers from its load (docs/agents.md).
    null: a fixed pool of num_env_workers."""
    env_worker: EnvWorkerResources = EnvWorkerResources()
    """Resources of each environment worker actor (`resources` can place them on CPU nodes of their own)."""

    @property
    def generators_at_start(self) -> int:
        """num_generators, within generator_autoscale's bounds where it is set."""
        a = self.generator_autoscale
        return self.num_generators if a is None else a.clamp(self.num_generators)

    @model_validator(mode="after")
    def _learners(self) -> ClusterConfig:
        if self.num_learners > 1 and self.learner_strategy == "single":
            raise ValueError(
                f"learner_strategy 'single' runs one learner; num_learners ({self.num_learners}) > 1 needs "
                "learner_strategy: fsdp"
            )
        lr = self.learner
        if self.learner_strategy == "fsdp" and not (lr.num_cpus or lr.num_gpus or any(lr.resources.values())):
            raise ValueError(
                "learner: FSDP ranks are placed by a placement group, whose bundles need a positive amount: "
                "set learner.num_cpus or learner.num_gpus above 0"
            )
        if self.learner_placement == "spread" and self.num_learners < 2:
            raise ValueError(
                "learner_placement 'spread' puts each learner rank on its own node: it needs num_learners >= 2 "
                "(with learner_strategy: fsdp)"
            )
        if self.num_learners > 1 and 0 < self.learner.num_gpus < 1:
            raise ValueError(
                f"learner.num_gpus ({self.learner.num_gpus}): FSDP ranks need a whole GPU each (NCCL runs one "
                "rank per GPU)"
            )
        return self
