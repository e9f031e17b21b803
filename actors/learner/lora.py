"""LoRA on the learner through PEFT: the adapters, the merged weights the generators receive, and the adapter
state in PEFT's format for checkpoints.

As TRL's GRPOTrainer does with a `peft_config`: `get_peft_model` wraps the policy and freezes the base, so the
optimizer holds the adapters only; the KL reference is the same model with its adapters disabled (no second
copy); the generators receive merged weights under the base model's HF names (PEFT's `base_model.model.` prefix
and `.base_layer` infix taken off, lora_A / lora_B not sent).

The merge differs from TRL's merge_adapter -> send -> unmerge in one way: it is done out of place, tensor by tensor
as each is sent (`actors.weights.sender.Source`: W + scaling * B @ A in float32, PEFT's delta of a LoRA Linear).
The base weights are never written, so they stay bit-exact over any number of syncs: an in-place unmerge
subtracts a rounded delta, which in bfloat16 moves the frozen base (and with it the KL reference) at every sync.
And FSDP shards need no in-place merge: each rank gathers the weight and its two small adapter matrices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from actors.weights.sender import Source

PEFT_PREFIX = "base_model.model."  # PeftModelForCausalLM.base_model (LoraModel).model (the HF model)
BASE_LAYER = ".base_layer"  # a LoRA layer keeps the layer it adapts under this name
ADAPTER = "default"  # the adapter's name: one adapter per learner
ADAPTER_FILE = "adapter_model.safetensors"  # PEFT's file names in a saved adapter directory
ADAPTER_CONFIG = "adapter_config.json"


class LoraError(ValueError):
    """LoRA settings this model cannot train with. The message starts with the LoraConfig argument at fault and
    its value (`target_modules ['x']: ...`), then says why and what the model has."""


def lora_config(settings: dict[str, Any]) -> Any:
    """PEFT's LoraConfig for a causal LM from LoraConfig keyword arguments (r, lora_alpha, target_modules, ...)."""
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", **settings)


# A vision-language model's vision side (tower and projector), under the names transformers' VLMs give it
# (Qwen-VL: model.visual, its merger inside; LLaVA-likes: vision_tower, multi_modal_projector; Idefics/SmolVLM:
# vision_model, connector): `all-linear` leaves it out, so LoRA adapts the language model by default.
VISION_MODULES = r".*\.(visual|vision_tower|vision_model|multi_modal_projector|connector)(\..*)?"


def vision_default(model: torch.nn.Module, settings: dict[str, Any]) -> dict[str, Any]:
    """settings, with PEFT's exclude_modules set to the vision side where the model is a vision-language model, the
    targets are `all-linear` and the user named no exclusions of their own."""
    if (getattr(model.config, "vision_config", None) is None or settings.get("target_modules") != "all-linear"
            or settings.get("exclude_modules") is not None):
        return settings
    return {**settings, "exclude_modules": VISION_MODULES}


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct (last-part) names of the model's linear layers, for error messages."""
    return sorted({name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def apply_lora(model: torch.nn.Module, settings: dict[str, Any]) -> Any:
    """Wrap an HF causal LM in fresh LoRA adapters (PEFT's `get_peft_model`); only the adapters (and, with
    `bias`, those biases) require grad. Raises LoraError for target modules that match no layer, and for
    targets rayward cannot merge into the generators' weights: non-linear layers, and the output head (whose
    weight may be tied to the embeddings; TRL refuses it too). Works on a meta-device model (a cheap check)."""
    from peft import get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.error import NoMatchingPeftModuleError

    kind = type(model).__name__
    head = model.get_output_embeddings()
    linears = linear_names(model)
    try:
        peft_model = get_peft_model(model, lora_config(vision_default(model, settings)))
    except NoMatchingPeftModuleError as err:
        raise LoraError(
            f"target_modules {settings.get('target_modules')!r}: match no layer of {kind} ({err}); its linear "
            f"layers are {linears}, or use all-linear"
        ) from None
    layers = {name.removeprefix(PEFT_PREFIX): m for name, m in peft_model.named_modules()
              if isinstance(m, BaseTunerLayer)}
    bad = [
        f"{name} ({type(m.get_base_layer()).__name__})"
        for name, m in layers.items()
        if not isinstance(m, LoraLinear) or m.get_base_layer() is head
    ]
    if bad:
        raise LoraError(
            f"target_modules {settings.get('target_modules')!r}: adapt {bad}, but rayward trains LoRA on linear "
            f"layers other than the output head (its linear layers: {linears})"
        )
    if any(m.lora_magnitude_vector for m in layers.values()):  # the sender merges W + scaling * B @ A only
        raise LoraError("use_dora True: DoRA is not supported, rayward merges plain LoRA adapters "
                        "(W + scaling * B @ A)")
    return peft_model


def hf_name(key: str) -> str:
    """A PEFT model's state_dict key -> the base model's HF name (what vLLM loads), as TRL maps it."""
    return key.removeprefix(PEFT_PREFIX).replace(BASE_LAYER, "")


def merged_view(model: Any, tied: dict[str, str]) -> dict[str, Source]:
    """HF name -> Source of every tensor the generators load from a LoRA learner: each base weight (tied aliases
    dropped, `tied` in HF names), with its adapter merged in where it has one; the adapters themselves are not
    sent."""
    from peft.tuners.lora import Linear as LoraLinear

    layers = {f"{name}{BASE_LAYER}.weight": m for name, m in model.named_modules() if isinstance(m, LoraLinear)}
    prefix = f".{model.base_model.prefix}"  # ".lora_": lora_A, lora_B (TRL skips names containing it)
    view = {}
    for key in model.state_dict():
        name = hf_name(key)
        if prefix in key or name in tied:
            continue
        m = layers.get(key)
        if m is None:
            view[name] = Source(key)
        else:
            module = key.removesuffix(f"{BASE_LAYER}.weight")
            view[name] = Source(
                key, lora_a=f"{module}.lora_A.{ADAPTER}.weight", lora_b=f"{module}.lora_B.{ADAPTER}.weight",
                scaling=float(m.scaling[ADAPTER]), fan_in_fan_out=bool(m.fan_in_fan_out),
            )
    return view


def adapter_keys(model: Any) -> dict[str, str]:
    """{key in PEFT's saved adapter file: key in the model's state_dict} for the adapter state PEFT saves
    (`get_peft_model_state_dict`: lora_A / lora_B, and trained biases). PEFT drops the adapter name from keys."""
    from peft import get_peft_model_state_dict

    state = model.state_dict()
    by_saved = {k.replace(f".{ADAPTER}", ""): k for k in state}
    return {saved: by_saved[saved] for saved in get_peft_model_state_dict(model, state_dict=state)}


def save_adapter(model: Any, path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write the adapter in PEFT's format (adapter_config.json + adapter_model.safetensors) from its full
    tensors keyed as in the model's state_dict (`adapter_keys` values)."""
    model.save_pretrained(str(path), state_dict=state)


def load_adapter_file(path: Path) -> dict[str, torch.Tensor]:
    """A saved adapter's tensors, keyed as PEFT saved them."""
    from safetensors.torch import load_file

    file = path / ADAPTER_FILE
    if not file.exists():
        raise FileNotFoundError(
            f"{path} holds no {ADAPTER_FILE}: it was not written by a LoRA learner (model.lora), "
            "so it cannot resume one"
        )
    return load_file(str(file))
