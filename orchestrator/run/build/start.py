"""Starting the run's actor groups (Ray initialised): reward pool with its judge and teacher pools, the eval
reward pool, the environment pool, the generators, the learner, and the weight transfer between the last two."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.engines.teacher import TeacherSpec
from actors.envs.spec import EnvSpec
from actors.rewards.worker import (
    RewardSpec,
)
from actors.runtime import cpus
from actors.runtime.group import (
    HEALTH_GROUP,
    PLACEMENT_TIMEOUT_S,
    ControlGroup,
    EnvPoolGroup,
    GeneratorGroup,
    JudgePoolGroup,
    LearnerGroup,
    RewardPoolGroup,
    TeacherPoolGroup,
)
from actors.types import TrainerState
from actors.weights.transfer import WeightTransfer
from orchestrator.config import (
    RewardConfig,
    RunConfig,
)
from orchestrator.run.build.checks import Prepared
from orchestrator.run.build.specs import (
    JUDGE_MAX_MODEL_LEN,
    agent_kwargs,
    autoscale_settings,
    engine_pool_kwargs,
    generator_cpu_share,
    learner_concurrency,
    learner_spec,
    overlapped_sync,
)
from orchestrator.run.groups import Control, EnvPoolView, Generators, LearnerView, RewardScorer
from orchestrator.telemetry.completions import ActorCompletions

# An eval-only reward pool (eval.rewards set) scores a few hundred completions every few steps: one worker.
EVAL_REWARD_WORKERS = 1


def weight_transfer(cfg: RunConfig, learner: LearnerGroup, generators: GeneratorGroup) -> WeightTransfer:
    """The run's weight-transfer backend (weight_sync.backend); the collective one's group formed."""
    from actors.weights.transfer import CollectiveTransfer, ObjectStoreTransfer, OverlappedCollectiveTransfer

    w = cfg.weight_sync
    if w.backend == "object_store":
        return ObjectStoreTransfer(learner, generators, timeout_s=w.timeout_s)
    kind = OverlappedCollectiveTransfer if overlapped_sync(cfg) else CollectiveTransfer
    transfer = kind(
        learner, generators, timeout_s=w.timeout_s, bucket_mb=w.bucket_mb, tp_size=cfg.generation.tensor_parallel_size,
    )
    transfer.connect()
    return transfer


def start_judge_pools(cfg: RunConfig, name: str, rewards: list[RewardConfig], specs: list[RewardSpec], *,
                      role: str = "judge") -> dict[str, JudgePoolGroup]:
    """Per judge reward, its named judge pool `NAME/<role>-<reward>-pool` and engines `NAME/<role>-<reward>-<i>`
    (Ray must be initialised), beside the driver as the reward pool is."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actors.engines.pool import JudgePool
    from orchestrator.run.cluster import namespace

    ns = namespace(name)
    by_name = {r.name: r for r in rewards}
    pools = {}
    for spec in specs:
        if spec.judge is None:
            continue
        e = by_name[spec.name].judge.engines  # type: ignore[union-attr]
        pools[spec.name] = JudgePoolGroup(
            JudgePool, run_name=name, role=f"{role}-{spec.name}", namespace=ns,
            options={"scheduling_strategy": NodeAffinitySchedulingStrategy(ray_node_id(), soft=False)},
            kwargs=dict(spec=spec.judge, run_name=name, role=f"{role}-{spec.name}",
                        **engine_pool_kwargs(cfg, e, ns, e.max_model_len or JUDGE_MAX_MODEL_LEN)))
    return pools


def start_teacher_pool(cfg: RunConfig, name: str, spec: TeacherSpec | None) -> TeacherPoolGroup | None:
    """The distillation teacher's named pool `NAME/teacher-pool` and engines `NAME/teacher-<i>` (Ray must be
    initialised), beside the driver as the reward pool is; None without distillation."""
    if spec is None:
        return None
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actors.engines.pool import TeacherPool
    from orchestrator.run.cluster import namespace

    assert cfg.distillation is not None
    e, ns = cfg.distillation.engines, namespace(name)
    return TeacherPoolGroup(
        TeacherPool, run_name=name, role="teacher", namespace=ns,
        options={"scheduling_strategy": NodeAffinitySchedulingStrategy(ray_node_id(), soft=False)},
        kwargs=dict(spec=spec, run_name=name, role="teacher",
                    **engine_pool_kwargs(cfg, e, ns, e.max_model_len or cfg.generation.max_model_len + 1)))


def start_reward_pool(
    cfg: RunConfig, name: str, specs: list[RewardSpec], *, role: str = "reward", num_workers: int | None = None,
    judges: dict[str, JudgePoolGroup] | None = None, teacher: TeacherPoolGroup | None = None,
) -> RewardPoolGroup:
    """The named reward pool `NAME/<role>-pool` and its workers (Ray must be initialised). The pool is not restarted
    (it holds the scoring in flight): it runs beside the driver, whose node the run cannot outlive anyway."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actors.rewards.pool import RewardPool
    from orchestrator.run.cluster import actor_options, namespace, run_sys_path

    ns = namespace(name)  # explicit, so `rayward scale NAME` finds the actors whatever the driver's namespace
    # Hard: a soft affinity lets a busy raylet spill the pool over to another node, whose loss would then end the
    # run (it needs no resources, so the driver's node can always hold it).
    beside_driver = NodeAffinitySchedulingStrategy(ray_node_id(), soft=False)
    return RewardPoolGroup(RewardPool, run_name=name, role=role, namespace=ns, judges=judges, teacher=teacher,
                           options={"scheduling_strategy": beside_driver}, kwargs=dict(
        specs=specs,
        run_name=name,
        num_workers=num_workers or cfg.cluster.num_reward_workers,
        worker_options=actor_options(cfg.cluster.reward_worker, namespace=ns),
        sys_path=run_sys_path(),
        trainer_state=TrainerState(max_steps=cfg.grpo.max_steps),
        autoscale=autoscale_settings(cfg),
        role=role,
        chunk_grace_s=cfg.cluster.hang_timeout_s,
    ))


def ray_node_id() -> str:
    """The driver's node."""
    import ray

    return ray.get_runtime_context().get_node_id()


def start_env_pool(cfg: RunConfig, name: str, spec: EnvSpec, *, num_workers: int | None = None) -> EnvPoolGroup:
    """The named environment pool `NAME/env-pool` and its workers `NAME/env-<i>` (Ray must be initialised): the
    sessions of the run's trajectories, placed and scaled as the reward pool's chunks are."""
    from actors.envs.pool import CALL_GRACE_S, EnvPool
    from orchestrator.run.cluster import actor_options, namespace, run_sys_path

    ns = namespace(name)  # explicit, so `rayward scale NAME --env-workers` finds it whatever the driver's namespace
    return EnvPoolGroup(EnvPool, run_name=name, role="env", namespace=ns, kwargs=dict(
        spec=spec,
        run_name=name,
        num_workers=num_workers or cfg.cluster.num_env_workers,
        worker_options=actor_options(cfg.cluster.env_worker, namespace=ns),
        sys_path=run_sys_path(),
        autoscale=autoscale_settings(cfg, "env_autoscale"),
        # a retiring worker's sessions belong to trajectories that end by their deadline
        drain_timeout_s=cfg.agent.trajectory_timeout_s + CALL_GRACE_S,
    ))


def start_generators(cfg: RunConfig, name: str, model_path: str, *, agent: dict[str, Any] | None = None,
                     **engine: Any) -> GeneratorGroup:
    """The run's vLLM generators, `NAME/generator-i`, on `model_path` (engine: extra vLLM engine arguments;
    agent: `agent_kwargs` for a run with tools)."""
    from actors.generation.generator import GENERATOR_GROUPS, GENERATOR_METHOD_GROUPS, Generator
    from actors.payloads import HOLD_LOADS
    from orchestrator.loop.feed import feed_shape
    from orchestrator.run.cluster import generator_options, namespace

    c, gen = cfg.cluster, cfg.generation
    calls = 1  # one generation call at a time: the sync and pipelined loops send one batch share per call
    if cfg.loop.mode == "async":  # the feed's small calls at once, their requests batched together by the engine
        # the fewest engines the fleet may have: each then takes the most calls at once
        fewest = c.generator_autoscale.min_generators if c.generator_autoscale else c.generators_at_start
        calls = feed_shape(gen.generation_batch_size // gen.num_generations, fewest,
                           cfg.loop.generation_chunks, cfg.loop.max_staleness, cfg.grpo.num_iterations
                           ).calls_per_generator
    return GeneratorGroup(
        Generator,
        c.generators_at_start,
        # weight loads beside generation, between engine steps; ping answers while a batch generates
        # (orchestrator/run/watchdog.py)
        concurrency_groups={**GENERATOR_GROUPS, HEALTH_GROUP: 1},
        method_groups=GENERATOR_METHOD_GROUPS,
        run_name=name,
        role="generator",
        options=generator_options(c.generator, gen.tensor_parallel_size, c.generator_max_restarts,
                                  namespace=namespace(name), max_concurrency=calls,
                                  **cpus.shared_cores_env(c.generator.num_gpus)),
        args=(model_path,),
        kwargs=dict(
            dtype=cfg.model.dtype,
            max_model_len=gen.max_model_len,
            kv_cache_gib=gen.kv_cache_gib,
            gpu_memory_utilization=gen.gpu_memory_utilization,
            tensor_parallel_size=gen.tensor_parallel_size,
            cpu_share=generator_cpu_share(cfg),
            extra_engine_kwargs={**engine, **gen.engine_kwargs} or None,  # the config's over the run's own
            record_routes=cfg.grpo.router_replay == "R3",
            payload_hold=cfg.loop.max_staleness + HOLD_LOADS,
            kv_after_update=gen.kv_after_update,
            processor_kwargs=dict(cfg.model.processor_kwargs) or None,
            **(agent or {}),
        ),
        per_actor_kwargs=lambda i: {"seed": cfg.seed + i},  # a member started later too (`rayward scale`)
    )


@dataclass
class Groups:
    """A run's actor groups: started (`start_groups`), or the loop tests' fakes of them."""

    generators: Generators
    learner: LearnerView | None  # None: an eval-only run
    reward_pool: RewardScorer
    weights: WeightTransfer | None  # the learner's weights into the generators (None: an eval-only run)
    eval_pool: RewardScorer | None = None  # eval.rewards' own pool
    env_pool: EnvPoolView | None = None  # a run with tools
    completions: Any = None  # the completions logs' writer (None: in this process, the loop tests' fakes)
    control: Control | None = None  # NAME/control: `rayward scale --generators` (None: nothing asks)

    def kill(self) -> None:
        for group in (self.generators, self.learner, self.reward_pool, self.eval_pool, self.env_pool,
                      self.completions, self.control):
            if group is not None:
                group.kill()


def start_groups(p: Prepared) -> Groups:
    """Start the run's actor groups and form the weight transfer (Ray must be initialised); an eval-only run's
    (`prepare_evaluation`) are `start_eval_groups`'."""
    if not p.train:
        return start_eval_groups(p)
    cfg = p.cfg
    reward_pool = start_reward_pool(cfg, p.name, p.specs, judges=start_judge_pools(cfg, p.name, p.rewards, p.specs),
                                    teacher=start_teacher_pool(cfg, p.name, p.teacher))
    eval_pool = None
    if p.eval_specs is not None:
        assert cfg.eval is not None and cfg.eval.rewards is not None
        judges = start_judge_pools(cfg, p.name, cfg.eval.rewards, p.eval_specs, role="eval-judge")
        eval_pool = start_reward_pool(cfg, p.name, p.eval_specs, role="eval-reward", num_workers=EVAL_REWARD_WORKERS,
                                      judges=judges)
    env_pool = start_env_pool(cfg, p.name, p.agent.spec) if p.agent is not None else None
    agent = agent_kwargs(cfg, p.agent, env_pool) if p.agent is not None else None
    generators = start_generators(cfg, p.name, p.policy, agent=agent)
    learner = start_learner(p, reward_pool)
    completions = start_completions(p.name, p.run_dir)
    # The engines load while the learner does; the weight group's deadline (weight_sync.timeout_s) is for forming
    # the group, not for loading a model.
    generators.wait_started(PLACEMENT_TIMEOUT_S)
    from orchestrator.run.cluster import namespace

    control = ControlGroup(run_name=p.name, namespace=namespace(p.name), generators=len(generators))
    return Groups(generators, learner, reward_pool, weight_transfer(cfg, learner, generators), eval_pool, env_pool,
                  completions, control)


def start_completions(name: str, run_dir: Path) -> ActorCompletions:
    """The completions logs' writer `NAME/completions`, beside the driver (the run directory is where the driver
    writes too): it reads each sample's completion from its payload, so the text never reaches the driver."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actors.runtime.completions import CompletionsWriter
    from orchestrator.run.cluster import namespace

    handle = ray.remote(CompletionsWriter).options(
        name=f"{name}/completions", namespace=namespace(name), num_cpus=0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node_id(), soft=False)).remote(str(run_dir))
    return ActorCompletions(handle)


def start_learner(p: Prepared, reward_pool: RewardPoolGroup, say: Callable[[str], None] | None = None) -> LearnerGroup:
    """The learner group (cluster.num_learners ranks, one member to the loop), its model loaded: while it waits
    for room, `say` hears what it waits for."""
    from actors.learner.learner import Learner
    from orchestrator.run.cluster import actor_options, namespace

    c = p.cfg.cluster
    learner = LearnerGroup(
        Learner,
        c.num_learners,
        run_name=p.name,
        strategy=c.learner_strategy,
        placement=c.learner_placement,
        options=actor_options(c.learner, namespace=namespace(p.name), **cpus.shared_cores_env(c.learner.num_gpus)),
        concurrency_groups=learner_concurrency(p.cfg),
        kwargs={"spec": learner_spec(p.cfg, p.model_path)},
        rank0_kwargs={"reward_pool": reward_pool.handle},  # rank 0 alone pushes global_step
        on_wait=say,
    )
    learner.wait_started(PLACEMENT_TIMEOUT_S, say)
    return learner


def start_eval_groups(p: Prepared) -> Groups:
    """`rayward eval`'s groups, started as a run's: the scoring rewards' pool `NAME/eval-reward-pool` (the eval's
    own rewards, else the training ones) with its judge pools, the environment pool of a run with tools, and the
    generators serving `p.policy`; no learner. A start that fails kills what was started."""
    cfg = p.cfg
    assert cfg.eval is not None
    specs, scored = (p.eval_specs, cfg.eval.rewards) if p.eval_specs is not None else (p.specs, p.rewards)
    started = Groups(generators=None, learner=None, reward_pool=None, weights=None)  # type: ignore[arg-type]
    try:
        judges = start_judge_pools(cfg, p.name, scored or [], specs, role="eval-judge")
        started.reward_pool = start_reward_pool(cfg, p.name, specs, role="eval-reward", judges=judges)
        agent = None
        if p.agent is not None:  # the environments the eval's trajectories run their tools in
            started.env_pool = start_env_pool(cfg, p.name, p.agent.spec)
            agent = agent_kwargs(cfg, p.agent, started.env_pool, cfg.eval.data.prompt_column)
        started.generators = start_generators(cfg, p.name, p.policy, agent=agent)
        started.completions = start_completions(p.name, p.run_dir)
    except BaseException:
        started.kill()
        raise
    return started
