"""The policy's inputs beyond token ids, and the distribution its log-probs are of: one part, chosen when the
learner is built (`model_inputs`), for text (`TextInputs`) or for a vision-language model (`VisionInputs`).

Both answer `with_images(rows, images)` (a micro-batch's rows, actors/learner/layout.py, with the forward's
other inputs) and `as_sampled(logits)` (the logits as the engines sample from them), and name their image
processor `vision` (actors/vision.py; None for text).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from torch import Tensor

from actors.learner.layout import Packed, Padded
from actors.learner.specs import ModelSpec
from actors.vision import PIXEL_VALUES, PLACEHOLDER_BIAS, Images

# The input from which transformers reads which positions hold images, in the families that take it.
TOKEN_TYPES = "mm_token_type_ids"


class TextInputs:
    """Text: token ids are the whole input; log-probs of the model's own distribution."""

    vision: Images | None = None

    def with_images(self, rows: Packed | Padded, images: list[tuple[Any, ...]] | None) -> Packed | Padded:
        return rows

    def as_sampled(self, logits: Tensor) -> Tensor:
        return logits


class VisionInputs:
    """A vision-language model: each micro-batch's pixel inputs from its images (the model's processor,
    actors/vision.py), and its image placeholders biased out of the distribution as the engines bias them."""

    def __init__(self, vision: Images, model: torch.nn.Module, device: torch.device, dtype: torch.dtype
                 ) -> None:
        """model: the transformers model (PEFT's base under LoRA), whose forward may take
        mm_token_type_ids."""
        self.vision, self.device, self.dtype = vision, device, dtype
        self.takes_token_types = TOKEN_TYPES in inspect.signature(model.forward).parameters
        self.placeholders = torch.tensor(vision.placeholder_ids, device=device)
        self.placeholder_bias = torch.tensor([PLACEHOLDER_BIAS] * len(vision.placeholder_ids), device=device)

    def with_images(self, rows: Packed | Padded, images: list[tuple[Any, ...]] | None) -> Padded:
        """Padded rows (packing is refused for these models: layout.packing_refusal) with their images' model
        inputs; positions left to the model (multimodal rotary positions need the images: transformers
        computes them from input_ids, the image grid and the attention mask, and marks which tokens are images
        with mm_token_type_ids [B, L] where the family takes it; without it Qwen2.5-VL silently falls back to
        text positions). images: each row's (none: no row has any)."""
        if not isinstance(rows, Padded):
            raise ValueError("a vision-language model's micro-batches are padded, not packed")
        inputs = self.vision.model_inputs(images or [() for _ in range(rows.shape[0])])
        extra = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        if PIXEL_VALUES in extra and extra[PIXEL_VALUES].is_floating_point():
            extra[PIXEL_VALUES] = extra[PIXEL_VALUES].to(self.dtype)
        if self.takes_token_types:
            extra[TOKEN_TYPES] = (rows.input_ids == self.vision.image_token_id).int()
        return dataclasses.replace(rows, position_ids=None, extra=extra)

    def as_sampled(self, logits: Tensor) -> Tensor:
        """[.., V] logits with PLACEHOLDER_BIAS on the placeholders (actors/vision.py), as vLLM's
        logit_bias."""
        return logits.index_add(-1, self.placeholders, self.placeholder_bias.expand(*logits.shape[:-1], -1))


def model_inputs(spec: ModelSpec, model: torch.nn.Module, device: torch.device, dtype: torch.dtype
                 ) -> TextInputs | VisionInputs:
    """The part for this model: a vision-language model's (its config has a vision_config), else text's.
    model: the transformers model (PEFT's base under LoRA)."""
    if getattr(model.config, "vision_config", None) is None:
        return TextInputs()
    vision = Images(spec.name_or_path, spec.processor_kwargs, spec.trust_remote_code)
    return VisionInputs(vision, model, device, dtype)
