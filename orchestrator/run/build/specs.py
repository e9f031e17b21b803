"""What each actor is built from, read off the config (pure, unit-tested): reward and judge specs (built-in
rewards resolved, functions imported so a typo fails before Ray), the teacher's, the learner's, the pools' autoscaling,
the generators' CPU share and agentic arguments, the sampling, how samples are made (the rollout kind)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

from actors import user_code
from actors.engines.judge import JudgeSpec, missing_answer, template_fields
from actors.engines.teacher import TeacherSpec
from actors.learner.loss import ImportanceSampling, LossConfig
from actors.learner.specs import LearnerSpec, ModelSpec, OptimSpec, StepSpec
from actors.rewards.builtin import BUILTIN_PACKAGES, BUILTIN_REWARDS, builtin_target
from actors.rewards.worker import (
    LazyGate,
    RewardFunctionError,
    RewardSpec,
    declares_environments,
    load_reward_function,
    required_columns,
)
from actors.runtime import cpus
from actors.runtime.autoscale import AutoscaleSettings
from actors.runtime.cpus import Share
from actors.runtime.group import (
    SEND_GROUP,
    EnvPoolGroup,
)
from actors.types import Sampling
from orchestrator.builtin.models import resolve
from orchestrator.config import (
    ConfigError,
    EnginesConfig,
    RewardConfig,
    RunConfig,
)
from orchestrator.loop.rollout import Agentic, OneTurn, RolloutKind
from orchestrator.run.agents import AgentSetup, env_reward_spec

# A judge's context when its engines section gives none: a rubric prompt and a short answer fit.
JUDGE_MAX_MODEL_LEN = 1024


def resolve_model(cfg: RunConfig) -> str:
    """The policy's directory: the built-in tiny models built into the cache on first use, else the path as given."""
    return resolve_path(cfg.model.name_or_path)


def resolve_path(name: str) -> str:
    """A model field's directory (the policy's, a judge's, a teacher's): a built-in tiny model's, built into the
    cache on first use, else the path as given (orchestrator/builtin/models: the registry)."""
    return resolve(name)


def judge_spec(r: RewardConfig, field: str, seed: int = 0) -> JudgeSpec:
    """A judge reward's JudgeSpec, its parser imported (a typo fails now, naming the field). Its model is the
    name as configured: `resolve_judges` builds a built-in one once every cheap check has passed."""
    j = r.judge
    assert j is not None
    if j.parser is not None:
        try:
            user_code.import_object(j.parser, f"{field}[{r.name}].judge.parser")
        except user_code.UserCodeError as err:
            raise ConfigError(str(err)) from None
    try:
        fields = template_fields(j.template)  # well-formed; the dataset's columns: `check_judge_templates`
    except ValueError as err:
        raise ConfigError(f"{field}[{r.name}].judge.template: {err}") from None
    why = missing_answer(fields)
    if why is not None:
        raise ConfigError(f"{field}[{r.name}].judge.template: {why}")
    return JudgeSpec(
        reward=r.name, model=j.model, template=j.template, system=j.system, temperature=j.temperature,
        top_p=j.top_p, top_k=j.top_k, max_tokens=j.max_completion_length, stop=tuple(j.stop), regex=j.regex,
        labels=dict(j.labels) if j.labels else None, parser=j.parser, timeout_s=r.timeout_s, seed=seed,
        chat_template_kwargs=dict(j.chat_template_kwargs),
    )


def resolve_judges(specs: list[RewardSpec]) -> list[RewardSpec]:
    """`specs` with each judge's model resolved (`resolve_path`: a built-in tiny judge built into the cache)."""
    return [s if s.judge is None else replace(s, judge=replace(s.judge, model=resolve_path(s.judge.model)))
            for s in specs]


def teacher_spec(cfg: RunConfig, tokenizer: Any) -> TeacherSpec | None:
    """distillation as the teacher pool's spec, its model resolved (a built-in tiny teacher built) and its tokenizer
    checked against the policy's (`check_teacher_tokenizer`); None without distillation."""
    d = cfg.distillation
    if d is None:
        return None
    path = resolve_path(d.teacher)
    from transformers import AutoTokenizer

    try:
        theirs = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as err:  # noqa: BLE001 - any failure to load it is the teacher field's
        raise ConfigError(f"distillation.teacher {d.teacher!r}: cannot load its tokenizer ({err})") from None
    check_teacher_tokenizer(tokenizer, theirs, d.teacher)
    return TeacherSpec(model=path, timeout_s=d.timeout_s, seed=cfg.seed)


def check_teacher_tokenizer(student: Any, teacher: Any, name: str) -> None:
    """The teacher reads the student's token ids, so every id must be the same token to both: the vocabularies
    (added and special tokens included) must be equal. ConfigError naming distillation.teacher otherwise."""
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine == theirs:
        return
    differ = sorted((tok for tok in {*mine, *theirs} if mine.get(tok) != theirs.get(tok)),
                    key=lambda t: min(mine.get(t, 1 << 30), theirs.get(t, 1 << 30)))
    shown = ", ".join(f"{t!r}: policy {mine.get(t)} / teacher {theirs.get(t)}" for t in differ[:3])
    raise ConfigError(
        f"distillation.teacher {name!r}: its tokenizer is not the policy's ({len(mine)} vs {len(theirs)} tokens; "
        f"{len(differ)} differ, e.g. {shown}): the teacher scores the policy's token ids, which must mean the "
        "same tokens to both; give a teacher of the policy's model family (same tokenizer)")


def reward_specs(rewards: list[RewardConfig], field: str = "rewards",
                 chat_template_kwargs: dict[str, Any] | None = None, seed: int = 0) -> list[RewardSpec]:
    """The rewards as worker specs, built-in names resolved; each function imported once here so a typo
    fails now, naming the reward (`field`: `rewards` or `eval.rewards`), instead of inside a worker after Ray
    and vLLM have started. A reward with no function, model or judge is an environment's get_reward()
    (checked against the environment classes in orchestrator/run/agents.py)."""
    specs = []
    for r in rewards:
        lazy = LazyGate(r.gate.reward, float(r.gate.threshold)) if r.gate is not None and r.lazy else None
        if r.judge is not None:
            specs.append(RewardSpec(name=r.name, timeout_s=r.timeout_s, on_error=r.on_error, fallback=r.fallback,
                                    lazy_gate=lazy, judge=judge_spec(r, field, seed)))
            continue
        if not r.has_source:
            specs.append(env_reward_spec(r))
            continue
        fn = r.function
        if fn is not None and ":" not in fn:
            if fn not in BUILTIN_REWARDS:
                raise ConfigError(
                    f"{field}[{r.name}].function: unknown built-in {fn!r} (built-ins: {sorted(BUILTIN_REWARDS)}; "
                    "or give module:callable)"
                )
            if fn in BUILTIN_PACKAGES and importlib.util.find_spec(BUILTIN_PACKAGES[fn][0]) is None:
                module, package = BUILTIN_PACKAGES[fn]
                raise ConfigError(f"{field}[{r.name}].function: {fn} needs the `{package}` package, which is not "
                                  f"installed (pip install {package}; or rayward's `math` extra)")
            fn = builtin_target(fn, configured=bool(r.kwargs))
        spec = RewardSpec(
            name=r.name, function=fn, model=r.model, timeout_s=r.timeout_s, on_error=r.on_error,
            fallback=r.fallback, batched=r.batched, kwargs=dict(r.kwargs),
            chat_template_kwargs=dict(chat_template_kwargs or {}),
            lazy_gate=lazy,
        )
        if spec.function:
            try:
                loaded = load_reward_function(spec)
            except RewardFunctionError as err:
                raise ConfigError(f"{field}[{r.name}].function: {err}") from None
            spec = replace(spec, takes_environments=declares_environments(loaded),
                           columns=tuple(required_columns(loaded)))
        specs.append(spec)
    return specs


def generator_cpu_share(cfg: RunConfig) -> Share | None:
    """The generators' share of a CPU node's cores (the policy: actors/runtime/cpus.py)."""
    c = cfg.cluster
    return cpus.generator_cpu_share(pipelined=cfg.loop.overlapped, cpu_split=c.cpu_split,
                                    on_gpu=bool(c.generator.num_gpus))


def autoscale_settings(cfg: RunConfig, section: str = "reward_autoscale") -> AutoscaleSettings | None:
    """cluster.reward_autoscale (or cluster.env_autoscale) as the pool's policy settings (None: a fixed pool)."""
    a = getattr(cfg.cluster, section)
    return None if a is None else AutoscaleSettings(**a.model_dump())


def lora_kwargs(cfg: RunConfig) -> dict[str, Any] | None:
    """model.lora as PEFT LoraConfig keyword arguments (rayward's own fields left out), or None: full fine-tuning."""
    lora = cfg.model.lora
    return None if lora is None else lora.model_dump(exclude={"save_merged"})


def loss_config(cfg: RunConfig) -> LossConfig:
    """The learner's loss settings (grpo.*; the vLLM importance-sampling correction or None when it is off)."""
    g = cfg.grpo
    correction = None
    if g.vllm_importance_sampling_correction:
        correction = ImportanceSampling(
            mode=g.vllm_importance_sampling_mode,
            clip_max=g.vllm_importance_sampling_clip_max,
            clip_min=g.vllm_importance_sampling_clip_min,
        )
    return LossConfig(
        loss_type=g.loss_type,
        epsilon=g.epsilon,
        epsilon_high=g.epsilon_high,
        delta=g.delta,
        importance_sampling_level=g.importance_sampling_level,
        beta=g.beta,
        use_bias_correction_kl=g.use_bias_correction_kl,
        max_completion_length=cfg.generation.max_completion_length,
        vllm_importance_sampling=correction,
        temperature=cfg.generation.temperature,
        distill_coef=cfg.distillation.coef if cfg.distillation is not None else 0.0,
        distill_mode=cfg.distillation.mode if cfg.distillation is not None else "advantage",
    )


def learner_spec(cfg: RunConfig, model_path: str) -> LearnerSpec:
    """What every learner rank is built from (pure; unit-tested). Plain records of actors/learner's own types, so
    unpickling them in a learner process imports nothing of the driver."""
    g = cfg.grpo
    model = ModelSpec(
        name_or_path=model_path,
        dtype=cfg.model.dtype,
        trust_remote_code=cfg.model.trust_remote_code,
        gradient_checkpointing=g.gradient_checkpointing,
        gradient_checkpointing_kwargs=g.gradient_checkpointing_kwargs,
        lora=lora_kwargs(cfg),
        attn_implementation=cfg.model.attn_implementation,
        processor_kwargs=dict(cfg.model.processor_kwargs) or None,
    )
    optim = OptimSpec(
        optim=g.optim,
        learning_rate=g.learning_rate,
        weight_decay=g.weight_decay,
        adam_betas=(g.adam_beta1, g.adam_beta2),
        lr_scheduler_type=g.lr_scheduler_type,
        warmup_steps=g.warmup_steps,
        max_steps=g.max_steps,
        max_grad_norm=g.max_grad_norm,
    )
    step = StepSpec(
        micro_batch_size=g.per_device_train_batch_size,
        num_iterations=g.num_iterations,
        mask_truncated_completions=g.mask_truncated_completions,
        padding_free=g.padding_free,
        max_tokens_per_microbatch=g.max_tokens_per_microbatch,
        router_replay=g.router_replay,
        router_aux_loss_coef=g.router_aux_loss_coef,
    )
    return LearnerSpec(model=model, optim=optim, loss=loss_config(cfg), step=step, seed=cfg.seed)


def training_sampling(cfg: RunConfig) -> Sampling:
    """How the training batches are sampled (generation.*)."""
    g = cfg.generation
    return Sampling(n=g.num_generations, max_tokens=g.max_completion_length, temperature=g.temperature,
                    top_p=g.top_p, top_k=g.top_k)


def rollout_kind(agent: AgentSetup | None, vision: bool = False, prompt_column: str = "prompt",
                 teacher: bool = False) -> RolloutKind:
    """The run's RolloutKind, how its samples are made: one-turn completions (vision: with the prompts' images), or
    agentic rollouts when it has tools (the environments' rewards routed by class name; the pickled environments
    kept for reward functions that ask; prompts with images as their messages in the generators' prompt
    column). teacher: the reward batches carry the prompts' ids (the distillation teacher reads them)."""
    if agent is None:
        return OneTurn(vision=vision, prompt_ids=teacher)
    return Agentic(env_classes=agent.env_classes, keep_state=agent.keep_state, prompt_column=prompt_column,
                   prompt_ids=teacher)


def agent_kwargs(cfg: RunConfig, agent: AgentSetup, env_pool: EnvPoolGroup, prompt_column: str | None = None
                 ) -> dict[str, Any]:
    """The Generator's agentic arguments: the environment pool (its sessions, reached from the generator actor,
    never through the driver) and the rollouts' fixed settings (the tools per environment, the budgets, the
    rows' prompt column: default the training data's)."""
    from actors.agents.loop import AgentSettings
    from actors.envs.client import PoolEnvironments

    settings = AgentSettings(
        tools=agent.schemas,
        max_tool_tokens=cfg.agent.max_tool_tokens,
        trajectory_timeout_s=cfg.agent.trajectory_timeout_s,
        max_tool_calling_iterations=cfg.generation.max_tool_calling_iterations,
        keep_env_state=agent.keep_state,
        prompt_column=prompt_column or cfg.data.prompt_column,
        chat_template_kwargs=dict(cfg.generation.chat_template_kwargs),
        served_model=cfg.model.name_or_path if cfg.agent_function is not None else None,
    )
    return {"environments": PoolEnvironments(env_pool.handle), "agent": settings}


def engine_pool_kwargs(cfg: RunConfig, e: EnginesConfig, ns: str, max_model_len: int) -> dict[str, Any]:
    """An engine pool's arguments (a judge's, the teacher's) from its `engines` section."""
    from orchestrator.run.cluster import actor_options, run_sys_path

    a = e.autoscale
    return dict(
        num_engines=e.num_engines,
        # passive OpenMP waits on a CPU node, as the generators': an idle engine must not spin on shared cores
        engine_options=actor_options(e, namespace=ns, **cpus.shared_cores_env(e.num_gpus)),
        engine_kwargs=dict(dtype=e.dtype or cfg.model.dtype, max_model_len=max_model_len, kv_cache_gib=e.kv_cache_gib,
                           gpu_memory_utilization=e.gpu_memory_utilization, engine_kwargs=dict(e.engine_kwargs)),
        autoscale=None if a is None else AutoscaleSettings(**a.model_dump()),
        max_inflight=e.max_inflight,
        queue_timeout_s=e.queue_timeout_s or cfg.cluster.hang_timeout_s,
        call_grace_s=cfg.cluster.hang_timeout_s,
        sys_path=run_sys_path(),
    )


def overlapped_sync(cfg: RunConfig) -> bool:
    """Whether the learner sends weights in the background while its next step trains: the pipelined loop (the sync
    loop's generators wait for the weights anyway), the collective backend, one learner rank (FSDP ranks gather
    each bucket together, collectives that must not interleave with training's)."""
    return cfg.loop.overlapped and cfg.weight_sync.backend == "collective" and cfg.cluster.num_learners == 1


def learner_concurrency(cfg: RunConfig) -> dict[str, int] | None:
    """The learner actor's concurrency groups: one for `send_result` where sends overlap training."""
    return {SEND_GROUP: 1} if overlapped_sync(cfg) else None
