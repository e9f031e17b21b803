"""The cheap checks, before Ray starts (`prepare` -> `Prepared`): reward functions import, the data loads, the model
and tokenizer load, the learner's options fit the architecture, judge templates name real columns, tools and
environments check out; the built-in models (the policy, judges, a teacher) are built last."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.engines.judge import SAMPLE_FIELDS, template_fields
from actors.engines.teacher import TeacherSpec
from actors.rewards.worker import (
    RewardSpec,
)
from actors.vision import ImageError, Images, is_vision_model
from orchestrator.config import (
    ConfigError,
    RewardConfig,
    RunConfig,
)
from orchestrator.data.curriculum import make_curriculum
from orchestrator.data.shards import PEEK_ROWS, StreamSource, peek, shards, stream_eval_prompts
from orchestrator.data.sources import (
    DataError,
    Prompt,
    PromptSource,
    PromptStream,
    agentic,
    eval_prompts,
    training_rows,
)
from orchestrator.run import checkpoints
from orchestrator.run.agents import AgentSetup, prepare_agent
from orchestrator.run.build.specs import (
    lora_kwargs,
    resolve_judges,
    resolve_model,
    reward_specs,
    teacher_spec,
)
from orchestrator.telemetry import trackers


def check_reward_columns(specs: list[RewardSpec], columns: list[str], where: str, field: str = "rewards") -> None:
    """Every column a reward function needs (RewardSpec.columns: its parameters without a default that TRL does not
    pass) is a dataset column; ConfigError naming the reward, the columns and the data's columns otherwise."""
    for s in specs:
        missing = [c for c in s.columns if c not in columns]
        if missing:
            raise ConfigError(f"{field}[{s.name}].function: {s.function} takes the dataset column(s) {missing} (its "
                              f"parameters without a default), which {where} lacks (its columns: {sorted(columns)})")


def check_judge_templates(rewards: list[RewardConfig], columns: list[str], field: str = "rewards") -> None:
    """Every field a judge's template names is a sample's (prompt, completion, conversation) or a dataset column."""
    for r in rewards:
        if r.judge is None:
            continue
        unknown = [f for f in template_fields(r.judge.template) if f not in SAMPLE_FIELDS and f not in columns]
        if unknown:
            raise ConfigError(f"{field}[{r.name}].judge.template: fields {unknown} are neither {list(SAMPLE_FIELDS)} "
                              f"nor dataset columns (the dataset has {columns})")


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
    from actors.learner.lora import LoraError, apply_lora
    from actors.learner.model import meta_model

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
    prompts: PromptStream | None  # the training prompt stream (None: an eval-only run)
    run_dir: Path
    eval_prompts: list[Prompt] | None = None  # the held-out prompts, tokenized (None: no eval block)
    eval_specs: list[RewardSpec] | None = None  # eval.rewards as specs (None: the training rewards score evals)
    agent: AgentSetup | None = None  # tools and environments (None: a one-turn run)
    rewards: list[RewardConfig] = field(default_factory=list)  # cfg.rewards + the environments' unnamed get_reward()s,
    # in `specs` order: what the aggregator weights and gates
    vision: bool = False  # a vision-language model: prompts carry images to the generators and the learner
    teacher: TeacherSpec | None = None  # on-policy distillation's teacher, its model resolved (None: none)
    train: bool = True  # False: `rayward eval` (no training data, learner or teacher; generators serve `policy`)
    policy: str | None = None  # the weights the generators start with: a checkpoint to evaluate, else model_path
    step: int = 0  # the optimizer step `policy` holds (an eval-only run's report)

    def __post_init__(self) -> None:
        self.policy = self.policy or self.model_path


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
    absent = trackers.missing(cfg.logging.report_to)  # `all` takes the installed ones
    if absent:
        sink, pkg = absent[0], trackers.PACKAGES[absent[0]]
        raise ConfigError(f"logging.report_to: {sink!r} needs the `{pkg}` package (pip install {pkg})")
    # the shards, read as drawn (orchestrator/data/shards.py)
    streamed = shards(cfg.data) if cfg.data.streaming else None
    rows = training_rows(cfg) if streamed is None else peek(streamed, PEEK_ROWS, cfg.data,
                                                            prompt_optional=agentic(cfg))
    check_judge_templates(cfg.rewards, sorted(rows[0]) if rows else [])
    if rows:
        check_reward_columns(specs, sorted(rows[0]), f"data.path {cfg.data.path!r}")
    model_path = resolve_model(cfg)
    tokenizer = load_tokenizer(cfg, model_path)
    images = load_images(cfg, model_path)
    check_learner_model(cfg, model_path)
    prompts: PromptStream = (
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


def prepare_evaluation(cfg: RunConfig, name: str, checkpoint: str | Path | None = None) -> Prepared:
    """`rayward eval`'s checks, the run's own in the same order (cfg has an eval block): the checkpoint is a
    model directory, the tokenizer and processor load, the held-out data and its rewards (the eval's own, else the
    training rewards) import, tools and environments check out on the held-out rows; no training data, learner or
    teacher. Only the scoring rewards' built-in judges are built."""
    assert cfg.eval is not None
    model_path = resolve_model(cfg)  # the tokenizer's, and the policy's when no checkpoint is given
    policy, step = model_path, 0
    if checkpoint is not None:
        ckpt = Path(checkpoint)
        if not (ckpt / "config.json").is_file():
            raise ConfigError(f"--checkpoint {str(checkpoint)!r}: not an HF model directory (no config.json)")
        policy, step = str(ckpt), checkpoints.saved_step(ckpt) or 0
    tokenizer = load_tokenizer(cfg, model_path)
    images = load_images(cfg, model_path)
    try:
        held_out, eval_specs = prepare_eval(cfg, tokenizer, images)
    except DataError as err:
        raise ConfigError(str(err)) from None
    assert held_out is not None
    specs = reward_specs(cfg.rewards, chat_template_kwargs=cfg.generation.chat_template_kwargs, seed=cfg.seed)
    dataset = [p.row for p in held_out]
    agent = prepare_agent(cfg, tokenizer, dataset, specs, dataset)  # tools: checked as a run checks them
    specs += agent.env_reward_specs if agent else []
    if eval_specs is None:
        specs = resolve_judges(specs)
    else:
        eval_specs = resolve_judges(eval_specs)
    return Prepared(cfg, name, model_path, specs, None, Path(cfg.logging.dir) / name, held_out, eval_specs, agent,
                    [*cfg.rewards, *(agent.env_rewards if agent else [])], vision=images is not None, train=False,
                    policy=policy, step=step)


# A data.path with one of these suffixes names a file (not a hub id): relative, it must be in the shipped directory.
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def check_submission(cfg: RunConfig, root: Path) -> list[str]:
    """What `rayward submit` checks on the laptop before anything is shipped (beyond the config itself): the reward
    functions import (one that needs a package only the cluster's image has is a note, not an error), a relative
    data file is inside the shipped directory `root` and loads, and the data has every column the rewards take.
    ConfigError for what would fail on the cluster; returns notes on what could not be checked here."""
    notes: list[str] = []
    try:
        specs = reward_specs(cfg.rewards, chat_template_kwargs=cfg.generation.chat_template_kwargs, seed=cfg.seed)
    except ConfigError as err:
        if "cannot import" not in str(err) and "package, which is not installed" not in str(err):
            raise
        notes.append(f"not checked here (the cluster's image may have it): {err}")
        specs = []
    data = cfg.data.path
    if data is not None and Path(data).is_absolute() and not Path(data).exists():
        return [*notes, f"data.path {data!r} is not on this machine (shared storage?): its columns are checked on the "
                        "cluster when the run starts"]
    if data is not None and data.endswith(DATA_FILE_SUFFIXES) and not Path(data).is_absolute():
        if not (root / data).exists():
            raise ConfigError(f"data.path {data!r}: no such file under {root}, the directory `rayward submit` ships "
                              "(make it, point data.path at it, or give an absolute path on the cluster's storage)")
    try:
        rows = training_rows(cfg) if not cfg.data.streaming else peek(shards(cfg.data), PEEK_ROWS, cfg.data)
    except DataError as err:
        raise ConfigError(str(err)) from None
    if rows:
        check_reward_columns(specs, sorted(rows[0]), f"data.path {data!r}")
    return notes
