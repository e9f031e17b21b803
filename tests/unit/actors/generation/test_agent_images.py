"""Tools that return images (TRL's multimodal tool responses) in the agent loop, on the scripted engine
(tests/fixtures/engines.py) and in-process environments, with a real tokenizer carrying TRL's Qwen3-VL chat template
and a processor stand-in whose images expand to width / 14 vision tokens (the real Images.expand / collapse on it):
the ids hold each image's placeholders expanded (out of the loss), the engine gets one placeholder per image with the
images, the record keeps every image in order (the prompt's, then the tools'), budgets count vision tokens, and what
cannot reach the model (a text model, a template that drops tool images, a broken image) is an error it reads."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from PIL import Image

from actors.agents import chat
from actors.agents.loop import AgentLoop, AgentSettings, TurnSettings
from actors.envs.worker import tool_content
from actors.payloads import group_out, keep, resolve_training
from actors.types import Sample, TrainBatch, Trajectory
from actors.vision import ImageError, Images
from orchestrator.data.sources import Prompt, to_rollouts
from tests.fixtures.engines import by_turn, scripted_loop, turn_params
from tests.fixtures.envs import WAIT_S, LocalEnvironments, tool_schemas

RED = Image.new("RGB", (56, 56), (220, 30, 30))  # 4 vision tokens
WIDE = Image.new("RGB", (112, 56), (30, 60, 220))  # 8
PATCH = 14  # the stand-in's pixels per vision token along the width
ANSWER = "c<|im_end|>"


class PictureEnv:
    """Tools that return TRL's content blocks."""

    def reset(self, **row: Any) -> None:
        return None

    def look(self) -> list[dict[str, Any]]:
        """Look at the card.

        Returns:
            The picture.
        """
        return [{"type": "image", "image": RED}, {"type": "text", "text": "The card."}]

    def look_png(self) -> list[dict[str, Any]]:
        """Look at the card, encoded.

        Returns:
            The picture.
        """
        buf = io.BytesIO()
        WIDE.save(buf, format="PNG")
        return [{"type": "text", "text": "Wide:"}, {"type": "image", "image": buf.getvalue()}]

    def look_broken(self) -> list[dict[str, Any]]:
        """Look at a broken picture.

        Returns:
            Bytes that are no image.
        """
        return [{"type": "image", "image": b"not a png"}]

    def look_long(self, words: int) -> list[dict[str, Any]]:
        """Look at the card, with a long caption.

        Args:
            words: How long the caption is.
        """
        return [{"type": "image", "image": RED}, {"type": "text", "text": " word" * words}]


SCHEMAS = tool_schemas(PictureEnv)


class StandIn(Images):
    """Images without a processor: an image expands to width / PATCH vision tokens."""

    def __init__(self, image_token_id: int) -> None:
        self.image_token_id = image_token_id

    def counts(self, images: Any) -> list[int]:
        return [im.width // PATCH for im in images]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The tiny tool VLM's tokenizer (orchestrator/builtin/models/vlm.py): TRL's qwen3_vl.jinja, Qwen's vision
    tokens."""
    from transformers import AutoTokenizer

    from orchestrator.builtin.models.vlm import _tool_tokenizer

    out = tmp_path_factory.mktemp("vlm-tool-tokenizer")
    _tool_tokenizer(out)
    (out / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return chat.prepare_tokenizer(AutoTokenizer.from_pretrained(out))


@pytest.fixture(scope="module")
def vision(tokenizer):
    return StandIn(tokenizer.convert_tokens_to_ids("<|image_pad|>"))


@pytest.fixture
def envs():
    e = LocalEnvironments({None: PictureEnv})
    yield e
    e.shutdown()


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


def rollout(tokenizer: Any, envs: Any, replies: list[str], rows: list[dict[str, Any]], *, vision: Any,
            max_tool_tokens: int = 200, tool_images_problem: str | None = None) -> tuple[list[Sample], Any]:
    loop, engine = scripted_loop(by_turn(tokenizer, replies))
    try:
        agent = AgentSettings(tools={None: SCHEMAS}, max_tool_tokens=max_tool_tokens, trajectory_timeout_s=WAIT_S)
        turns = TurnSettings(n=1, max_tokens=200, max_model_len=2048, params=turn_params)
        agent_loop = AgentLoop(loop, envs, tokenizer, agent, turns, vision=vision,
                               tool_images_problem=tool_images_problem)
        out = {g: samples for piece in agent_loop.run(rows, list(range(len(rows)))) for g, samples in piece}
        return [out[g][0] for g in range(len(rows))], engine
    finally:
        loop.close(WAIT_S)


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def row(content: Any = "What colour is the card?") -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": content}]}


def pixels(images: Any) -> list[bytes]:
    return [im.tobytes() for im in images]


def test_a_tool_image_joins_the_ids_expanded_and_the_engine_input_collapsed(tokenizer, vision, envs) -> None:
    (s,), engine = rollout(tokenizer, envs, [call("look"), ANSWER], [row()], vision=vision)
    t = s.trajectory
    assert (t.stop_reason, t.turns, t.tool_failures) == ("stop", 2, 0)
    tool = {"role": "tool", "name": "look", "content": [{"type": "image", "image": RED},
                                                         {"type": "text", "text": "The card."}]}
    rendered = chat.tool_suffix_ids(tokenizer, [tool])
    assert rendered.count(vision.image_token_id) == 1  # the template writes one placeholder per image
    suffix = vision.expand(rendered, [RED])
    assert suffix.count(vision.image_token_id) == RED.width // PATCH
    first = ids(tokenizer, call("look"))
    assert s.completion_ids == first + suffix + ids(tokenizer, ANSWER)
    assert t.turn_ids == [0] * len(first) + [-1] * len(suffix) + [1] * len(ids(tokenizer, ANSWER))  # out of the loss
    assert pixels(t.images) == pixels([RED]) and t.messages[1]["content"][0]["type"] == "image"
    assert t.tool_tokens == len(suffix) and t.template_match is True
    # The engine: the first turn's ids as they are; the second turn's with one placeholder per image, and the image.
    (_, p0, _, _), (_, p1, _, _) = engine.added
    assert engine.images[0] is None and p0 == t.prompt_ids
    assert pixels(engine.images[1]) == pixels([RED])
    assert p1 == vision.collapse(t.prompt_ids + first + suffix, [RED])
    assert chat.check_sample(tokenizer, s, SCHEMAS, vision.collapse).match
    with pytest.raises(ValueError, match="needs `collapse`"):
        chat.check_sample(tokenizer, s, SCHEMAS)


def test_a_prompts_images_come_first_and_each_tool_image_follows_in_order(tokenizer, vision, envs) -> None:
    prompt = [{"type": "image", "image": WIDE}, {"type": "text", "text": "Which card is this one's colour?"}]
    (s,), engine = rollout(tokenizer, envs, [call("look"), call("look_png"), ANSWER], [row(prompt)], vision=vision)
    t = s.trajectory
    assert pixels(t.images) == pixels([WIDE, RED, WIDE])  # the prompt's, then each tool's, the PNG decoded
    placeholders = (t.prompt_ids + s.completion_ids).count(vision.image_token_id)
    assert placeholders == sum(im.width // PATCH for im in (WIDE, RED, WIDE))
    assert t.prompt_ids.count(vision.image_token_id) == WIDE.width // PATCH
    assert [len(im) for im in engine.images] == [1, 2, 3] and t.template_match is True
    for (_, prompt_ids, _, _), images in zip(engine.added, engine.images, strict=True):
        assert prompt_ids.count(vision.image_token_id) == len(images)  # collapsed: one each


def test_an_image_the_model_cannot_see_is_an_error_it_reads(tokenizer, vision, envs) -> None:
    # A text model.
    (s,), engine = rollout(tokenizer, envs, [call("look"), ANSWER], [row()], vision=None)
    t = s.trajectory
    assert t.tool_failures == 1 and t.images == () and all(im is None for im in engine.images)
    assert "Tool look returned an image, and this model reads no images" in t.messages[1]["content"]
    # A template that drops images in tool messages (TRL's Qwen2.5 text template writes the list as text).
    from orchestrator.builtin.models.tools import chat_template as qwen25_template

    text_template = chat.tool_images_problem(tokenizer, vision.image_token_id)
    assert text_template is None
    saved = tokenizer.chat_template
    tokenizer.chat_template = qwen25_template()
    try:
        problem = chat.tool_images_problem(tokenizer, vision.image_token_id)
    finally:
        tokenizer.chat_template = saved
    assert problem is not None and "0 image placeholders" in problem
    (s,), _ = rollout(tokenizer, envs, [call("look"), ANSWER], [row()], vision=vision, tool_images_problem=problem)
    assert s.trajectory.tool_failures == 1 and problem in s.trajectory.messages[1]["content"]
    # An image that cannot be decoded: named by the tool and the block.
    (s,), _ = rollout(tokenizer, envs, [call("look_broken"), ANSWER], [row()], vision=vision)
    assert s.trajectory.tool_failures == 1 and "tool look_broken result block 0: cannot decode" in \
        s.trajectory.messages[1]["content"]


def test_the_tool_token_budget_counts_vision_tokens_cuts_text_and_never_an_image(tokenizer, vision, envs) -> None:
    (s,), _ = rollout(tokenizer, envs, [call("look_long", words=500), ANSWER], [row()], vision=vision,
                      max_tool_tokens=60)
    t = s.trajectory
    assert t.truncated_tool_results == 1 and t.tool_tokens <= 60 and pixels(t.images) == pixels([RED])
    image, text = t.messages[1]["content"]
    assert image["type"] == "image" and text["text"].endswith(chat.TRUNCATION_MARK)
    # Too small for the scaffold and the image's 4 vision tokens: the trajectory ends `length`, nothing cut inside
    # an image.
    (s,), _ = rollout(tokenizer, envs, [call("look"), ANSWER], [row()], vision=vision, max_tool_tokens=12)
    assert s.trajectory.stop_reason == "length" and s.trajectory.images == ()


def test_tool_content_keeps_trls_blocks_and_strs_the_rest(tmp_path) -> None:
    path = tmp_path / "red.png"
    RED.save(path)
    blocks = tool_content([{"type": "text", "text": 3}, {"type": "image", "image": str(path)}], "look")
    assert blocks[0] == {"type": "text", "text": "3"} and pixels([blocks[1]["image"]]) == pixels([RED])
    assert tool_content("plain", "t") == "plain" and tool_content(42, "t") == "42"
    assert tool_content([1, 2], "t") == "[1, 2]" and tool_content([], "t") == "[]"
    assert tool_content([{"type": "audio"}], "t") == "[{'type': 'audio'}]"  # not TRL's blocks: as any value
    with pytest.raises(ImageError, match=r"tool look result block 1: not an image \(int\)"):
        tool_content([{"type": "text", "text": "x"}, {"type": "image", "image": 5}], "look")


def test_a_trajectorys_images_reach_the_rollouts_per_sample() -> None:
    def sample(images: tuple) -> Sample:
        t = Trajectory(prompt_ids=[1], prompt=row()["prompt"], messages=[], turn_ids=[0], stop_reason="stop",
                       images=images)
        return Sample([5], [-0.1], "c", "stop", [0], t)

    def train_batch(groups: list[list[Sample]]) -> TrainBatch:
        """The groups as the learner reads them: generated, held by reference, fetched."""
        outs = [group_out(i, g, keep) for i, g in enumerate(groups)]
        r = to_rollouts(prompts, outs, 0, prompt_column="prompt", group_size=2)
        return resolve_training(TrainBatch([], [], [], [0.0] * 4, r.truncated, payloads=r.payloads, group_size=2))

    prompts = [Prompt(row(), [1], 0), Prompt(row(), [1], 1)]
    assert train_batch([[sample((RED,)), sample(())], [sample(()), sample(())]]).images == [(RED,), (), (), ()]
    assert train_batch([[sample(()), sample(())], [sample(()), sample(())]]).images is None
