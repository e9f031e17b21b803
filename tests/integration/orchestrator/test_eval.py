"""Held-out eval on a local Ray cluster with real vLLM: the demo's eval curve rises, and in the pipelined loop
checkpoint-best holds the weights that scored its eval (`rayward eval` on it reproduces that eval). (The eval
schedule, which weights each eval sees, checkpoint-best's bookkeeping: tests/unit/orchestrator/test_loop.py, on
fakes.)"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from orchestrator.cli.main import main
from orchestrator.config import load_config
from orchestrator.train import train
from tests.conftest import ROOT

DEMO = ROOT / "configs" / "demo.yaml"
# The demo eval: every 10 steps and at the start, 4 completions per held-out prompt (all 256 toy rows).
DEMO_EVAL = '{"data": {"path": "toy"}, "every_n_steps": 10, "at_start": true, "num_generations": 4}'
# letter_fraction is a fraction: a completion at least half of the requested letter counts as a pass.
EVAL_OVERRIDES = [f"eval={DEMO_EVAL}", "eval.pass_threshold=0.5"]


@pytest.fixture(scope="module")
def demo_run(ray_cluster, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("runs")
    cfg = load_config(DEMO, [f"logging.dir={logdir}", *EVAL_OVERRIDES, "grpo.save_steps=20"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # the progress output
        history = train(cfg, name="eval-demo")
    return cfg, history, logdir / "eval-demo", out.getvalue()


def evals_of(history):
    return [h for h in history if "eval/reward" in h]


def test_demo_eval_reward_rises(demo_run):
    cfg, history, _, _ = demo_run
    assert len([h for h in history if "reward" in h]) == cfg.grpo.max_steps  # the step rows are as before
    evals = evals_of(history)
    curve = [round(h["eval/reward"], 3) for h in evals]
    print(f"demo eval reward by step 0, 10, 20, 30, 40: {curve}")
    # The random policy scores ~0.03 (as the training batches do); the trained one several times more.
    first, late = evals[0]["eval/reward"], (evals[-2]["eval/reward"] + evals[-1]["eval/reward"]) / 2
    assert late > first + 0.1 and late > 3 * first, curve
    for h in evals:
        assert h["eval/prompts"] == 256 and 0 <= h["eval/pass@1"] <= h["eval/pass@4"] <= 1
        assert h["eval/rewards/letter/mean"] == pytest.approx(h["eval/reward"])  # one reward, weight 1
    assert evals[-1]["eval/pass@4"] > evals[0]["eval/pass@4"]


def test_eval_in_the_progress_output_and_on_disk(demo_run):
    _, history, run_dir, out = demo_run
    lines = [x for x in out.splitlines() if x.startswith("eval ")]
    assert lines[0].startswith("eval    0/40 | reward ") and "pass@4" in lines[0], lines
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in rows if "eval/reward" in r] == evals_of(history)
    for key in ("eval/reward", "eval/rewards/letter/mean", "eval/pass@1", "eval/pass@4", "eval/mean_length",
                "eval/policy_version", "eval/seconds"):
        assert key in rows[-1], key
    samples = (run_dir / "eval_completions.jsonl").read_text().splitlines()
    first = json.loads(samples[0])
    assert {"step", "prompt", "completion", "total", "passed", "rewards/letter"} <= set(first)


def test_pipelined_eval_overlaps_and_rayward_eval_reproduces_checkpoint_best(ray_cluster, tmp_path, capsys):
    """Pipelined, with eval rewards of its own (scored by NAME/eval-reward-pool, not trained on): checkpoint-best,
    saved as a candidate when its eval was submitted (queued on the real learner before its next train step),
    holds the weights that scored the recorded value: `rayward eval CONFIG --checkpoint ...` on it (same weights,
    prompts and seeded sampling as that eval, so the same numbers) prints the table and writes the report."""
    own = ('[{"name": "letter", "function": "letter_fraction"}, '
           '{"name": "starts", "function": "starts_with_letter", "weight": 0.5}]')
    over = [f"logging.dir={tmp_path}", "grpo.max_steps=10", "logging.check_logprob_parity=false",
            'eval={"data": {"path": "toy"}, "every_n_steps": 5, "at_start": true, "num_generations": 2, '
            f'"max_samples": 32, "rewards": {own}}}', "grpo.save_best=eval/reward"]
    cfg = load_config(ROOT / "configs" / "pipelined.yaml", over)
    history = train(cfg, name="eval-pipe", show_progress=False)
    steps = [h for h in history if "reward" in h]
    assert all("rewards/starts/mean" not in h for h in steps)  # the eval's rewards are not trained on
    evals = evals_of(history)
    for h in evals:  # the eval block's weights
        assert h["eval/reward"] == pytest.approx(h["eval/rewards/letter/mean"] + 0.5 * h["eval/rewards/starts/mean"])
    state = json.loads((tmp_path / "eval-pipe" / "checkpoint-best" / "rayward_state.json").read_text())
    best = max(evals, key=lambda h: h["eval/reward"])
    assert state["best"]["step"] == best["step"] == state["global_step"]
    capsys.readouterr()
    report = tmp_path / "best.json"
    code = main(["eval", str(ROOT / "configs" / "pipelined.yaml"), *over, "--name", "eval-pipe-best",
                 "--checkpoint", str(tmp_path / "eval-pipe" / "checkpoint-best"), "--output", str(report)])
    out = capsys.readouterr().out
    assert code == 0
    assert any(line.startswith("eval/reward ") for line in out.splitlines()), out
    again = json.loads(report.read_text())
    assert again["step"] == best["step"] and len(again["samples"]) == best["eval/prompts"] * 2
    print(f"eval at step {best['step']} (best): {best['eval/reward']:.4f}; rayward eval of checkpoint-best: "
          f"{again['metrics']['eval/reward']:.4f}")
    for key in ("eval/reward", "eval/pass@1", "eval/pass@2", "eval/mean_length"):
        assert again["metrics"][key] == pytest.approx(best[key], abs=1e-6), key
