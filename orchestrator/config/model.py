"""`model:` the policy (a path, hub id or built-in tiny model), its dtype and LoRA adapters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, model_validator

from orchestrator.config.base import _Section


class LoraSettings(_Section):
    """LoRA adapters through PEFT, with the meanings of PEFT's `LoraConfig` (same names; `alpha` and `dropout`
    are accepted as short aliases of `lora_alpha` and `lora_dropout`)."""

    r: int = Field(8, ge=1)
    """LoRA rank (PEFT's `r`)."""
    lora_alpha: int = Field(8, ge=1, validation_alias=AliasChoices("lora_alpha", "alpha"))
    """Scale numerator (alias `alpha`): the adapter's update is scaled by lora_alpha / r (lora_alpha / sqrt(r)
    with use_rslora). PEFT's default, 8."""
    lora_dropout: float = Field(0.0, ge=0, lt=1, validation_alias=AliasChoices("lora_dropout", "dropout"))
    """Dropout on the adapter's input in the learner's training forwards (alias `dropout`). The generators
    sample from merged weights without it; 0 (PEFT's default) keeps sampling and training the same function."""
    target_modules: str | list[str] | None = "all-linear"
    """Layers that get an adapter, as PEFT matches them: a list of module names (or name suffixes, e.g.
    [q_proj, v_proj]), a regular expression matched against full module names, or `all-linear` (every linear
    layer except the output head). rayward's default is `all-linear`, not PEFT's (null: the architecture's
    default, q_proj and v_proj for Qwen2 and Llama): LoRA on the MLPs too is what keeps up with full fine-tuning
    in RL (Thinking Machines, "LoRA Without Regret", 2025), and what learns on the demo at the demo's learning
    rate, where q_proj and v_proj alone barely move the reward (bench/README.md, "LoRA on the demo"). Linear
    layers only; not the output head (as TRL)."""
    bias: Literal["none", "all", "lora_only"] = "none"
    """Which biases train with the adapter (PEFT's meaning). With `all` or `lora_only` the trained biases stay
    in place when adapters are disabled, so the KL reference is then not exactly the base model."""
    use_rslora: bool = False
    """Rank-stabilised LoRA: scale by lora_alpha / sqrt(r) instead of lora_alpha / r (PEFT's name)."""
    save_merged: bool = False
    """When the run finishes, also write `<logging.dir>/<run name>/merged`: the base model with the adapter merged
    in (the weights the generators run) and its tokenizer, a plain HF model directory for transformers or vLLM."""

    @model_validator(mode="before")
    @classmethod
    def _one_name_each(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, alias in (("lora_alpha", "alpha"), ("lora_dropout", "dropout")):
                if name in data and alias in data:
                    raise ValueError(f"give `{name}` or its alias `{alias}`, not both")
        return data


class ModelConfig(_Section):
    name_or_path: str = "tiny"
    """HF model directory or hub id of the policy. `tiny` builds rayward's offline tiny model (random
    Qwen2-style, head_dim 64) into the cache on first use; `tiny-tools` the same model warmed up to call the box
    task's tools (configs/tools.yaml); `tiny-moe` and `tiny-qwen2-moe` random mixtures of experts of its size
    (Qwen3-MoE, Qwen2-MoE: 8 experts, top-2; configs/moe.yaml), `tiny-moe-ties` a Qwen3-MoE whose routers are
    near ties (docs/moe.md); `tiny-vlm` a random Qwen2.5-VL vision-language model of its size
    (configs/vlm.yaml, docs/vision.md), `tiny-vlm-tools` one with Qwen3-VL's chat template warmed up to call the
    cards task's tool, which returns an image (configs/vlm-tools.yaml)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype in the learner and the generators. float32 on CPU (vLLM-CPU and the learner then agree in
    logprobs to rounding: the parity check after the first sync prints the gap); bfloat16 is the usual choice on
    GPUs."""
    trust_remote_code: bool = False
    """Passed to transformers and vLLM when loading the model and tokenizer."""
    attn_implementation: (
        Literal["sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"] | None
    ) = None
    """The learner's attention kernel (transformers' `attn_implementation`; the generators use vLLM's own). null:
    transformers' default for the model (sdpa where the model has it). flash_attention_2 / _3 need a GPU and the
    flash-attn package; packed micro-batches are then one row each, with no pad at all. flex_attention trains on
    GPUs only (torch has no backward for it on CPU)."""
    processor_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Vision-language models: keyword arguments of the model's processor, under the processor's own names, as a
    TRL script passes them to `AutoProcessor.from_pretrained` (Qwen-VL: `{min_pixels: 3136, max_pixels: 200704}`
    bounds each image's size and so its vision tokens). The learner's processor and the generators' (vLLM's
    `mm_processor_kwargs`) get the same, so both expand an image into the same tokens."""
    lora: LoraSettings | None = None
    """Train LoRA adapters (PEFT) instead of every weight: e.g. {r: 8, alpha: 16, target_modules: all-linear}.
    The optimizer holds the adapters only, the KL reference is the base with adapters disabled (no second
    copy), the generators receive the merged weights, checkpoints hold the adapter in PEFT's format. null: full
    fine-tuning."""
