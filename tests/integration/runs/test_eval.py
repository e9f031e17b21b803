"""Held-out eval on a local Ray cluster with real vLLM, in the pipelined loop: checkpoint-best holds the weights
that scored its eval (`rayward eval` on it reproduces that eval). (The demo's eval curve rising, its progress lines
and files: tests/integration/runs/test_e2e.py, in the demo's own run. The eval schedule, which weights each
eval sees, checkpoint-best's bookkeeping: tests/unit/orchestrator/loop/test_loops.py, on fakes.)"""

from __future__ import annotations

import json

import pytest

from orchestrator.cli.main import main
from orchestrator.config import load_config
from orchestrator.run.train import train
from tests.conftest import ROOT


def evals_of(history):
    return [h for h in history if "eval/reward" in h]


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
