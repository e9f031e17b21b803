"""The learner on a vision-language model (the tiny Qwen2.5-VL): the padded layout with images of several sizes
computes each sample as alone (multimodal rotary positions from each row's images and mask), the image placeholders
are biased out as the engines bias them, the vision tower trains, and packing is refused with the reason."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from actors.learner.learner import Learner
from actors.types import TrainBatch
from actors.vision import PLACEHOLDER_BIAS, Images
from orchestrator.builtin.tasks.colors import colors_dataset
from orchestrator.data.sources import PromptEncoder
from tests.fixtures.learner import spec

PADDING_TOL = 1e-5  # float32: a padded row against the same sample alone (left padding changes no real position)


@pytest.fixture(scope="module")
def prompts(tiny_vlm_path):
    from transformers import AutoTokenizer

    encode = PromptEncoder(AutoTokenizer.from_pretrained(tiny_vlm_path), "prompt", None, Images(tiny_vlm_path))
    rows = colors_dataset(4, seed=1)
    rows[2] = {**rows[2], "image": rows[2]["image"].resize((112, 84))}
    rows[3] = {**rows[3], "images": [Image.new("RGB", (56, 84), "blue"), rows[3]["image"]], "image": None}
    return [encode(r) for r in rows]


def test_padded_rows_with_images_of_several_sizes_equal_each_sample_alone(tiny_vlm_path, prompts, caplog):
    lr = Learner(spec(tiny_vlm_path))
    assert not lr.packed and "vision-language model" in caplog.text  # refused, and said why
    completions = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
    with torch.no_grad():
        rows = lr.layout([p.prompt_ids for p in prompts], completions, [p.images for p in prompts])
        together = lr._forward_logps(lr.model, rows, with_entropy=False)[0]
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            alone = lr._forward_logps(lr.model, lr.layout([p.prompt_ids], [c], [p.images]), with_entropy=False)[0]
            assert (together[i, : len(c)] - alone[0]).abs().max() <= PADDING_TOL
    assert len({len(p.prompt_ids) for p in prompts}) > 1  # the rows were padded


def test_placeholders_are_biased_out_as_the_engines_do_and_the_vision_tower_trains(tiny_vlm_path, prompts):
    lr = Learner(spec(tiny_vlm_path, learning_rate=1e-2))
    p = prompts[0]
    with torch.no_grad():
        rows = lr.layout([p.prompt_ids], [[5]], [p.images])
        biased = lr._forward_logps(lr.model, rows, with_entropy=False)[0][0, 0]
        raw = lr._forward_logps(lr.model, rows, with_entropy=False, sampled=False)[0][0, 0]
        logits = rows.logits(lr.model)[0][0, 0]  # the position that predicts the completion's first token
    # The engines sample from the logits with PLACEHOLDER_BIAS on the placeholders (vLLM's logit_bias): the learner's
    # log-prob of an ordinary token is the same renormalisation.
    want = torch.log_softmax(logits.index_add(0, torch.tensor(lr.vision.placeholder_ids),
                                              torch.full((len(lr.vision.placeholder_ids),), PLACEHOLDER_BIAS)), -1)[5]
    assert abs(biased - want) < 1e-5 and biased > raw
    vision = {n: w.detach().clone() for n, w in lr.model.named_parameters() if ".visual." in f".{n}"}
    assert vision
    batch = TrainBatch(prompt_ids=[q.prompt_ids for q in prompts], completion_ids=[[5, 6], [7], [8, 9], [10]],
                       sampling_logprobs=[[-1.0, -1.0], [-1.0], [-1.0, -1.0], [-1.0]],
                       advantages=[1.0, -1.0, 0.5, -0.5], truncated=[False] * 4, images=[q.images for q in prompts])
    result = lr.train_step(batch)
    assert torch.isfinite(torch.tensor(result.metrics["loss"]))
    moved = [n for n, w in lr.model.named_parameters() if n in vision and not torch.equal(w, vision[n])]
    assert len(moved) == len(vision)  # every vision-tower tensor trained


def test_lora_all_linear_adapts_the_language_model_and_named_modules_reach_the_vision_tower(tiny_vlm_path):
    """PEFT's `all-linear` would adapt the vision tower's linear layers too; on a VLM rayward's default leaves the
    vision side out (actors/learner/lora.py VISION_MODULES). Modules named by the user are adapted where they are:
    Qwen2.5-VL's vision attention is `qkv`."""
    lm = Learner(spec(tiny_vlm_path, lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}))
    trained = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    assert trained and not [n for n in trained if ".visual." in n]
    assert any("language_model" in n and "mlp" in n for n in trained)
    named = Learner(spec(tiny_vlm_path, lora={"r": 4, "lora_alpha": 8, "target_modules": ["qkv", "q_proj"]}))
    trained = [n for n, p in named.model.named_parameters() if p.requires_grad]
    assert any(".visual." in n for n in trained) and any("language_model" in n for n in trained)
