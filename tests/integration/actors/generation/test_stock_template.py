"""The issue's model: a stock chat template (TRL's qwen2_5.jinja verbatim) and no response template in the
tokenizer's files (the tiny tool model, orchestrator/builtin/models/tools.py, with `response_template` dropped from its
tokenizer_config.json). TRL's trainer installs the response template at init; rayward's driver check and the
generator's engine tokenizer are prepared alike (chat.prepare_tokenizer), and a box rollout on the real vLLM engine
runs its tool turn: the call parsed, the tool run, the answer after the result, the ids the template's structure.

The generator prepares its own engine tokenizer (Generator.__init__, for a run with tools): without that the turn
fails with the issue's `parse_turn: the tokenizer has no response_template`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

pytest.importorskip("vllm")

from actors.agents import chat  # noqa: E402
from actors.agents.loop import AgentSettings  # noqa: E402
from actors.generation.generator import Generator  # noqa: E402
from actors.types import Sampling  # noqa: E402
from orchestrator.builtin.models.tools import chat_template, ensure_tiny_tool_model, without_response_template  # noqa: E402
from orchestrator.builtin.tasks.boxes import BoxEnv, boxes_dataset  # noqa: E402
from orchestrator.config import parse_config  # noqa: E402
from orchestrator.run.agents import check_tool_template  # noqa: E402
from orchestrator.run.build import load_tokenizer  # noqa: E402
from tests.fixtures.envs import LocalEnvironments, tool_schemas  # noqa: E402

MAX_MODEL_LEN = 1024  # the tool model's positions
MAX_TOKENS = 120  # model tokens per trajectory: open_box, submit, "Done." take about 75
WAIT_S = 120  # bounds the trajectory and the engine's close
TOOLS = tool_schemas(BoxEnv)


@pytest.fixture(scope="module")
def stock_model(tmp_path_factory) -> Path:
    return without_response_template(ensure_tiny_tool_model(), tmp_path_factory.mktemp("stock") / "model")


@pytest.fixture(scope="module")
def envs():
    e = LocalEnvironments({"box": BoxEnv}, tool_timeout_s=WAIT_S)
    yield e
    e.shutdown()


def test_a_stock_template_without_a_response_template_runs_its_tool_turn(stock_model, envs) -> None:
    cfg = parse_config({"model": {"name_or_path": str(stock_model)}, "rewards": [],
                        "environment_factory": "orchestrator.builtin.tasks.boxes:BoxEnv"})
    driver = load_tokenizer(cfg, str(stock_model))
    assert driver.response_template is None and driver.chat_template == chat_template()  # the model
    check_tool_template(cfg, driver)  # the driver's check: prepared, not refused
    assert driver.response_template is not None

    agent = AgentSettings(tools={"box": TOOLS}, max_tool_tokens=200, trajectory_timeout_s=WAIT_S,
                          max_tool_calling_iterations=4)
    gen = Generator(str(stock_model), seed=0, max_model_len=MAX_MODEL_LEN, kv_cache_gib=1.0, environments=envs,
                    agent=agent)
    try:
        assert gen.tokenizer.response_template == driver.response_template
        assert gen.tokenizer.chat_template == driver.chat_template
        rows = [{**r, "environment": "box"} for r in boxes_dataset(2, seed=0)]
        groups = gen.rollout(rows, [r["seed"] for r in rows], sampling=Sampling(n=1, temperature=0.0,
                                                                              max_tokens=MAX_TOKENS))
        samples = [g[0] for g in groups]
        for s in samples:
            t = s.trajectory
            assert t.tool_calls >= 1 and t.tool_failures == 0, t.messages
            assert t.messages[0]["tool_calls"][0]["function"]["name"] == "open_box"
            assert t.messages[1]["role"] == "tool" and t.turns >= 2  # the result, then a turn after it
            assert t.prompt_ids == chat.render_prompt(driver, t.prompt, TOOLS)
            assert chat.check_sample(gen.tokenizer, s, TOOLS).match
    finally:
        gen.close(WAIT_S)
