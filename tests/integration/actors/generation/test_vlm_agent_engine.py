"""A tool that returns an image (TRL's multimodal tool responses) on the real engine and the real learner, no Ray:
the tiny tool VLM (orchestrator/builtin/models/vlm.py, TRL's Qwen3-VL chat template) plays the cards task
(orchestrator/builtin/tasks/cards.py: TRL's environment class, unchanged) through one in-process Generator, its
environments in this process behind the pool's protocol.

- token in, token out: the ids hold the card's picture as its vision tokens, out of the loss; they are the template's
  rendering of the conversation; TRL's own `_get_tool_suffix_ids` (with the model's processor) makes the same ids,
- the engine's logprobs of the whole trajectory, recomputed with its image, and the learner's, are the sampling
  logprobs of the model's tokens; another picture changes the answer's distribution (the image reaches the model).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

pytest.importorskip("vllm")

from actors.agents import chat  # noqa: E402
from actors.agents.loop import AgentSettings  # noqa: E402
from actors.generation.generator import Generator  # noqa: E402
from actors.types import Sampling  # noqa: E402
from orchestrator.builtin.tasks.cards import LOOK_TEXT, CardEnv, card_letter, cards_dataset  # noqa: E402
from orchestrator.builtin.tasks.letters import LETTERS  # noqa: E402
from tests.fixtures.envs import LocalEnvironments, tool_schemas  # noqa: E402
from tests.fixtures.learner import spec  # noqa: E402

WAIT_S = 120
TOOLS = tool_schemas(CardEnv)
LOGPROB_TOL = 1e-3  # the engine against itself, another batch shape (as test_agent_engine.py)
PARITY_TOL = 1e-4  # the learner against the engine, float32 (as test_vlm_engine.py)


@pytest.fixture(scope="module")
def gen(tiny_tool_vlm_path):
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    # As test_vlm_engine.py: the engine starts from no parallel groups (an earlier module's engine may have left its).
    destroy_model_parallel()
    destroy_distributed_environment()
    envs = LocalEnvironments({None: CardEnv}, tool_timeout_s=WAIT_S)
    agent = AgentSettings(tools={None: TOOLS}, max_tool_tokens=64, trajectory_timeout_s=WAIT_S,
                          max_tool_calling_iterations=2)
    g = Generator(tiny_tool_vlm_path, seed=0, max_model_len=768, kv_cache_gib=1.0, environments=envs, agent=agent)
    yield g
    g.close(WAIT_S)
    envs.shutdown()


def card(row: dict[str, Any]) -> Any:
    env = CardEnv()
    env.reset(**row)
    return env.picture


def test_a_tools_image_is_in_the_ids_the_engine_and_the_learner_score_alike(gen, tiny_tool_vlm_path) -> None:
    import torch

    from actors.learner.learner import Learner

    rows = cards_dataset(4, seed=5)
    groups = gen.rollout(rows, [r["seed"] for r in rows], Sampling(n=4, temperature=1.0, max_tokens=48))
    samples = [(r, s) for r, g in zip(rows, groups, strict=True) for s in g]
    looked = [(r, s) for r, s in samples if s.trajectory.images]
    assert len(looked) >= len(samples) - 1, "the warmed-up model calls `look` nearly always"
    image_token = gen.vision.image_token_id
    for r, s in looked:
        t = s.trajectory
        (picture,) = t.images
        assert picture.tobytes() == card(r).tobytes()  # the card of the row's seed: a group sees one card
        assert t.messages[1]["role"] == "tool" and t.messages[1]["content"][1]["text"] == LOOK_TEXT
        in_image = [m for tok, m in zip(s.completion_ids, t.mask, strict=True) if tok == image_token]
        assert len(in_image) == gen.vision.counts([picture])[0] and not any(in_image)  # out of the loss
        assert t.template_match and chat.check_sample(gen.tokenizer, s, TOOLS, gen.vision.collapse).match
    assert 0.0 <= sum(card_letter([s.trajectory.messages for _, s in samples], [r["letter"] for r, _ in samples])) \
        / len(samples) <= 1.0

    # The engine's logprobs of the whole trajectory, its image included, are the sampling logprobs.
    for _, s in looked[:4]:
        t = s.trajectory
        recomputed = gen.sequence_logprobs(t.prompt_ids + s.completion_ids, 1.0, t.images)[len(t.prompt_ids) - 1:]
        gaps = [abs(a - b) for a, b, m in zip(recomputed, s.logprobs, t.mask, strict=True) if m]
        assert max(gaps) <= LOGPROB_TOL
    # The learner scores the trajectory with its image as the engine sampled it (its multimodal positions: the image
    # sits in the completion, after the model's first turn).
    lr = Learner(spec(tiny_tool_vlm_path))
    with torch.no_grad():
        for _, s in looked[:4]:
            t = s.trajectory
            rows_ = lr.layout([t.prompt_ids], [s.completion_ids], [t.images])
            lp = lr._forward_logps(lr.model, rows_, with_entropy=False)[0][0].tolist()
            gaps = [abs(a - b) for a, b, m in zip(lp, s.logprobs, t.mask, strict=True) if m]
            assert max(gaps) <= PARITY_TOL, max(gaps)
            assert all(math.isnan(x) for x, m in zip(s.logprobs, t.mask, strict=True) if not m)
    # The picture reaches the model: a card of another colour changes the answer's log-prob (a black picture may
    # not: the warmed-up model can answer it as it answers the real card).
    r, s = looked[0]
    t = s.trajectory
    ids = t.prompt_ids + s.completion_ids
    other = (card({**r, "letter": next(x for x in LETTERS if x != r["letter"])}).resize(t.images[0].size),)
    a, b = gen.sequence_logprobs(ids, 1.0, t.images)[-2:], gen.sequence_logprobs(ids, 1.0, other)[-2:]
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) > 1e-3


def test_trls_own_tool_suffix_with_the_models_processor_is_rayways(gen, tiny_tool_vlm_path) -> None:
    """TRL's GRPOTrainer._get_tool_suffix_ids, run on the model's processor as TRL runs it for a VLM (its images
    expanded by the processor), makes the ids rayward appends after the model's call."""
    from transformers import AutoProcessor
    from trl import GRPOTrainer

    processor = AutoProcessor.from_pretrained(tiny_tool_vlm_path)
    row = cards_dataset(1, seed=9)[0]
    env = CardEnv()
    env.reset(**row)
    message = {"role": "tool", "name": "look", "content": env.look()}
    trainer = SimpleNamespace(_is_vlm=True, processing_class=processor, chat_template=None, chat_template_kwargs={},
                              _tokenizer=processor.tokenizer)
    theirs = GRPOTrainer._get_tool_suffix_ids(trainer, [message])
    ours = gen.vision.expand(chat.tool_suffix_ids(gen.tokenizer, [message]), [env.picture])
    assert list(theirs) == ours and ours.count(gen.vision.image_token_id) == gen.vision.counts([env.picture])[0]
