"""Both loops with agentic rollouts, in process, on the fakes (tests/fixtures/fakes.py, `agentic=True`): every
fake conversation is turn 0, a tool result, turn 1 (completion_ids [v, j, TOOL, TOOL, v', j]), rendered after a
first prompt the generator made (TOOLS_MARK + the row's ids), scored by the environment's get_reward() through a
real reward worker. What the driver must do with them: the learner's masks and prompt ids, the environment
outputs to the reward pool, the metrics, the completions log, the staleness rule, a lost session's fallback."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.cli.samples import samples_table
from orchestrator.data.sources import request_seed
from orchestrator.loop.loops import run_async, run_pipelined, run_sync
from orchestrator.loop.rollout import STOP_REASONS
from tests.fixtures.fakes import ENV_REWARD, TOOL, TOOLS_MARK, ByteTokenizer, chat_rows, fake_run

LOOPS = {"sync": run_sync, "pipelined": run_pipelined, "async": run_async}
G = 2  # fakes.CONFIG's num_generations


def steps(history):
    return [h for h in history if "reward" in h]


@pytest.mark.parametrize("loop", LOOPS)
def test_agentic_batches_reach_the_learner_with_the_tool_tokens_masked(tmp_path, loop):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}"], agentic=True)
    LOOPS[loop](run)
    assert len(run.learner.trained) == 4
    for t in run.learner.trained:
        b = t.batch
        assert b.completion_mask == [[1, 1, 0, 0, 1, 1]] * len(b)
        assert all(c[2:4] == [TOOL, TOOL] for c in b.completion_ids)
        assert all(math.isnan(lp[2]) and math.isnan(lp[3]) and lp[0] == -0.5 for lp in b.sampling_logprobs)
        # the first prompt as the generator rendered it (tools in), not the driver's prompt_ids
        assert all(p[0] == TOOLS_MARK for p in b.prompt_ids)
        assert b.advantages[0] < b.advantages[1]  # the environment's reward (j + v/100) made the advantages


@pytest.mark.parametrize("loop", LOOPS)
def test_agentic_step_metrics(tmp_path, loop):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}"], agentic=True)
    row = steps(LOOPS[loop](run))[-1]
    assert row["multiturn/turns"] == 2 and row["multiturn/tool_calls"] == 1 and row["multiturn/tool_failures"] == 0
    assert (row["tools/call_frequency"], row["tools/failure_frequency"]) == (1.0, 0.0)  # TRL's names
    assert row["multiturn/tokens/model"] == 4 and row["multiturn/tokens/tool"] == 2
    assert row["multiturn/env_s"] == pytest.approx(0.1) and row["multiturn/env_s_max"] == pytest.approx(0.1)
    assert row["completions/mean_length"] == 4  # model tokens: tool results are not the completion's length
    assert row["multiturn/template_mismatch_frac"] == pytest.approx(1 / run.cfg.generation.num_generations)
    assert {r: row[f"multiturn/stop_reason/{r}"] for r in STOP_REASONS} == {
        "stop": 1.0, "max_turns": 0.0, "length": 0.0, "timeout": 0.0, "env_error": 0.0}
    assert row["env_pool/workers"] == 2 and row["env_pool/sessions_lost"] == 0
    v = row["policy_version"]  # the last batch's weights: step 3 (sync), step 2 (pipelined, async: one step stale)
    assert v == {"sync": 3, "pipelined": 2, "async": 2}[loop]
    assert row[f"rewards/{ENV_REWARD}/mean"] == pytest.approx(0.5 + v / 100)  # j in {0, 1}


@pytest.mark.parametrize("loop", LOOPS)
def test_the_reward_pool_gets_the_environments_outputs(tmp_path, loop):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=1"], agentic=True)
    LOOPS[loop](run)
    batch = run.reward_pool.seen[0]
    assert batch.env_classes == [ENV_REWARD] * len(batch) and batch.environments is None  # no reward asks for them
    assert batch.env_rewards[:G] == [0.0, 1.0]
    assert [m["role"] for m in batch.completions[0]] == ["assistant", "tool", "assistant"]  # TRL's: the conversation
    assert batch.prompts[0][-1]["content"].endswith("(reset)")  # the prompt reset() extended


@pytest.mark.parametrize("loop", LOOPS)
def test_a_lost_session_is_trained_on_with_the_environment_rewards_fallback(tmp_path, loop):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=1"], agentic=True)
    run.generators.engines[0].lost = {0, 2}  # rows 0 and 2: their environment worker died
    row = steps(LOOPS[loop](run))[0]
    trained = run.learner.trained[0].batch
    assert len(trained) == 8  # every sample of every row, the lost ones too
    uids = [ByteTokenizer.uid_of(p) for p in trained.prompt_ids]
    log = [json.loads(line) for line in (run.run_dir / "completions.jsonl").read_text().splitlines()]
    lost = [r for r, u in zip(log, uids, strict=True) if u in (0, 2)]
    assert len(lost) == 4 and all(r[f"rewards/{ENV_REWARD}"] == -1.0 and r["stop_reason"] == "env_error" for r in lost)
    assert row["multiturn/stop_reason/env_error"] == 0.5 and row["multiturn/env_reward_missing_frac"] == 0.5
    assert row[f"rewards/{ENV_REWARD}/errors"] > 0  # a missing get_reward() value is counted


def test_a_trajectory_spanning_a_weight_sync_counts_as_its_oldest_tokens_version(tmp_path):
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "loop.max_staleness=1"], agentic=True)
    gen = run.generators.engines[0]
    gen.span_sync = True  # every second turn sampled by the next weights
    history = steps(run_pipelined(run))
    for h, t in zip(history, run.learner.trained, strict=True):
        first_turn = {c[0] for c in t.batch.completion_ids}
        assert {c[4] for c in t.batch.completion_ids} == {v + 1 for v in first_turn}
        assert h["policy_version"] == min(first_turn)  # the oldest model token's version, not the newest
        assert h["policy_staleness"] == t.step_before - min(first_turn) <= 1
    # every rollout call waited for the weights its batch was submitted under
    assert [mv for _, mv in gen.rollouts] == [0, 0, 1, 2]


def test_rollouts_get_one_seed_per_row_fixed_by_the_run_seed_step_and_draw(tmp_path):
    run = fake_run(tmp_path / "r", ["grpo.max_steps=2"], agentic=True)
    run_sync(run)
    seeds = [s for call, _ in run.generators.engines[0].rollouts for s in call]
    assert seeds == [request_seed(run.cfg.seed, step, draw)
                     for step in range(2) for draw in range(4 * step, 4 * step + 4)]


def test_the_completions_log_and_samples_show_the_conversation(tmp_path):
    run = fake_run(tmp_path / "r", ["grpo.max_steps=1"], agentic=True)
    run_sync(run)
    rows = [json.loads(line) for line in (run.run_dir / "completions.jsonl").read_text().splitlines()]
    r = rows[1]
    assert [m["role"] for m in r["completion"]] == ["assistant", "tool", "assistant"]
    assert r["completion"][0]["tool_calls"][0]["function"] == {"name": "open_box", "arguments": {"box": 1}}
    assert (r["stop_reason"], r["turns"], r["tool_calls"], r["tool_failures"]) == ("stop", 2, 1, 0)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(samples_table(rows, title="t"))
    text = console.export_text()
    assert 'open_box({"box": 1})' in text and "← open_box: " in text and "stop" in text


@pytest.mark.parametrize("loop", LOOPS)
def test_evals_run_agentic_rollouts_and_log_their_conversations(tmp_path, loop):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=2", "eval.data.path=unused",
                                    "eval.every_n_steps=1", "eval.num_generations=2", "eval.max_samples=3"],
                   agentic=True)
    history = LOOPS[loop](run)
    evals = [h for h in history if "eval/reward" in h]
    assert len(evals) == 2 and all(h["eval/multiturn/turns"] == 2 for h in evals)
    assert all(h["eval/mean_length"] == 4 for h in evals)
    logged = [json.loads(line) for line in (run.run_dir / "eval_completions.jsonl").read_text().splitlines()]
    assert len(logged) == 12 and logged[0]["completion"][1]["role"] == "tool"


class NamedColumnsEnv:
    """An environment whose reset() names the dataset's columns, with no **kwargs: a column the driver added would
    be a TypeError."""

    def reset(self, prompt, uid, seed):
        return f"box {uid}"


@pytest.mark.parametrize("loop", LOOPS)
def test_an_environment_gets_exactly_its_dataset_row(tmp_path, loop):
    """The rows the generators' agentic calls receive (training batches, refills and evals) are the dataset's rows
    themselves: no draw index, no prompt ids (those travel beside the row, in the driver's Prompt)."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=2", "eval.data.path=unused",
                                    "eval.every_n_steps=1", "eval.num_generations=2", "eval.max_samples=3"],
                   agentic=True)
    LOOPS[loop](run)
    dataset = {row["uid"]: row for row in chat_rows()}
    seen = run.generators.engines[0].rows
    assert len(seen) == 2 * 4 + 2 * 3  # two training batches of 4 prompts, two evals of 3
    for row in seen:
        assert row == dataset[row["uid"]]
        assert NamedColumnsEnv().reset(**row) == f"box {row['uid']}"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_run_whose_tool_calls_mostly_fail_says_so_on_the_terminal(tmp_path, loop):
    """Every call of steps 1-2 fails (their sessions lost), then they answer: a line at step 1, one at step 3 when
    they answer again, and the run's total at its end (orchestrator/telemetry/tool_calls.py)."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=4"], agentic=True)
    run.generators.engines[0].lost = set(range(8))  # the rows of the first two steps (4 prompts a step, in order)
    LOOPS[loop](run)
    lines = [x for x in run.display.stream.getvalue().splitlines() if "tool calls" in x]
    assert lines[0].startswith("rayward: step 1: 8 of 8 tool calls failed; ")
    assert lines[1] == "rayward: step 3: tool calls answer again (0 of 8 failed)"
    assert lines[2].startswith("rayward: tool calls: 16 of 32 failed over the run (50%; 2 step(s) with most failing)")
