"""The form of a generator's prompts, a part chosen once when the generator starts, from its model.

    TokenPrompts   a text model: token ids, run as they are
    ImagePrompts   a vision-language model (actors/vision.py): ids that hold each image as its placeholder
                   repeated once per vision token (as the driver's processor writes them and the learner
                   trains on them); the engine gets vLLM's token prompt with one placeholder per image, and
                   expands it itself

The interface of both: `engine_kwargs` (what the engine is built with), `engine_prompts` (what the engine
loop submits for prompts and their images), `checked` (a finished request, once its prompt is known to have
run as the driver made it), `logit_bias` (every sampling's), `after_weight_load` (what the engine must forget
once its weights change) and `vision` (the processor agentic prompts expand their images with; None: a text
model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.vision import ImageError, Images, is_vision_model

# Per prompt, the images its ids' (expanded) placeholders stand for; None: no prompt has any.
PromptImages = list[tuple[Any, ...]] | None


class TokenPrompts:
    """A text model's prompts: token ids, without images."""

    engine_kwargs: Mapping[str, Any] = {}
    logit_bias: dict[int, float] | None = None
    vision: Images | None = None

    def __init__(self, model: str) -> None:
        self.model = model

    def engine_prompts(self, prompt_token_ids: list[list[int]], images: PromptImages) -> list[Any]:
        if images and any(images):
            raise ImageError(f"generator {self.model!r}: prompts with images for a model without an image "
                             "processor")
        return prompt_token_ids

    def checked(self, out: Any, prompt_ids: list[int]) -> Any:
        """As it is: the engine runs token ids as given."""
        return out

    def after_weight_load(self, engine: Any) -> None:
        """Nothing: beside its KV cache (the generator resets it) a text model's engine keeps nothing that the
        weights computed."""


class ImagePrompts:
    """A vision-language model's prompts: token ids whose expanded placeholders stand for images."""

    def __init__(self, model: str, processor_kwargs: dict[str, Any] | None = None) -> None:
        """processor_kwargs: the model's processor settings (model.processor_kwargs), for vLLM's processor and
        this one (which maps the driver's expanded image placeholders to vLLM's)."""
        self.model = model
        self.vision: Images = Images(model, processor_kwargs)
        # Sampling never draws an image placeholder (actors/vision.py PLACEHOLDER_BIAS).
        self.logit_bias: dict[int, float] | None = self.vision.placeholder_bias
        # Videos are not taken, so vLLM does not reserve room for them.
        self.engine_kwargs: Mapping[str, Any] = {
            "limit_mm_per_prompt": {"video": 0},
            **({"mm_processor_kwargs": dict(processor_kwargs)} if processor_kwargs else {}),
        }

    def engine_prompts(self, prompt_token_ids: list[list[int]], images: PromptImages) -> list[Any]:
        """The ids as they are, or (with images) vLLM's token prompt with one placeholder per image and the
        images as its multi-modal data."""
        if not images:
            return prompt_token_ids
        return [self.vision.engine_prompt(ids, ims) if ims else ids
                for ids, ims in zip(prompt_token_ids, images, strict=True)]

    def checked(self, out: Any, prompt_ids: list[int]) -> Any:
        """A finished request whose prompt the engine ran as given: vLLM expanded every image into as many
        tokens as the driver's processor did, so the learner trains on what the engine saw."""
        ran = out.prompt_token_ids
        if ran is not None and len(ran) != len(prompt_ids):
            raise ImageError(
                f"generator {self.model!r}: vLLM ran a prompt of {len(ran)} tokens where the driver's "
                f"processor made {len(prompt_ids)}: the two expand an image into different numbers of vision "
                "tokens. Give the processor's image sizes in model.processor_kwargs (both sides read them)")
        return out

    def after_weight_load(self, engine: Any) -> None:
        """vLLM keeps images' vision-tower outputs by image hash across requests: the old weights' would stand
        in for the new ones' (vLLM: "call this when model weights are updated"). engine: the LLMEngine."""
        engine.reset_encoder_cache()


def prompt_part(model: str, processor_kwargs: dict[str, Any] | None = None) -> TokenPrompts | ImagePrompts:
    """The generator's prompts part: ImagePrompts for a vision-language model, else TokenPrompts."""
    return ImagePrompts(model, processor_kwargs) if is_vision_model(model) else TokenPrompts(model)


__all__ = ["ImagePrompts", "PromptImages", "TokenPrompts", "prompt_part"]
