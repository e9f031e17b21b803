"""Building a run: check everything cheap first (`prepare`), then start the actor groups the loop drives
(`start_groups`), then assemble the run from them (`assemble_run`; the loop tests assemble theirs from fakes
of the groups, tests/fixtures/fakes.py, with the same function). `build_run` is the last two.

Every choice (how many generators, where reward workers go, which loss, the selector, the evaluator) is made
here, when the run is built; the loop only calls phases on it.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from actors import user_code
from actors.engines.judge import SAMPLE_FIELDS, JudgeSpec, template_fields
from actors.engines.teacher import TeacherSpec
from actors.envs.spec import EnvSpec
from actors.learner.loss import ImportanceSampling, LossConfig
from actors.learner.specs import LearnerSpec, ModelSpec, OptimSpec, StepSpec
from actors.rewards.builtin import BUILTIN_REWARDS, builtin_target
from actors.rewards.worker import (
    LazyGate,
    RewardFunctionError,
    RewardSpec,
    declares_environments,
    load_reward_function,
)
from actors.runtime import cpus
from actors.runtime.autoscale import AutoscaleSettings
from actors.runtime.cpus import Share
from actors.runtime.group import (
    HEALTH_GROUP,
    PLACEMENT_TIMEOUT_S,
    SEND_GROUP,
    EnvPoolGroup,
    GeneratorGroup,
    JudgePoolGroup,
    LearnerGroup,
    RewardPoolGroup,
    TeacherPoolGroup,
)
from actors.types import Rollouts, Sampling, Scores, TrainerState
from actors.vision import ImageError, Images, is_vision_model
from actors.weights.transfer import WeightTransfer
from orchestrator.algo.aggregation import RewardAggregator, weighted_totals
from orchestrator.algo.selection import Refill, Selection, Selector, dynamic_sampling, keep_all
from orchestrator.config import (
    TINY_JUDGE_MODEL,
    TINY_MODEL,
    TINY_MOE_MODELS,
    TINY_TEACHER_MODEL,
    TINY_TOOL_VLM_MODEL,
    TINY_TOOLS_MODEL,
    TINY_VLM_MODEL,
    ConfigError,
    EnginesConfig,
    RewardConfig,
    RunConfig,
)
from orchestrator.data.curriculum import make_curriculum
from orchestrator.data.shards import PEEK_ROWS, StreamSource, peek, shards, stream_eval_prompts
from orchestrator.data.sources import Prompt, PromptSource, agentic, eval_prompts, training_rows
from orchestrator.eval.evaluator import BlockingEval, EvalSet, NoEval, OverlappedEval
from orchestrator.eval.metrics import Best, EvalSchedule
from orchestrator.loop.rollout import Agentic, OneTurn, Sampler
from orchestrator.run.agents import AgentSetup, env_reward_spec, prepare_agent
from orchestrator.run.checkpoints import BestCheckpoint
from orchestrator.run.groups import EnvPoolView, Generators, Learner, RewardScorer
from orchestrator.run.state import Evaluator, FaultLog, Run
from orchestrator.telemetry.metrics import MetricsLogger
from orchestrator.telemetry.progress import Display
from orchestrator.telemetry.tool_calls import ToolCallWatch

# A judge's context when its engines section gives none: a rubric prompt and a short answer fit.
JUDGE_MAX_MODEL_LEN = 1024
# An eval-only reward pool (eval.rewards set) scores a few hundred completions every few steps: one worker.
EVAL_REWARD_WORKERS = 1


def resolve_model(cfg: RunConfig) -> str:
    """The policy's directory: the built-in tiny models built into the cache on first use, else the path as given."""
    return resolve_path(cfg.model.name_or_path)


def resolve_path(name: str) -> str:
    """A model field's directory (the policy's, a judge's, a teacher's): a built-in tiny model's, built into the
    cache on first use, else the path as given."""
    if name == TINY_JUDGE_MODEL:
        from orchestrator.builtin.models.judge import ensure_tiny_judge

        return str(ensure_tiny_judge())
    if name == TINY_TEACHER_MODEL:
        from orchestrator.builtin.models.teacher import ensure_tiny_teacher

        return str(ensure_tiny_teacher())
    if name == TINY_MODEL:
        from orchestrator.builtin.models.tiny import ensure_tiny_model

        return str(ensure_tiny_model())
    if name == TINY_TOOLS_MODEL:
        from orchestrator.builtin.models.tools import ensure_tiny_tool_model

        return str(ensure_tiny_tool_model())
    if name == TINY_VLM_MODEL:
        from orchestrator.builtin.models.vlm import ensure_tiny_vlm

        return str(ensure_tiny_vlm())
    if name == TINY_TOOL_VLM_MODEL:
        from orchestrator.builtin.models.vlm import ensure_tiny_tool_vlm

        return str(ensure_tiny_tool_vlm())
    if name in TINY_MOE_MODELS:
        from orchestrator.builtin.models.moe import ensure_tiny_moe

        family, near_ties = TINY_MOE_MODELS[name]
        return str(ensure_tiny_moe(family, near_ties=near_ties))
    return name


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
        template_fields(j.template)  # well-formed; the dataset's columns are checked in `check_judge_templates`
    except ValueError as err:
        raise ConfigError(f"{field}[{r.name}].judge.template: {err}") from None
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


def check_judge_templates(rewards: list[RewardConfig], columns: list[str], field: str = "rewards") -> None:
    """Every field a judge's template names is a sample's (prompt, completion, conversation) or a dataset column."""
    for r in rewards:
        if r.judge is None:
            continue
        unknown = [f for f in template_fields(r.judge.template) if f not in SAMPLE_FIELDS and f not in columns]
        if unknown:
            raise ConfigError(f"{field}[{r.name}].judge.template: fields {unknown} are neither {list(SAMPLE_FIELDS)} "
                              f"nor dataset columns (the dataset has {columns})")


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
            spec = replace(spec, takes_environments=declares_environments(loaded))
        specs.append(spec)
    return specs


def generator_cpu_share(cfg: RunConfig) -> Share | None:
    """The generators' share of a CPU node's cores (the policy: actors/runtime/cpus.py)."""
    c = cfg.cluster
    return cpus.generator_cpu_share(pipelined=cfg.loop.mode == "pipelined", cpu_split=c.cpu_split,
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


def check_learner_model(cfg: RunConfig, model_path: str) -> None:
    """The learner's model options against the model's architecture, built on the meta device (no weights): gradient
    checkpointing support and its keyword arguments, the attention implementation, packed micro-batches where they
    are asked for (grpo.padding_free true), and LoRA target modules PEFT can match and rayward can merge."""
    import inspect

    g = cfg.grpo
    if g.gradient_checkpointing_kwargs:
        from torch.utils.checkpoint import checkpoint

        known = set(inspect.signature(checkpoint).parameters) - {"function", "args", "kwargs"}
        unknown = sorted(set(g.gradient_checkpointing_kwargs) - known)
        if unknown:
            raise ConfigError(
                f"grpo.gradient_checkpointing_kwargs: {unknown} are not arguments of torch.utils.checkpoint.checkpoint "
                f"(it takes {sorted(known)})"
            )
    if not (g.gradient_checkpointing or cfg.model.lora or g.padding_free or cfg.model.attn_implementation
            or g.router_replay or g.router_aux_loss_coef):
        return
    from actors.learner.layout import packing_refusal
    from actors.learner.learner import meta_model
    from actors.learner.lora import LoraError, apply_lora

    try:
        model = meta_model(model_path, cfg.model.trust_remote_code)
    except Exception as err:  # noqa: BLE001 - any failure to build the architecture is the model field's
        raise ConfigError(f"model.name_or_path {cfg.model.name_or_path!r}: cannot build the model ({err})") from None
    if cfg.model.attn_implementation is not None:
        try:
            model = meta_model(model_path, cfg.model.trust_remote_code, cfg.model.attn_implementation)
        except Exception as err:  # noqa: BLE001 - the architecture built without it: the attention is at fault
            raise ConfigError(f"model.attn_implementation {cfg.model.attn_implementation!r}: {err}") from None
    why = packing_refusal(model) if g.padding_free else None
    if why is not None:
        raise ConfigError(f"grpo.padding_free: {why}; set grpo.padding_free=false (padded micro-batches)")
    if g.gradient_checkpointing and not model.supports_gradient_checkpointing:
        raise ConfigError(
            f"grpo.gradient_checkpointing: {type(model).__name__} does not support gradient checkpointing "
            "(transformers' supports_gradient_checkpointing is False); set grpo.gradient_checkpointing=false"
        )
    check_moe(cfg, model)
    if cfg.model.lora is not None:
        try:
            apply_lora(model, lora_kwargs(cfg))
        except LoraError as err:
            raise ConfigError(f"model.lora.{err}") from None  # names the LoraConfig field at fault


def check_moe(cfg: RunConfig, model: Any) -> None:
    """grpo.router_replay and grpo.router_aux_loss_coef against the architecture (a meta-device model)."""
    from actors.learner.routing import Replay, find_routers

    g = cfg.grpo
    moe = bool(find_routers(model))
    if g.router_replay is not None:
        if not moe:
            raise ConfigError(f"grpo.router_replay: {type(model).__name__} is not a mixture of experts (no MoE "
                              "router found); set grpo.router_replay: null")
        try:
            Replay(model)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    text_config = model.config.get_text_config()
    if g.router_aux_loss_coef and not hasattr(text_config, "output_router_logits"):
        raise ConfigError(f"grpo.router_aux_loss_coef: {type(model).__name__} is not a mixture-of-experts model that "
                          "returns its router logits, so there is no auxiliary loss to weight (TRL refuses it too)")


@dataclass
class Prepared:
    """Everything checked and loaded before Ray starts."""

    cfg: RunConfig
    name: str
    model_path: str
    specs: list[RewardSpec]
    prompts: PromptSource
    run_dir: Path
    eval_prompts: list[Prompt] | None = None  # the held-out prompts, tokenized (None: no eval block)
    eval_specs: list[RewardSpec] | None = None  # eval.rewards as specs (None: the training rewards score evals)
    agent: AgentSetup | None = None  # tools and environments (None: a one-turn run)
    rewards: list[RewardConfig] = field(default_factory=list)  # cfg.rewards + the environments' unnamed get_reward()s,
    # in `specs` order: what the aggregator weights and gates
    vision: bool = False  # a vision-language model: prompts carry images to the generators and the learner
    teacher: TeacherSpec | None = None  # on-policy distillation's teacher, its model resolved (None: none)


def load_tokenizer(cfg: RunConfig, model_path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as err:  # noqa: BLE001
        raise ConfigError(f"model.name_or_path {cfg.model.name_or_path!r}: cannot load tokenizer ({err})") from None


def load_images(cfg: RunConfig, model_path: str) -> Images | None:
    """A vision-language model's processor (its images' sizes and placeholder token; model.processor_kwargs
    applied); None for a text-only model."""
    try:
        if not is_vision_model(model_path, cfg.model.trust_remote_code):
            if cfg.model.processor_kwargs:
                raise ConfigError(f"model.processor_kwargs: {cfg.model.name_or_path!r} is not a vision-language "
                                  "model (its config has no vision_config)")
            return None
        return Images(model_path, cfg.model.processor_kwargs, cfg.model.trust_remote_code)
    except ImageError as err:
        raise ConfigError(f"model.name_or_path: {err}") from None


def prepare_eval(cfg: RunConfig, tokenizer: Any, images: Images | None = None
                 ) -> tuple[list[Prompt] | None, list[RewardSpec] | None]:
    """The eval block's checks: its rewards import, its dataset has the prompt column (and decodable images). (None,
    None) without one."""
    if cfg.eval is None:
        return None, None
    kw = cfg.generation.chat_template_kwargs
    specs = reward_specs(cfg.eval.rewards, "eval.rewards", kw, cfg.seed) if cfg.eval.rewards is not None else None
    try:
        read = stream_eval_prompts if cfg.eval.data.streaming else functools.partial(eval_prompts, seed=cfg.seed)
        held_out = read(cfg.eval.data, tokenizer, max_samples=cfg.eval.max_samples, prompt_optional=agentic(cfg),
                        template_kwargs=cfg.generation.chat_template_kwargs, images=images)
    except ImageError as err:
        raise ConfigError(str(err)) from None
    if cfg.eval.rewards is not None and held_out:
        check_judge_templates(cfg.eval.rewards, sorted(held_out[0].row), "eval.rewards")
    return held_out, specs


def prepare(cfg: RunConfig, name: str) -> Prepared:
    """The cheap checks, in order: reward functions import, the training data loads (before the tokenizer, whose
    import alone takes seconds), model and tokenizer load, the learner's model options fit the architecture,
    datasets have prompts, tools and environments (schemas, template, routing column)."""
    specs = reward_specs(cfg.rewards, chat_template_kwargs=cfg.generation.chat_template_kwargs, seed=cfg.seed)
    for sink, module in (("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow")):
        if sink in cfg.logging.report_to and importlib.util.find_spec(module) is None:
            raise ConfigError(f"logging.report_to: {sink!r} needs the `{module}` package (pip install {module})")
    streamed = shards(cfg.data) if cfg.data.streaming else None  # the shards, read as drawn (orchestrator/data/shards.py)
    rows = training_rows(cfg) if streamed is None else peek(streamed, PEEK_ROWS, cfg.data,
                                                            prompt_optional=agentic(cfg))
    check_judge_templates(cfg.rewards, sorted(rows[0]) if rows else [])
    model_path = resolve_model(cfg)
    tokenizer = load_tokenizer(cfg, model_path)
    images = load_images(cfg, model_path)
    check_learner_model(cfg, model_path)
    prompts: PromptSource | StreamSource = (
        PromptSource(rows, tokenizer, cfg.data, seed=cfg.seed, template_kwargs=cfg.generation.chat_template_kwargs,
                     images=images, curriculum=make_curriculum(cfg.data, len(rows), cfg.seed))
        if streamed is None else
        StreamSource(streamed, tokenizer, cfg.data, seed=cfg.seed, template_kwargs=cfg.generation.chat_template_kwargs,
                     images=images, prompt_optional=agentic(cfg)))
    try:  # images decode, and the chat template keeps their parts
        prompts.encode.check(rows, "data")
    except ImageError as err:
        raise ConfigError(str(err)) from None
    held_out, eval_specs = prepare_eval(cfg, tokenizer, images)
    agent = prepare_agent(cfg, tokenizer, rows, specs, None if held_out is None else [p.row for p in held_out],
                          image_token_id=None if images is None else images.image_token_id)
    if agent is not None and cfg.eval is not None and cfg.eval.data.prompt_column != cfg.data.prompt_column:
        raise ConfigError(f"eval.data.prompt_column {cfg.eval.data.prompt_column!r}: with tools, evals read the "
                          f"training data's prompt column ({cfg.data.prompt_column!r}); rename the column")
    extra = agent.env_rewards if agent else []
    if cfg.distillation is not None and images is not None:
        raise ConfigError("distillation: the policy is a vision-language model, and the teacher reads token ids "
                          "only (not the images their placeholders stand for)")
    teacher = teacher_spec(cfg, tokenizer)
    # Built last: a built-in judge's build is the most expensive step before Ray, after every cheap check.
    return Prepared(cfg, name, model_path, resolve_judges(specs) + (agent.env_reward_specs if agent else []),
                    prompts, Path(cfg.logging.dir) / name, held_out, None if eval_specs is None else
                    resolve_judges(eval_specs), agent, [*cfg.rewards, *extra], vision=images is not None,
                    teacher=teacher)


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


def overlapped_sync(cfg: RunConfig) -> bool:
    """Whether the learner sends weights in the background while its next step trains: the pipelined loop (the sync
    loop's generators wait for the weights anyway), the collective backend, one learner rank (FSDP ranks gather
    each bucket together, collectives that must not interleave with training's)."""
    return cfg.loop.mode == "pipelined" and cfg.weight_sync.backend == "collective" and cfg.cluster.num_learners == 1


def learner_concurrency(cfg: RunConfig) -> dict[str, int] | None:
    """The learner actor's concurrency groups: one for `send_result` where sends overlap training."""
    return {SEND_GROUP: 1} if overlapped_sync(cfg) else None


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


def rollout_kind(agent: AgentSetup | None, vision: bool = False, prompt_column: str = "prompt",
                 teacher: bool = False) -> Sampler:
    """The run's Sampler, how its samples are made: one-turn completions (vision: with the prompts' images), or
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


def start_generators(cfg: RunConfig, name: str, model_path: str, *, agent: dict[str, Any] | None = None,
                     **engine: Any) -> GeneratorGroup:
    """The run's vLLM generators, `NAME/generator-i`, on `model_path` (engine: extra vLLM engine arguments;
    agent: `agent_kwargs` for a run with tools)."""
    from actors.generation.generator import GENERATOR_GROUPS, GENERATOR_METHOD_GROUPS, Generator
    from orchestrator.run.cluster import generator_options, namespace

    c, gen = cfg.cluster, cfg.generation
    return GeneratorGroup(
        Generator,
        c.num_generators,
        # weight loads beside generation, between engine steps; ping answers while a batch generates
        # (orchestrator/run/watchdog.py)
        concurrency_groups={**GENERATOR_GROUPS, HEALTH_GROUP: 1},
        method_groups=GENERATOR_METHOD_GROUPS,
        run_name=name,
        role="generator",
        options=generator_options(c.generator, gen.tensor_parallel_size, c.generator_max_restarts,
                                  namespace=namespace(name), **cpus.shared_cores_env(c.generator.num_gpus)),
        args=(model_path,),
        kwargs=dict(
            dtype=cfg.model.dtype,
            max_model_len=gen.max_model_len,
            kv_cache_gib=gen.kv_cache_gib,
            gpu_memory_utilization=gen.gpu_memory_utilization,
            tensor_parallel_size=gen.tensor_parallel_size,
            cpu_share=generator_cpu_share(cfg),
            extra_engine_kwargs=engine or None,
            record_routes=cfg.grpo.router_replay == "R3",
            processor_kwargs=dict(cfg.model.processor_kwargs) or None,
            **(agent or {}),
        ),
        per_actor_kwargs=[{"seed": cfg.seed + i} for i in range(c.num_generators)],
    )


def training_sampling(cfg: RunConfig) -> Sampling:
    """How the training batches are sampled (generation.*)."""
    g = cfg.generation
    return Sampling(n=g.num_generations, max_tokens=g.max_completion_length, temperature=g.temperature,
                    top_p=g.top_p, top_k=g.top_k)


def eval_set(cfg: RunConfig, prompts: list[Prompt], pool: RewardScorer,
             rewards: list[RewardConfig] | None = None, sampler: Sampler | None = None) -> EvalSet:
    """What every eval of the run generates and how it is scored (cfg.eval set): the training batches' sampling,
    with eval's num_generations, and its max_completion_length and temperature where given. rewards: the
    training rewards the pool scores (Prepared.rewards: with environment rewards; default cfg.rewards), used
    unless eval has its own. sampler: the run's (rollout_kind; default one-turn)."""
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
        sampler=sampler or OneTurn(),
    )


def evaluator(cfg: RunConfig, es: EvalSet | None, *, generators: Generators, learner: Learner,
              logger: MetricsLogger, prompts: PromptSource, run_dir: Path) -> Evaluator:
    """The run's held-out evaluator: none, blocking between steps (sync loop), or overlapped with training
    (pipelined loop); with grpo.save_best, keeping checkpoint-best."""
    if es is None:
        return NoEval()
    e, g = cfg.eval, cfg.grpo
    best = None
    if g.save_best is not None:
        best = BestCheckpoint(Best(g.save_best, g.save_best_mode), learner, run_dir, prompts.state)
    kind = OverlappedEval if cfg.loop.mode == "pipelined" else BlockingEval
    return kind(
        es, EvalSchedule(e.every_n_steps, e.at_start, g.max_steps), generators=generators, logger=logger,
        display=logger.display, prompts=prompts, best=best, log_completions=cfg.logging.log_completions,
    )


@dataclass
class Groups:
    """A run's actor groups: started (`start_groups`), or the loop tests' fakes of them."""

    generators: Generators
    learner: Learner
    reward_pool: RewardScorer
    weights: WeightTransfer  # the learner's weights into the generators
    eval_pool: RewardScorer | None = None  # eval.rewards' own pool
    env_pool: EnvPoolView | None = None  # a run with tools


def start_groups(p: Prepared) -> Groups:
    """Start the run's actor groups and form the weight transfer (Ray must be initialised)."""
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
    generators = start_generators(cfg, p.name, p.model_path, agent=agent)
    learner = start_learner(p, reward_pool)
    # The engines load while the learner does; the weight group's deadline (weight_sync.timeout_s) is for forming
    # the group, not for loading a model.
    generators.wait_started(PLACEMENT_TIMEOUT_S)
    return Groups(generators, learner, reward_pool, weight_transfer(cfg, learner, generators), eval_pool, env_pool)


def run_logger(p: Prepared, display: Display | None = None) -> MetricsLogger:
    """The run's metrics sinks and terminal (`display`: default step lines)."""
    cfg = p.cfg
    return MetricsLogger(
        p.run_dir, report_to=list(cfg.logging.report_to), progress=cfg.logging.progress,
        max_steps=cfg.grpo.max_steps, run_name=p.name, config=cfg.model_dump(mode="json"), display=display,
    )


def assemble_run(p: Prepared, groups: Groups, logger: MetricsLogger) -> Run:
    """The run from its groups: the choices made from the config (the sampling, the sampler, the selector,
    the aggregation, the evaluator) bound to them."""
    cfg, gen = p.cfg, p.cfg.generation
    aggregator = RewardAggregator(p.rewards)
    run = Run(
        cfg=cfg, name=p.name, run_dir=p.run_dir, prompts=p.prompts, generators=groups.generators,
        learner=groups.learner, reward_pool=groups.reward_pool, weights=groups.weights, evaluate=NoEval(),
        aggregator=aggregator, select=observed(selector(cfg, aggregator), p.prompts, aggregator),
        sampling=training_sampling(cfg),
        prompts_per_step=gen.generation_batch_size // gen.num_generations, logger=logger, display=logger.display,
        faults=FaultLog(p.run_dir, logger.display.message), eval_pool=groups.eval_pool,
        sampler=rollout_kind(p.agent, p.vision, p.cfg.data.prompt_column, teacher=p.teacher is not None),
        env_pool=groups.env_pool,
        tool_watch=ToolCallWatch(logger.display.message) if p.agent is not None else None,
    )
    run.evaluate = run_evaluator(run, p)
    return run


def build_run(p: Prepared, display: Display | None = None) -> Run:
    """Start the actor groups (Ray must be initialised) and assemble the run. `display` shows the steps (default:
    step lines)."""
    return assemble_run(p, start_groups(p), run_logger(p, display))


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


def run_evaluator(run: Run, p: Prepared) -> Evaluator:
    """The run's evaluator, bound to its current learner and generators. Its samples are made as the training
    batches' (the run's sampler) but carry no prompt ids: a distillation teacher scores training batches only."""
    sampler = rollout_kind(p.agent, p.vision, p.cfg.data.prompt_column)
    es = (eval_set(p.cfg, p.eval_prompts, run.eval_pool or run.reward_pool, p.rewards, sampler)
          if p.eval_prompts is not None else None)
    return evaluator(p.cfg, es, generators=run.generators, learner=run.learner, logger=run.logger,
                     prompts=run.prompts, run_dir=run.run_dir)


def rebuild_learner(run: Run, p: Prepared) -> None:
    """Recovery (orchestrator/run/supervisor.py): a new learner group in place of the lost one, wherever Ray finds room
    (saying what it waits for meanwhile), its weight-transfer group formed with the generators, and an evaluator
    bound to it. The run's state (weights, step, data) is the caller's to restore (checkpoints.rewind)."""
    run.learner.kill()  # what is left of it: live ranks of a broken group, its placement group
    say = lambda text: run.display.message(f"rayward: {text}")  # noqa: E731
    learner = start_learner(p, run.reward_pool, say)
    replace_learner(run, p, learner, weight_transfer(p.cfg, learner, run.generators))


def replace_learner(run: Run, p: Prepared, learner: Learner, weights: WeightTransfer) -> None:
    """A new learner group in the run (the tests' fakes too), with its weight transfer, and the evaluator bound to
    it."""
    run.learner, run.weights = learner, weights
    run.evaluate = run_evaluator(run, p)


def shutdown_run(run: Run) -> None:
    run.logger.close()
    for group in (run.generators, run.learner, run.reward_pool, run.eval_pool, run.env_pool):
        if group is not None:
            group.kill()
