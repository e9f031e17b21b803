"""configs/tools.yaml, shortened, on the local Ray cluster: the tiny tool model on the box task with real vLLM,
environment pool, reward pool and learner, through the pipelined loop. One run shared by every assertion (engine
start-ups are the cost): what reaches the learner (masks, token in / token out against the chat template's own
rendering), the step metrics, the completions log, and an environment worker SIGKILLed mid-trajectory while the
run goes on. (The loops' accounting with agentic rollouts: tests/unit/orchestrator/loop/test_agentic_loop.py, on
fakes; the generator's side: tests/integration/actors/generation/test_agent_engine.py. Whether the reward rises
over a longer run is bench/agentic_vs_trl.py's to show: too long for CI.)"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from orchestrator.config import load_config
from tests.conftest import ROOT
from tests.integration.runs.agentic.killed_run import Captured, check_the_kill_lost_no_sample, train_killing_a_worker

NAME = "agentic-tools"
STEPS = 4
# Shortened: 2 prompts x 4 trajectories per step, a worker killed at the first step that has sessions open.
OVERRIDES = [
    f"name={NAME}", f"grpo.max_steps={STEPS}", "generation.num_generations=4", "generation.generation_batch_size=8",
    "grpo.per_device_train_batch_size=8", "logging.check_logprob_parity=false",
]

@pytest.fixture(scope="module")
def tools_run(ray_cluster, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tools")
    cfg = load_config(ROOT / "configs" / "tools.yaml", [f"logging.dir={run_dir}", *OVERRIDES])
    history, captured = train_killing_a_worker(ray_cluster, cfg, NAME)
    return cfg, history, captured, run_dir / NAME


def tokenizer():
    from transformers import AutoTokenizer

    from orchestrator.builtin.models.tools import ensure_tiny_tool_model

    return AutoTokenizer.from_pretrained(str(ensure_tiny_tool_model()))


def test_every_step_trains_a_whole_batch_even_with_a_worker_killed(tools_run):
    cfg, history, captured, _ = tools_run
    check_the_kill_lost_no_sample(cfg, history, captured, STEPS, "environment session", "env_pool/sessions_lost",
                                  "BoxEnv")


def test_the_learner_trains_on_the_sampled_ids_with_tool_tokens_masked(tools_run):
    _, _, captured, _ = tools_run
    tok = tokenizer()
    checked = 0
    for step in captured.steps:
        b = step.batch
        for i, t in enumerate(step.trajectories):
            ids, mask, logps = b.completion_ids[i], b.completion_mask[i], b.sampling_logprobs[i]
            assert mask == t.mask and b.prompt_ids[i] == t.prompt_ids
            assert [math.isnan(x) for x in logps] == [m == 0 for m in mask]  # logprobs for model tokens only
            tool_text = tok.decode([x for x, m in zip(ids, mask, strict=True) if m == 0])
            model_text = tok.decode([x for x, m in zip(ids, mask, strict=True) if m == 1])
            assert "<tool_response>" not in model_text and "<tool_call>" not in tool_text
            assert t.tool_tokens == mask.count(0)
            if t.stop_reason != "stop" or t.tool_failures or t.tool_calls == 0:
                continue
            # token in, token out: the ids trained on are what the template renders for the conversation
            rendered = tok.apply_chat_template(t.prompt + t.messages, tools=_schemas(captured), tokenize=False)
            trained = tok.decode(b.prompt_ids[i] + ids)
            assert _specials(trained, tok) == _specials(rendered, tok), (trained, rendered)
            checked += 1
    assert checked > 0, "no sample called a tool and stopped: nothing to compare with the template"


def _schemas(captured: Captured) -> list[dict[str, Any]]:
    from actors.envs.spec import tool_schemas
    from orchestrator.run.agents import env_spec

    return tool_schemas(env_spec(captured.run.cfg))[None]


def _specials(text: str, tok: Any) -> list[str]:
    """The special tokens of a text, in order: where turns and tool exchanges start and end."""
    specials = set(tok.all_special_tokens) | {t for t in tok.get_added_vocab() if t.startswith("<")}
    return [t for t in tok.tokenize(text) if t in specials]


def test_step_metrics_say_what_the_conversations_did(tools_run):
    _, history, _, _ = tools_run
    row = history[-1]
    for key in ("multiturn/turns", "multiturn/tool_calls", "multiturn/tool_failures", "multiturn/env_s",
                "multiturn/tokens/model", "multiturn/tokens/tool", "env_pool/workers",
                "sampling/sampling_logp_difference/max/turn_0", "rewards/BoxEnv/mean"):
        assert key in row, key
    assert sum(row[f"multiturn/stop_reason/{r}"] for r in ("stop", "max_turns", "length", "timeout", "env_error")) \
        == pytest.approx(1.0)
    assert all(h["multiturn/tool_calls"] > 0 for h in history)  # the warmed-up model calls its tools
    assert all(h["completions/mean_length"] == h["multiturn/tokens/model"] for h in history)
    # token in, token out, against the real template: every trained conversation's special-token boundaries are
    # the template's own
    assert all(h["multiturn/template_mismatch_frac"] == 0 for h in history)


def test_the_completions_log_holds_the_conversations(tools_run):
    cfg, _, _, run_dir = tools_run
    rows = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == STEPS * cfg.generation.generation_batch_size
    # a conversation whose calls all parsed (the model sometimes writes a malformed call: a tool failure, answered
    # by a tool message, with no tool_calls on its assistant turn)
    called = [r for r in rows if r["tool_calls"] > 0 and r["tool_failures"] == 0 and r["stop_reason"] != "env_error"]
    assert called
    roles = [m["role"] for m in called[0]["completion"]]
    assert roles[0] == "assistant" and "tool" in roles and called[0]["completion"][0].get("tool_calls")
    assert {"stop_reason", "turns", "tool_failures", "rewards/BoxEnv", "advantage"} <= set(rows[0])


# Scenario tier (CI time, issue 30): a second whole agentic run. CI's tier keeps the training run above, agentic evals
# in the loop (tests/unit/orchestrator/loop/test_agentic_loop.py, on fakes) and `rayward eval` of a one-turn checkpoint
# (tests/integration/runs/test_eval.py).
def test_rayward_eval_runs_the_tools(tools_run, tmp_path):
    """`rayward eval` on the config: its own environment pool, the environment's reward, conversations reported."""
    from orchestrator.run.evaluate import evaluate

    cfg = load_config(ROOT / "configs" / "tools.yaml", [
        f"logging.dir={tmp_path}", "eval.data.path=boxes", "eval.max_samples=2", "eval.num_generations=2",
    ])
    report = evaluate(cfg, name="agentic-eval", output=tmp_path / "eval.json", verbose=False)
    m = report["metrics"]
    assert m["eval/prompts"] == 2 and "eval/rewards/BoxEnv/mean" in m and m["eval/multiturn/tool_calls"] > 0
    assert len(report["samples"]) == 4 and report["samples"][0]["completion"][0]["role"] == "assistant"
