"""TRL's `GRPOConfig`, field by field, as a rayward run: what `rayward.GRPOTrainer`
(orchestrator/trl/trainer.py) does with each of the 189 fields of TRL 1.16's GRPOConfig (its own and
transformers' TrainingArguments').

Every field is in `FIELDS`, as one of
    Mapped(target)    its value (TRL's default included) becomes the rayward config field `target` (a path
                      such as grpo.learning_rate), as it is or through `convert`; fields that make one rayward
                      value together (max_steps and num_train_epochs) name the same target and convert
    Ignored(reason)   harmless here: it only concerns TRL's own process layout (devices, data loaders, DDP,
                      its vLLM server, the hub); one line says so when the script sets it
    Refused(instead)  rayward cannot honour it: a script that sets it (a value other than TRL's default)
                      fails before anything starts, with the field named and what to use instead
A field TRL adds later that is not in FIELDS is refused the same way when set, so none is dropped silently.
The Mapped entries are the one mapping: `run_tree` builds the config tree from them, `field_table` prints
them as docs/trl.md's table; tests check that FIELDS holds every GRPOConfig field and that every target is
a config field.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import ConfigError

# How much of the vLLM context rayward leaves for the prompt when the script gives no vllm_max_model_length:
# TRL has no context limit without vLLM, and rayward's generators need one (prompt + completion).
PROMPT_ROOM_TOKENS = 1024


class _Reader:
    """Reads GRPOConfig fields, recording which: the test checks every Mapped field is read."""

    read: set[str] = set()

    def __init__(self, args: Any):
        self.args = args

    def __call__(self, name: str) -> Any:
        _Reader.read.add(name)
        return _plain(getattr(self.args, name))


@dataclass(frozen=True)
class Shape:
    """What several fields make together (the run's length, one step's samples), computed and checked before
    the fields are mapped one by one; `read` reads any other field a conversion needs."""

    read: _Reader
    step_samples: int  # completions per optimizer step: per_device_train_batch_size x gradient_accumulation
    num_generations: int
    max_steps: int
    steps_per_epoch: int
    model_max_len: int | None  # the policy's context limit (max_position_embeddings); None: none known


@dataclass(frozen=True)
class Mapped:
    target: str  # the config path the value goes to: "section.field", "field", or "section" (merged into)
    how: str = ""  # in words, where the value does not pass as it is (docs/trl.md prints it)
    convert: Callable[[Any, Shape], Any] | None = None  # (the field's value, the run's Shape) -> the target's

    def text(self) -> str:
        return f"mapped: {self.target}" + (f" ({self.how})" if self.how else "")


@dataclass(frozen=True)
class Ignored:
    reason: str

    def text(self) -> str:
        return f"ignored: {self.reason}"


@dataclass(frozen=True)
class Refused:
    instead: str

    def text(self) -> str:
        return f"refused when set; instead: {self.instead}"


# --- conversions: a field's value (and the run's Shape) -> the rayward value --------------------------------

# Where TRL accepts several spellings of one choice.
_OPTIMS = {"adamw_torch": "adamw_torch", "adamw_torch_fused": "adamw_torch", "sgd": "sgd"}
_SCHEDULERS = {"linear": "linear", "cosine": "cosine", "constant": "constant",
               "constant_with_warmup": "constant"}
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "auto": None}
# rayward's tracker sinks by TRL's names (logging.report_to; jsonl, metrics.jsonl, is always on).
_TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
# report_to names the script did not write: transformers adds "kubeflow" itself inside a Kubeflow TrainJob.
_ADDED_BY_TRANSFORMERS = {"kubeflow"}


def _steps_or_fraction(value: float, max_steps: int) -> int:
    return int(value) if value >= 1 else math.ceil(value * max_steps)


def _run_steps(_: Any, s: Shape) -> int:
    return s.max_steps


def _step_samples(_: Any, s: Shape) -> int:
    return s.step_samples


def _parent(output_dir: str, _: Shape) -> str:
    return str(Path(output_dir).resolve().parent)


def _zero_if_unset(value: Any, _: Shape) -> Any:
    return value or 0


def _none_if_zero(value: Any, _: Shape) -> Any:
    return value or None


def _mapping(value: dict[str, Any] | None, _: Shape) -> dict[str, Any]:
    return dict(value or {})


def _negated(value: bool, _: Shape) -> bool:
    return not value


def _max_model_len(value: int | None, s: Shape) -> int:
    if value is not None:
        return value
    room = s.read("max_completion_length") + PROMPT_ROOM_TOKENS
    return room if s.model_max_len is None else min(room, s.model_max_len)


def _optim(value: str, _: Shape) -> str:
    if value not in _OPTIMS:
        raise ConfigError(f"GRPOConfig.optim={value!r}: rayward's learner has {sorted(set(_OPTIMS))}")
    return _OPTIMS[value]


def _scheduler(value: str, _: Shape) -> str:
    if value not in _SCHEDULERS:
        raise ConfigError(f"GRPOConfig.lr_scheduler_type={value!r}: rayward has {sorted(_SCHEDULERS)}")
    return _SCHEDULERS[value]


def _warmup(value: float, s: Shape) -> int:
    return _steps_or_fraction(value, s.max_steps) if value else 0


def _scale_rewards(value: Any, _: Shape) -> str:
    return {True: "group", False: "none"}.get(value, value) if isinstance(value, bool) else value


def _weights(value: list[float] | None, _: Shape) -> list[dict[str, float]] | None:
    return None if value is None else [{"weight": float(w)} for w in value]


def _save_every(_: Any, s: Shape) -> int:
    strategy = s.read("save_strategy")
    if strategy == "steps":
        return _steps_or_fraction(s.read("save_steps"), s.max_steps)
    if strategy == "no":
        return s.max_steps  # only the final checkpoint: trainer.save_model() copies its weights
    if strategy == "epoch":
        return s.steps_per_epoch
    raise ConfigError(f"GRPOConfig.save_strategy={strategy!r}: rayward saves by steps ('steps', 'epoch', "
                      "'no'); for the best eval use rayward=dict(grpo=dict(save_best='eval/reward'))")


def _eval_every(_: Any, s: Shape) -> int | None:
    every = s.read("eval_steps") or s.read("logging_steps")
    every = _steps_or_fraction(every, s.max_steps) if every else None
    return {"steps": every, "epoch": s.steps_per_epoch, "no": None}[s.read("eval_strategy")]


def _eval_generations(value: int | None, s: Shape) -> int:
    return value or s.num_generations


def _model_options(value: dict[str, Any] | None, _: Shape) -> dict[str, Any]:
    model: dict[str, Any] = {}
    for key, option in (value or {}).items():
        if key in ("dtype", "torch_dtype"):
            dtype = str(option).removeprefix("torch.")
            if dtype not in _DTYPES:
                raise ConfigError(f"GRPOConfig.model_init_kwargs[{key!r}]={dtype!r}: one of "
                                  f"{sorted(_DTYPES)}")
            if _DTYPES[dtype] is not None:
                model["dtype"] = _DTYPES[dtype]
        elif key == "attn_implementation":
            model["attn_implementation"] = option
        elif key != "trust_remote_code":
            raise ConfigError(f"GRPOConfig.model_init_kwargs[{key!r}]: rayward loads the model with dtype "
                              "and attn_implementation only")
    return model


def _report_to(value: list[str] | None, _: Shape) -> list[str]:
    """transformers has already turned "all" into the installed integrations (rayward's trackers among
    others such as codecarbon) and "none" into []: a list that is exactly the installed ones is "all", and
    becomes the installed trackers."""
    from transformers.integrations import get_available_reporting_integrations

    names = [n for n in (value or []) if n not in (None, "none", *_ADDED_BY_TRANSFORMERS)]
    if "all" in names:  # inside a list transformers leaves it as it is
        return ["jsonl", "all"]
    if names and set(names) == set(get_available_reporting_integrations()):
        return ["jsonl", *(n for n in names if n in _TRACKERS)]
    unknown = [n for n in names if n not in _TRACKERS]
    if unknown:
        raise ConfigError(f"GRPOConfig.report_to: {unknown} are not rayward sinks ({list(_TRACKERS)}, or "
                          "'all'; the metrics always go to <output_dir>/metrics.jsonl)")
    return ["jsonl", *names]


def _project(value: str, s: Shape) -> str | None:
    # transformers' default project (only its trackio integration reads it) is no choice of the script's: left
    # unset, rayward's default applies, and with it a tracker's own variable (WANDB_PROJECT, ...)
    default = next(f for f in dataclasses.fields(s.read.args) if f.name == "project")
    return None if value == field_default(default) else value


_LAYOUT = Ignored("TRL's process layout (devices, data loaders, distributed training); rayward's is the cluster")
_LOGGING = Ignored("how TRL prints and logs; rayward logs every step to <output_dir>/metrics.jsonl and its sinks")
_TRACKIO_HUB = Ignored("where trackio publishes on the Hugging Face Hub (Space, bucket); rayward's logging "
                       "has no such setting")
_HUB = Ignored("the hub; rayward does not push (push_to_hub is refused)")
_TRL_VLLM = Ignored("TRL's own vLLM setup; rayward always generates with vLLM in its generator actors")
_HF_GENERATE = Ignored("transformers' generate(), which rayward does not use (vLLM generates)")
_EVAL_LAYOUT = Ignored("how TRL's Trainer batches and gathers eval; rayward evaluates on its generators")
_DEFAULT_ONLY = "leave it at TRL's default (rayward has no such option yet)"
_FRACTION = "a value below 1 is a fraction of max_steps, as in transformers"

FIELDS: dict[str, Mapped | Ignored | Refused] = {
    # --- what the run trains ---------------------------------------------------------------------------------
    "output_dir": Mapped("logging.dir", "its parent; its last part names the run: the run directory is "
                         "output_dir itself", _parent),
    "max_steps": Mapped("grpo.max_steps", "-1: num_train_epochs x rows / prompts per step", _run_steps),
    "num_train_epochs": Mapped("grpo.max_steps", "where max_steps is -1: epochs x rows / prompts per step",
                               _run_steps),
    "per_device_train_batch_size": Mapped("grpo.per_device_train_batch_size", "completions per micro-batch"),
    "gradient_accumulation_steps": Mapped(
        "generation.generation_batch_size", "per_device_train_batch_size x gradient_accumulation_steps",
        _step_samples),
    "generation_batch_size": Mapped("generation.generation_batch_size",
                                    "must be one optimizer step's samples", _step_samples),
    "steps_per_generation": Mapped(
        "generation.generation_batch_size",
        "must equal gradient_accumulation_steps: one optimizer step per generation", _step_samples),
    "num_generations": Mapped("generation.num_generations"),
    "max_completion_length": Mapped("generation.max_completion_length"),
    "temperature": Mapped("generation.temperature"),
    "top_p": Mapped("generation.top_p"),
    "top_k": Mapped("generation.top_k", "None: 0, no limit", _zero_if_unset),
    "chat_template_kwargs": Mapped("generation.chat_template_kwargs", convert=_mapping),
    "max_tool_calling_iterations": Mapped("generation.max_tool_calling_iterations"),
    "vllm_max_model_length": Mapped(
        "generation.max_model_len",
        f"unset: max_completion_length + {PROMPT_ROOM_TOKENS}, within the model's limit", _max_model_len),
    "vllm_gpu_memory_utilization": Mapped("generation.gpu_memory_utilization"),
    "vllm_tensor_parallel_size": Mapped("generation.tensor_parallel_size"),
    "shuffle_dataset": Mapped("data.shuffle_dataset"),
    "seed": Mapped("seed"),
    "trust_remote_code": Mapped("model.trust_remote_code"),
    "model_init_kwargs": Mapped(
        "model", "dtype / torch_dtype: model.dtype; attn_implementation: model.attn_implementation; other "
        "keys refused", _model_options),
    # --- the optimizer ----------------------------------------------------------------------------------------
    "learning_rate": Mapped("grpo.learning_rate"),
    "lr_scheduler_type": Mapped(
        "grpo.lr_scheduler_type", "linear, cosine, constant; constant_with_warmup: constant", _scheduler),
    "warmup_steps": Mapped("grpo.warmup_steps", _FRACTION, _warmup),
    "optim": Mapped("grpo.optim", "adamw_torch and adamw_torch_fused: adamw_torch; sgd", _optim),
    "weight_decay": Mapped("grpo.weight_decay"),
    "adam_beta1": Mapped("grpo.adam_beta1"),
    "adam_beta2": Mapped("grpo.adam_beta2"),
    "max_grad_norm": Mapped("grpo.max_grad_norm", "0: no clipping", _none_if_zero),
    "gradient_checkpointing": Mapped("grpo.gradient_checkpointing"),
    "gradient_checkpointing_kwargs": Mapped("grpo.gradient_checkpointing_kwargs"),
    # --- the loss ---------------------------------------------------------------------------------------------
    "beta": Mapped("grpo.beta"),
    "router_aux_loss_coef": Mapped("grpo.router_aux_loss_coef"),
    "num_iterations": Mapped("grpo.num_iterations"),
    "epsilon": Mapped("grpo.epsilon"),
    "epsilon_high": Mapped("grpo.epsilon_high"),
    "delta": Mapped("grpo.delta"),
    "loss_type": Mapped("grpo.loss_type", "grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo"),
    "importance_sampling_level": Mapped("grpo.importance_sampling_level"),
    "scale_rewards": Mapped("grpo.scale_rewards", "true: group, false: none, as TRL reads them",
                            _scale_rewards),
    "multi_objective_aggregation": Mapped("grpo.multi_objective_aggregation"),
    "mask_truncated_completions": Mapped("grpo.mask_truncated_completions"),
    "use_bias_correction_kl": Mapped("grpo.use_bias_correction_kl"),
    "vllm_importance_sampling_correction": Mapped("grpo.vllm_importance_sampling_correction"),
    "vllm_importance_sampling_mode": Mapped("grpo.vllm_importance_sampling_mode"),
    "vllm_importance_sampling_clip_max": Mapped("grpo.vllm_importance_sampling_clip_max"),
    "vllm_importance_sampling_clip_min": Mapped("grpo.vllm_importance_sampling_clip_min"),
    "reward_weights": Mapped("rewards", "each reward's weight, in reward_funcs' order", _weights),
    # --- saving, eval, logging --------------------------------------------------------------------------------
    "save_strategy": Mapped(
        "grpo.save_steps",
        "steps: save_steps; epoch: the steps of one epoch; no: only the final checkpoint (for save_model)",
        _save_every),
    "save_steps": Mapped("grpo.save_steps", _FRACTION, _save_every),
    "eval_strategy": Mapped(
        "eval.every_n_steps", "steps: eval_steps; epoch: the steps of one epoch; no: none", _eval_every),
    "eval_steps": Mapped("eval.every_n_steps", "unset: logging_steps, as in transformers", _eval_every),
    "logging_steps": Mapped(
        "eval.every_n_steps", "where eval_steps is unset; rayward logs every step", _eval_every),
    "eval_on_start": Mapped("eval.at_start"),
    "num_generations_eval": Mapped("eval.num_generations", "unset: num_generations", _eval_generations),
    "report_to": Mapped(
        "logging.report_to",
        f"{', '.join(_TRACKERS)}; all: those installed; jsonl always; others refused", _report_to),
    "run_name": Mapped("logging.run_name", "the run's name in the trackers; unset: the run's name"),
    "project": Mapped(
        "logging.project", "TRL's default 'huggingface' is left unset: rayward's default, or a tracker's own "
        "variable such as WANDB_PROJECT", _project),
    "disable_tqdm": Mapped("logging.progress", "negated", _negated),
    "log_completions": Mapped("logging.log_completions"),
    # --- harmless here ----------------------------------------------------------------------------------------
    "use_cpu": _LAYOUT, "local_rank": _LAYOUT, "accelerator_config": _LAYOUT, "parallelism_config": _LAYOUT,
    "ddp_find_unused_parameters": _LAYOUT, "ddp_bucket_cap_mb": _LAYOUT, "ddp_broadcast_buffers": _LAYOUT,
    "ddp_static_graph": _LAYOUT, "ddp_backend": _LAYOUT, "ddp_timeout": _LAYOUT,
    "dataloader_drop_last": _LAYOUT, "dataloader_num_workers": _LAYOUT, "dataloader_pin_memory": _LAYOUT,
    "dataloader_persistent_workers": _LAYOUT, "dataloader_prefetch_factor": _LAYOUT,
    "dataloader_multiprocessing_context": _LAYOUT, "dataloader_in_order": _LAYOUT,
    "ds3_gather_for_generation": _LAYOUT, "average_tokens_across_devices": _LAYOUT,
    "torch_empty_cache_steps": _LAYOUT, "tf32": _LAYOUT, "skip_memory_metrics": _LAYOUT,
    "remove_unused_columns": Ignored("rayward passes every dataset column to the reward functions, as TRL does"),
    "label_names": _LAYOUT, "length_column_name": _LAYOUT, "train_sampling_strategy": _LAYOUT,
    "pad_to_multiple_of": Ignored("padding of TRL's batches; rayward's learner packs or pads its own"),
    "save_on_each_node": _LAYOUT, "save_only_model": Ignored("rayward checkpoints always hold what a resume needs"),
    "save_total_limit": Ignored("rayward keeps every checkpoint; delete old ones yourself"),
    "resume_from_checkpoint": Ignored("transformers does not read it either: pass train(resume_from_checkpoint=...)"),
    "ignore_data_skip": Ignored("a rayward resume restores the prompt stream's exact position"),
    "restore_callback_states_from_checkpoint": _LAYOUT,
    "full_determinism": Ignored("rayward seeds every sample by (seed, step, prompt); set seed"),
    "data_seed": Ignored("rayward orders the data with seed"),
    "use_vllm": _TRL_VLLM, "vllm_mode": _TRL_VLLM, "vllm_server_base_url": _TRL_VLLM, "vllm_server_host": _TRL_VLLM,
    "vllm_server_port": _TRL_VLLM, "vllm_server_timeout": _TRL_VLLM, "vllm_group_port": _TRL_VLLM,
    "vllm_enable_sleep_mode": _TRL_VLLM, "vllm_model_impl": _TRL_VLLM,
    "use_cache": _HF_GENERATE, "cache_implementation": _HF_GENERATE, "use_transformers_paged": _HF_GENERATE,
    "use_transformers_continuous_batching": _HF_GENERATE, "transformers_continuous_batching_config": _HF_GENERATE,
    "bf16": Ignored("mixed precision: rayward's learner trains in the model's dtype (model_init_kwargs dtype)"),
    "fp16": Ignored("mixed precision: rayward's learner trains in the model's dtype (model_init_kwargs dtype)"),
    "bf16_full_eval": _EVAL_LAYOUT, "fp16_full_eval": _EVAL_LAYOUT, "per_device_eval_batch_size": _EVAL_LAYOUT,
    "prediction_loss_only": _EVAL_LAYOUT, "eval_do_concat_batches": _EVAL_LAYOUT,
    "eval_use_gather_object": _EVAL_LAYOUT, "eval_accumulation_steps": _EVAL_LAYOUT,
    "include_for_metrics": _EVAL_LAYOUT, "batch_eval_metrics": _EVAL_LAYOUT,
    "logging_strategy": _LOGGING, "logging_first_step": _LOGGING, "logging_nan_inf_filter": _LOGGING,
    "log_on_each_node": _LOGGING, "log_level": _LOGGING, "log_level_replica": _LOGGING,
    "include_num_input_tokens_seen": _LOGGING, "num_completions_to_print": _LOGGING, "log_unique_prompts": _LOGGING,
    "log_multimodal": _LOGGING, "debug": _LOGGING, "trackio_space_id": _TRACKIO_HUB,
    "trackio_bucket_id": _TRACKIO_HUB, "trackio_static_space_id": _TRACKIO_HUB,
    "do_train": _LAYOUT, "do_eval": _LAYOUT, "do_predict": _LAYOUT,
    "hub_token": _HUB, "hub_private_repo": _HUB, "hub_model_id": _HUB, "hub_strategy": _HUB,
    "hub_always_push": _HUB, "hub_revision": _HUB,
    "ref_model_mixup_alpha": Ignored("used only with sync_ref_model, which is refused"),
    "ref_model_sync_steps": Ignored("used only with sync_ref_model, which is refused"),
    "entropy_coef_min": Ignored("used only with use_adaptive_entropy, which is refused"),
    "entropy_coef_max": Ignored("used only with use_adaptive_entropy, which is refused"),
    "entropy_coef_delta": Ignored("used only with use_adaptive_entropy, which is refused"),
    "entropy_target": Ignored("used only with use_adaptive_entropy, which is refused"),
    # --- refused when set ---------------------------------------------------------------------------------------
    "push_to_hub": Refused("push the model trainer.save_model() writes yourself (huggingface_hub's upload_folder)"),
    "log_completions_hub_repo": Refused("log_completions writes them to the run directory"),
    "fsdp": Refused("rayward=dict(cluster=dict(num_learners=N, learner_strategy='fsdp'))"),
    "fsdp_config": Refused("rayward=dict(cluster=dict(num_learners=N, learner_strategy='fsdp'))"),
    "deepspeed": Refused("rayward=dict(cluster=dict(num_learners=N, learner_strategy='fsdp'))"),
    "torch_compile": Refused(_DEFAULT_ONLY), "torch_compile_backend": Refused(_DEFAULT_ONLY),
    "torch_compile_mode": Refused(_DEFAULT_ONLY), "use_liger_kernel": Refused(_DEFAULT_ONLY),
    "liger_kernel_config": Refused(_DEFAULT_ONLY), "neftune_noise_alpha": Refused(_DEFAULT_ONLY),
    "label_smoothing_factor": Refused(_DEFAULT_ONLY), "auto_find_batch_size": Refused(_DEFAULT_ONLY),
    "enable_jit_checkpoint": Refused("rayward checkpoints at a SIGTERM on its own (docs/faults.md)"),
    "adam_epsilon": Refused(_DEFAULT_ONLY), "optim_args": Refused(_DEFAULT_ONLY),
    "optim_target_modules": Refused(_DEFAULT_ONLY), "lr_scheduler_kwargs": Refused(_DEFAULT_ONLY),
    "load_best_model_at_end": Refused("rayward=dict(grpo=dict(save_best='eval/reward')) keeps checkpoint-best"),
    "metric_for_best_model": Refused("rayward=dict(grpo=dict(save_best='eval/reward')) keeps checkpoint-best"),
    "greater_is_better": Refused("rayward=dict(grpo=dict(save_best_mode='max' or 'min'))"),
    "eval_delay": Refused("eval_on_start and eval_steps"),
    "disable_dropout": Refused(_DEFAULT_ONLY),
    "cast_lm_head_to_fp32": Refused(_DEFAULT_ONLY), "min_p": Refused("top_p or top_k"),
    "generation_kwargs": Refused("temperature, top_p, top_k and max_completion_length"),
    "repetition_penalty": Refused(_DEFAULT_ONLY),
    "vllm_structured_outputs_regex": Refused(_DEFAULT_ONLY),
    "sapo_temperature_neg": Refused(_DEFAULT_ONLY), "sapo_temperature_pos": Refused(_DEFAULT_ONLY),
    "vespo_k_pos": Refused(_DEFAULT_ONLY), "vespo_lambda_pos": Refused(_DEFAULT_ONLY),
    "vespo_k_neg": Refused(_DEFAULT_ONLY), "vespo_lambda_neg": Refused(_DEFAULT_ONLY),
    "sync_ref_model": Refused(_DEFAULT_ONLY), "top_entropy_quantile": Refused(_DEFAULT_ONLY),
    "entropy_coef": Refused(_DEFAULT_ONLY), "use_adaptive_entropy": Refused(_DEFAULT_ONLY),
    "off_policy_mask_threshold": Refused(_DEFAULT_ONLY),
    "vllm_importance_sampling_cap": Refused("vllm_importance_sampling_clip_max"),
}


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return _plain(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _plain(f.default_factory())
    return None


def reference(args: Any) -> Any:
    """The GRPOConfig a script that sets nothing gets on this machine (TRL's __post_init__ fills some fields from
    the hardware: bf16, accelerator_config, ...): what `args` is compared with. Field defaults where TRL refuses
    to build one."""
    try:
        return type(args)(output_dir=args.output_dir, use_cpu=args.use_cpu, bf16=args.bf16, fp16=args.fp16)
    except Exception:  # noqa: BLE001 - e.g. a newer TRL that validates differently: the dataclass defaults
        return None


def is_set(args: Any, name: str, ref: Any = None) -> bool:
    """Whether the script gave `name` a value other than the one it gets when unset (`reference`)."""
    if ref is not None:
        value, default = _plain(getattr(args, name)), _plain(getattr(ref, name))
    else:
        f = {x.name: x for x in dataclasses.fields(args)}[name]
        value, default = _plain(getattr(args, name)), field_default(f)
    if value == default:
        return False
    if isinstance(value, float) and isinstance(default, float) and math.isclose(value, default):
        return False
    return not (value in (None, [], {}, "") and default in (None, [], {}, ""))


def check_fields(args: Any) -> list[str]:
    """Refuse every Refused (or unknown) field the script set (ConfigError naming them all); the notes for the
    Ignored fields it set, one line each."""
    bad, notes = [], []
    ref = reference(args)
    if getattr(args, "bf16", False) or getattr(args, "fp16", False):
        notes.append("GRPOConfig.bf16/fp16: rayward's learner does not autocast; it trains in the model's dtype "
                     "(float32, or GRPOConfig.model_init_kwargs['dtype'])")
    for f in dataclasses.fields(args):
        kind = FIELDS.get(f.name)
        if isinstance(kind, Mapped) or f.name in ("bf16", "fp16", "use_cpu") or not is_set(args, f.name, ref):
            continue
        value = _plain(getattr(args, f.name))
        if isinstance(kind, Ignored):
            notes.append(f"GRPOConfig.{f.name}={value!r} ignored: {kind.reason}")
        elif isinstance(kind, Refused):
            bad.append(f"  GRPOConfig.{f.name}={value!r}: rayward cannot honour it; instead: {kind.instead}")
        else:
            bad.append(f"  GRPOConfig.{f.name}={value!r}: rayward does not know this field (newer TRL?); leave it "
                       "at its default")
    if bad:
        raise ConfigError("rayward.GRPOTrainer cannot run these GRPOConfig settings:\n" + "\n".join(bad))
    return notes


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    """`value` at `path` ("section.field", "field", or "section": a mapping merged into it) of the tree."""
    *sections, key = path.split(".")
    node = tree
    for section in sections:
        node = node.setdefault(section, {})
    if isinstance(value, dict) and isinstance(node.get(key), dict):
        node[key].update(value)
    elif key in node and node[key] != value:  # two fields of one target disagree: FIELDS is wrong, not args
        raise AssertionError(f"FIELDS: {path} gets both {node[key]!r} and {value!r}")
    else:
        node[key] = value


def _shape(a: _Reader, train_rows: int | None, model_max_len: int | None) -> Shape:
    bs, accum = a("per_device_train_batch_size"), a("gradient_accumulation_steps")
    gen_batch, spg = a("generation_batch_size"), a("steps_per_generation")
    step_samples = bs * accum
    if gen_batch != step_samples or spg != accum:
        raise ConfigError(
            f"GRPOConfig.generation_batch_size={gen_batch} (steps_per_generation={spg}) spans several "
            f"optimizer steps of per_device_train_batch_size x gradient_accumulation_steps = {step_samples}: "
            "rayward trains one optimizer step per generation batch (and overlaps the next one with "
            "loop.mode pipelined); leave generation_batch_size and steps_per_generation unset")
    g = a("num_generations")
    if step_samples % g:
        raise ConfigError(f"GRPOConfig.per_device_train_batch_size x gradient_accumulation_steps = "
                          f"{step_samples} must be a multiple of num_generations ({g})")
    prompts_per_step = step_samples // g
    steps_per_epoch = max(1, math.ceil((train_rows or prompts_per_step) / prompts_per_step))
    max_steps = _max_steps(a, train_rows, prompts_per_step)
    return Shape(a, step_samples, g, max_steps, steps_per_epoch, model_max_len)


def _max_steps(a: _Reader, train_rows: int | None, prompts_per_step: int) -> int:
    max_steps, epochs = a("max_steps"), a("num_train_epochs")
    if max_steps is not None and max_steps > 0:
        return max_steps
    if train_rows is None:
        raise ConfigError("GRPOConfig.max_steps: set it (the training data is an IterableDataset, or the run "
                          "has none, so num_train_epochs cannot size the run; TRL requires it too)")
    return max(1, math.ceil(epochs * math.ceil(train_rows / prompts_per_step)))


def run_tree(args: Any, *, train_rows: int | None, has_eval: bool, model_max_len: int | None
             ) -> dict[str, Any]:
    """The config tree (orchestrator/config/__init__.py's sections: generation, grpo, data, logging, model
    settings, seed, eval settings only with has_eval; `rewards`: the reward_weights as [{"weight": w}], or
    None) that `args` means, built from FIELDS' Mapped entries. train_rows: the training dataset's length
    (None: an IterableDataset, or none). ConfigError naming the GRPOConfig field that cannot be honoured."""
    a = _Reader(args)
    shape = _shape(a, train_rows, model_max_len)
    tree: dict[str, Any] = {}
    for name, kind in FIELDS.items():
        if isinstance(kind, Mapped):
            value = a(name)
            _put(tree, kind.target, value if kind.convert is None else kind.convert(value, shape))
    if not has_eval:
        strategy = a("eval_strategy")
        if tree.pop("eval")["at_start"] or strategy != "no":
            raise ConfigError(f"GRPOConfig.eval_strategy={strategy!r}: give eval_dataset too (TRL requires "
                              "it)")
    return tree


def field_table() -> str:
    """docs/trl.md's table: every GRPOConfig field, what rayward does with it."""
    import trl

    rows = ["| GRPOConfig field | TRL's default | in rayward |", "|---|---|---|"]
    for f in dataclasses.fields(trl.GRPOConfig):
        default = repr(field_default(f)).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{default}` | {FIELDS[f.name].text().replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"
