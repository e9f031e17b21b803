"""The agent endpoint on a real vLLM engine: the tiny tool model (orchestrator/builtin/models/tools.py) served to agents
written against the `openai` SDK (tests/fixtures/agents.py: the box agent of configs/agent.yaml, streamed; a
streamed request with a stop string and usage; a rewritten history; an agent that raises; one that hangs; a
request without the key), through one in-process Generator for the whole module, the agents on the real
AgentWorker in this process (the environment pool's side is tests/integration/runs/agentic/test_agent_run.py's).

- token in, token out: the ids trained are the ids the engine sampled (the engine's own log-probs of the whole
  sequence, recomputed, against the sampling log-probs of the model's tokens), and the chat template's rendering
  of the conversation agrees with them;
- a stop string: the ids keep it, the content returned does not (as OpenAI's);
- a branch, an error, a deadline, a refused key.

No Ray: the Generator is a plain class.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

pytest.importorskip("vllm")

from actors.agents import chat  # noqa: E402
from actors.agents.loop import AgentSettings  # noqa: E402
from actors.generation.generator import Generator  # noqa: E402
from actors.types import Sample, Sampling  # noqa: E402
from orchestrator.builtin.models.tools import ensure_tiny_tool_model  # noqa: E402
from orchestrator.builtin.tasks.box_agent import TOOLS  # noqa: E402
from orchestrator.builtin.tasks.boxes import boxes_dataset  # noqa: E402
from tests.fixtures.agents import HERE, LocalAgents  # noqa: E402

MAX_MODEL_LEN = 1024
MAX_TOKENS = 120
TRAJECTORY_TIMEOUT_S = 20.0  # the hanging agent's wait: well above a box episode's few seconds on a loaded box
LOGPROB_TOL = 1e-3  # the engine's log-probs of the same ids recomputed (float32 kernels, another batch shape)
SAMPLING = Sampling(n=4, temperature=1.0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def gen():
    agents = LocalAgents(f"{HERE}:modal_agent")
    agent = AgentSettings(tools={None: []}, max_tool_tokens=200, trajectory_timeout_s=TRAJECTORY_TIMEOUT_S,
                          max_tool_calling_iterations=3, served_model="tiny-tools")
    g = Generator(str(ensure_tiny_tool_model()), seed=0, max_model_len=MAX_MODEL_LEN, kv_cache_gib=1.0,
                  environments=agents, agent=agent)
    yield g
    agents.shutdown()
    g.endpoint.close()
    g.close(60)


def rows(mode: str, k: int, seed: int = 0) -> list[dict[str, Any]]:
    return [{**r, "mode": mode} for r in boxes_dataset(k, seed)]


def rollout(gen: Generator, mode: str, k: int = 2, sampling: Sampling = SAMPLING) -> list[Sample]:
    batch = rows(mode, k)
    return [s for g in gen.rollout(batch, [r["seed"] for r in batch], sampling) for s in g]


def test_box_agent_trains_the_ids_the_engine_sampled(gen):
    samples = rollout(gen, "box")
    called = [s for s in samples if s.trajectory.tool_calls > s.trajectory.tool_failures]
    assert called, "the tool model never called a tool"
    for s in samples:
        t = s.trajectory
        assert t.requests == t.turns >= 1 and t.branches == 1 and t.untrained_turns == 0
        assert t.stop_reason in ("stop", "length", "max_turns") and s.finish_reason == t.stop_reason
        assert t.prompt_ids == chat.render_prompt(gen.tokenizer, t.prompt, TOOLS)
        assert len(s.logprobs) == len(s.versions) == len(t.turn_ids) == len(s.completion_ids)
        assert t.env_reward in (0.0, 1.0) and t.endpoint_s > 0
    clean = [s for s in called if s.trajectory.stop_reason == "stop" and not s.trajectory.tool_failures]
    assert clean
    for s in clean:
        check = chat.check_sample(gen.tokenizer, s, TOOLS)
        assert check.match, gen.tokenizer.decode(s.trajectory.prompt_ids + s.completion_ids)
    for s in called[:3]:  # the engine's log-probs of the whole sequence at once: sampled in exactly that context
        ids = s.trajectory.prompt_ids + s.completion_ids
        recomputed = gen.sequence_logprobs(ids)[len(s.trajectory.prompt_ids) - 1:]
        for i, turn in enumerate(s.trajectory.turn_ids):
            if turn >= 0:
                assert abs(recomputed[i] - s.logprobs[i]) < LOGPROB_TOL
            else:
                assert math.isnan(s.logprobs[i])


def test_a_streamed_request_stops_at_its_stop_string_and_a_keyless_one_is_refused(gen):
    samples = rollout(gen, "stream", k=1)
    for s in samples:
        t = s.trajectory
        assert t.env_reward == 1.0, t  # the agent's own checks passed (it raises otherwise: env_error)
        assert (t.requests, t.turns) == (1, 1)
        text = gen.tokenizer.decode(s.completion_ids)
        assert text.endswith("\n") and text.count("\n") == 1  # the ids keep the stop string


def test_a_rewritten_history_is_a_branch_an_error_keeps_its_turn_a_hang_times_out(gen):
    for s in rollout(gen, "branch", k=1):
        t = s.trajectory
        assert (t.requests, t.branches, t.untrained_turns) == (2, 2, 1)
        assert t.prompt[0]["content"].startswith("Box 1 holds 123") and math.isnan(t.env_reward)
    for s in rollout(gen, "raise", k=1):
        assert (s.trajectory.stop_reason, s.trajectory.turns, s.trajectory.env_reward) == ("env_error", 1, None)
    for s in rollout(gen, "hang", k=1, sampling=Sampling(n=2, temperature=1.0, max_tokens=MAX_TOKENS)):
        assert (s.trajectory.stop_reason, s.trajectory.turns, s.trajectory.env_reward) == ("timeout", 1, None)
