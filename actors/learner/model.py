"""The policy and its KL reference as a learner rank holds them: loaded, made deterministic, checkpointed,
wrapped in LoRA adapters and sharded, in that order; and the view of its weights the engines load.

Gradient checkpointing (transformers' `gradient_checkpointing_enable`, TRL's default) recomputes each decoder
layer's activations in the backward pass: the same loss and gradients for less memory. LoRA (`ModelSpec.lora`,
PEFT's LoraConfig arguments; actors/learner/lora.py) trains adapters only: the optimizer holds them, the KL
reference is the policy with adapters disabled (no second copy), and the generators receive the merged
weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from actors.learner.distributed import shard, tied_names
from actors.learner.lora import apply_lora, merged_view
from actors.learner.specs import ModelSpec
from actors.weights.sender import Source, checkpoint_view, plain_view

# CPU learners: one torch thread per this many parameters, up to the cores the learner may use. A thread's
# share of a small model's matrices is too small to pay for the OpenMP barriers, which on a busy machine stall
# whenever one thread is descheduled, so a tiny model trains fastest on one thread; a model of a hundred
# million parameters and more has enough work per thread to gain from every core.
PARAMS_PER_THREAD = 20_000_000


def threads_for(num_params: int, cores: int) -> int:
    return max(1, min(cores, num_params // PARAMS_PER_THREAD))


def auto_class(config: Any) -> Any:
    """The transformers auto class that builds the policy with its output head: a vision-language model's
    (image-text-to-text: its vision tower, projector and language model), else a causal LM's."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision = getattr(config, "vision_config", None) is not None
    return AutoModelForImageTextToText if vision else AutoModelForCausalLM


def meta_model(
    model: str, trust_remote_code: bool = False, attn_implementation: str | None = None
) -> torch.nn.Module:
    """The model's architecture on the meta device (no weights, no memory): for checks before anything
    loads."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return auto_class(config).from_config(
            config, trust_remote_code=trust_remote_code, **_attn_kwargs(attn_implementation)
        )


def pad_token_id(config: Any) -> int:
    """The pad id (0 where the config names none); a vision-language model's is in its text config."""
    pad = getattr(config, "pad_token_id", None)
    if pad is None and hasattr(config, "get_text_config"):
        pad = getattr(config.get_text_config(), "pad_token_id", None)
    return pad or 0


def _attn_kwargs(attn_implementation: str | None) -> dict[str, str]:
    return {} if attn_implementation is None else {"attn_implementation": attn_implementation}


def enable_gradient_checkpointing(model: torch.nn.Module, kwargs: dict[str, Any] | None) -> None:
    """transformers' gradient checkpointing (every decoder layer recomputed in the backward pass), or a clear
    error for an architecture without it."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode for a no-grad forward of the policy: no (LoRA) dropout and no checkpointing, which only
    matters for a backward (reentrant checkpointing warns without inputs that require grad)."""
    model.eval()
    try:
        yield
    finally:
        model.train()


def base_model(model: torch.nn.Module, lora: bool) -> torch.nn.Module:
    """The transformers model inside the policy: PEFT's base model under LoRA, else the policy itself."""
    return model.get_base_model() if lora else model


def from_pretrained(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, sharded: bool
) -> torch.nn.Module:
    """The model's weights on this rank's device; FSDP: float32 masters on the CPU (fully_shard moves each
    rank's shard to its device, and computes in `dtype`)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(spec.name_or_path, trust_remote_code=spec.trust_remote_code)
    model = auto_class(config).from_pretrained(
        spec.name_or_path, dtype=torch.float32 if sharded else dtype,
        trust_remote_code=spec.trust_remote_code, **_attn_kwargs(spec.attn_implementation),
    )
    return model if sharded else model.to(device)


def load_policy(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, sharded: bool, cores: list[int]
) -> tuple[torch.nn.Module, dict[str, str]]:
    """The policy ready to train, and its tied names. The order matters: tied names are HF names, taken before
    any wrapping or sharding; dropout is turned off before LoRA adds its own (lora_dropout is the user's
    choice); checkpointing is on before PEFT wraps the model (PEFT then makes the embeddings' output require
    grad, which reentrant checkpointing needs when the base is frozen); sharding comes last. A CPU learner's
    torch threads follow the model's size (threads_for) over `cores`."""
    model = from_pretrained(spec, dtype, device, sharded)
    tied = tied_names(model)
    if device.type == "cpu":  # not Ray's OMP_NUM_THREADS=1 for a fractional num_cpus
        torch.set_num_threads(threads_for(sum(p.numel() for p in model.parameters()), len(cores)))
    model.train()
    for m in model.modules():  # GRPO ratios assume the same function at sampling and training time
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    if spec.gradient_checkpointing:
        enable_gradient_checkpointing(model, spec.gradient_checkpointing_kwargs)
    if spec.lora is not None:
        model = apply_lora(model, spec.lora)
    if sharded:
        shard(model, dtype, device)
    return model, tied


def load_reference(
    spec: ModelSpec, beta: float, dtype: torch.dtype, device: torch.device, sharded: bool
) -> torch.nn.Module | None:
    """The KL reference: a frozen copy of the initial policy next to it. None with beta = 0 (no KL term, as
    TRL) and with LoRA (the reference is the policy with its adapters disabled, as TRL)."""
    if beta == 0.0 or spec.lora is not None:
        return None
    ref = from_pretrained(spec, dtype, device, sharded).eval()
    ref.requires_grad_(False)
    if sharded:
        shard(ref, dtype, device)
    return ref


def engine_view(model: torch.nn.Module, tied: dict[str, str], lora: bool) -> dict[str, Source]:
    """What the engines load, tensor by tensor: the checkpoint's names and shapes (an MoE's experts one by
    one); under LoRA the base weights with the adapters merged in as each is sent (actors/learner/lora.py)."""
    view = merged_view(model, tied) if lora else plain_view(model, tied)
    return checkpoint_view(model, view, base_model(model, lora))
