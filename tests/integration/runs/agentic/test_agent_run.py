"""configs/agent.yaml, shortened, on the local Ray cluster: the box task's agent written against the `openai` SDK
(orchestrator/builtin/tasks/box_agent.py), unchanged, its agents in the environment pool's async workers, its requests
on the generator's endpoint, through the pipelined loop with real vLLM, reward pool and learner. One run shared by the
assertions: what reaches the learner (the sampled ids, masked as the environment-class path masks them), the step
metrics of the endpoint, and an agent worker SIGKILLed while its agents run: their trajectories keep their turns
(env_error, the agent's reward scored fallback), the pool replaces the worker, and every step trains a whole
batch. (The in-process tests: tests/unit/actors/generation/test_endpoint.py, on the scripted engine, and
tests/integration/actors/generation/test_endpoint_engine.py, on the real one.)"""

from __future__ import annotations

import math

import pytest

from orchestrator.config import load_config
from tests.conftest import ROOT
from tests.integration.runs.agentic.killed_run import check_the_kill_lost_no_sample, train_killing_a_worker

NAME = "agentic-endpoint"
STEPS = 3
OVERRIDES = [
    f"name={NAME}", f"grpo.max_steps={STEPS}", "generation.num_generations=4", "generation.generation_batch_size=8",
    "grpo.per_device_train_batch_size=8", "logging.check_logprob_parity=false",
    "cluster.num_env_workers=2",  # the killed worker's agents are half of a step's
]


@pytest.fixture(scope="module")
def agent_run(ray_cluster, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("agent")
    cfg = load_config(ROOT / "configs" / "agent.yaml", [f"logging.dir={run_dir}", *OVERRIDES])
    history, captured = train_killing_a_worker(ray_cluster, cfg, NAME)
    return cfg, history, captured


def test_every_step_trains_a_whole_batch_with_an_agent_worker_killed(agent_run):
    cfg, history, captured = agent_run
    check_the_kill_lost_no_sample(cfg, history, captured, STEPS, "agent run", "env_pool/agent_errors", "box_agent")


def test_the_learner_trains_the_sampled_ids_with_the_agents_messages_masked(agent_run):
    _, history, captured = agent_run
    for step in captured.steps:
        b = step.batch
        for i, t in enumerate(step.trajectories):
            mask, logps = b.completion_mask[i], b.sampling_logprobs[i]
            assert mask == t.mask and b.prompt_ids[i] == t.prompt_ids
            assert [math.isnan(x) for x in logps] == [m == 0 for m in mask]
            assert t.tool_tokens == mask.count(0) and t.requests >= t.turns
    row = history[-1]
    assert row["agent/requests"] >= 1 and row["agent/branches"] == 1 and row["agent/endpoint_ms_per_request"] > 0
    assert all(h["multiturn/tool_calls"] > 0 for h in history)  # the warmed-up model calls the agent's tools
    assert all(h["multiturn/template_mismatch_frac"] == 0 for h in history)
    assert "rewards/box_agent/mean" in row
