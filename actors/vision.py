"""Images in prompts, for vision-language models: what the driver, the generators and the learner share.

Token ids carry images the way the model reads them: each image's placeholder token (Qwen's `<|image_pad|>`)
repeated once per vision token of that image (`Images.expand`), as transformers' processors write them and as the
learner trains on them. vLLM takes a prompt with ONE placeholder per image and expands it itself (it expands an
already expanded one again), so the generator hands it `Images.collapse`d ids and checks that the ids the engine
ran are the expanded ones (the two processors agree on every image's size).

An image travels as a PIL image (RGB): from the dataset row to the generators once per prompt (vLLM's processor
makes its pixel values, cached by content), and to the learner once per sample list (Ray pickles an image that
several samples share once), where the model's own image processor makes the pixel values of each micro-batch.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The image input the learner casts to the model's dtype. What transformers' image processor returns goes to the
# forward as it comes, for the micro-batch's images together (Qwen2.5-VL, the family checked: pixel_values
# [patches, C * T * P * P] float and image_grid_thw [images, 3] int).
PIXEL_VALUES = "pixel_values"
# Added to the logits of the image and video placeholder tokens before sampling (vLLM's logit_bias, applied before
# temperature; its processed logprobs include it) and in the learner's log-softmax alike, so neither side samples
# or scores a placeholder as an answer token: a sampled one would make transformers look for an image there
# ("Image features and image tokens do not match"). -100 is the OpenAI API's floor for a bias; exp(-100) leaves no
# mass in float32 beside any logit a model produces.
PLACEHOLDER_BIAS = -100.0


def is_vision_model(model: str, trust_remote_code: bool = False) -> bool:
    """Whether the checkpoint is a vision-language model (its config has a `vision_config`, as every
    transformers VLM's has)."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code), "vision_config",
                   None) is not None


class ImageError(ValueError):
    """An image that cannot be used; the message names where it came from (row, column, tool)."""


def to_image(value: Any, where: str) -> Any:
    """An RGB PIL image from what datasets hold: a PIL image, encoded bytes, `{"bytes": ..., "path": ...}` (the
    `datasets` Image feature undecoded), or a file path. Decoded now (PIL opens lazily), so a broken file fails
    here, named by `where`."""
    from PIL import Image

    try:
        if isinstance(value, Image.Image):
            image = value
        elif isinstance(value, dict) and (value.get("bytes") or value.get("path")):
            image = Image.open(io.BytesIO(value["bytes"])) if value.get("bytes") else Image.open(value["path"])
        elif isinstance(value, (bytes, bytearray)):
            image = Image.open(io.BytesIO(value))
        elif isinstance(value, (str, Path)):
            image = Image.open(value)
        else:
            raise ImageError(f"{where}: not an image ({type(value).__name__}); give a PIL image, encoded bytes, "
                             "a {'bytes', 'path'} dict or a file path")
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")
    except ImageError:
        raise
    except Exception as err:  # noqa: BLE001 - PIL raises many kinds; the message names the image
        raise ImageError(f"{where}: cannot decode the image ({type(err).__name__}: {err})") from err


class Images:
    """A vision-language model's processor, as the driver, the generators and the learner use it.

    model: the checkpoint directory (its processor files); processor_kwargs: model.processor_kwargs (image sizes:
    the processor's own names, e.g. Qwen's min_pixels / max_pixels), passed to AutoProcessor and to vLLM alike."""

    def __init__(self, model: str, processor_kwargs: dict[str, Any] | None = None, trust_remote_code: bool = False):
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model, trust_remote_code=trust_remote_code,
                                                       **(processor_kwargs or {}))
        if getattr(self.processor, "image_processor", None) is None:
            raise ImageError(f"model {model!r}: its processor ({type(self.processor).__name__}) has no image "
                             "processor; a vision-language model's checkpoint has processor_config.json or "
                             "preprocessor_config.json")
        token = getattr(self.processor, "image_token", None)
        self.image_token_id: int = self.processor.tokenizer.convert_tokens_to_ids(token) if token else -1
        if self.image_token_id is None or self.image_token_id < 0:
            raise ImageError(f"model {model!r}: its processor names no image placeholder token (image_token)")
        tokenizer = self.processor.tokenizer
        video = getattr(self.processor, "video_token", None)
        self.placeholder_ids: list[int] = sorted({self.image_token_id, *(
            [tokenizer.convert_tokens_to_ids(video)] if video else [])})
        self.placeholder_bias: dict[int, float] = {t: PLACEHOLDER_BIAS for t in self.placeholder_ids}

    def counts(self, images: Sequence[Any]) -> list[int]:
        """Vision tokens of each image (what its placeholder expands to)."""
        sizes = [(im.height, im.width) for im in images]
        return list(self.processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens)

    def expand(self, ids: Sequence[int], images: Sequence[Any]) -> list[int]:
        """ids with one placeholder per image -> each placeholder repeated its image's vision tokens times."""
        counts, out, k = self.counts(images), [], 0
        for t in ids:
            if t == self.image_token_id:
                if k >= len(counts):
                    raise ImageError(f"the prompt has more image placeholders than its {len(counts)} image(s)")
                out.extend([t] * counts[k])
                k += 1
            else:
                out.append(t)
        if k != len(counts):
            raise ImageError(f"the prompt has {k} image placeholder(s) for {len(counts)} image(s): the chat template "
                             "dropped image parts, or the prompt's text holds placeholders of its own")
        return out

    def collapse(self, ids: Sequence[int], images: Sequence[Any]) -> list[int]:
        """The inverse of `expand`: each image's run of placeholders -> one placeholder (vLLM's input)."""
        counts, out, i, k = self.counts(images), [], 0, 0
        while i < len(ids):
            if ids[i] == self.image_token_id:
                if k >= len(counts) or list(ids[i : i + counts[k]]) != [self.image_token_id] * counts[k]:
                    raise ImageError("the ids' image placeholders do not match the images' vision tokens")
                out.append(self.image_token_id)
                i += counts[k]
                k += 1
            else:
                out.append(ids[i])
                i += 1
        if k != len(counts):
            raise ImageError(f"the ids hold {k} image(s) for {len(counts)} given")
        return out

    def engine_prompt(self, ids: Sequence[int], images: Sequence[Any]) -> dict[str, Any]:
        """vLLM's token prompt for ids holding these images (expanded placeholders): one placeholder per image and
        the images as its multi-modal data (vLLM expands each placeholder itself)."""
        return {"prompt_token_ids": self.collapse(ids, images), "multi_modal_data": {"image": list(images)}}

    def model_inputs(self, images: Sequence[Sequence[Any]]) -> dict[str, Any]:
        """The forward's image inputs for a micro-batch whose samples have these images (in row order):
        the image processor's output over all of them, concatenated (pixel_values [patches, ...],
        image_grid_thw [images, 3]); {} when no sample has an image."""
        flat = [im for sample in images for im in sample]
        if not flat:
            return {}
        out = self.processor.image_processor(images=flat, return_tensors="pt")
        return dict(out)
