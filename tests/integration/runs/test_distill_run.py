"""On-policy distillation in a real run, as a user runs it: configs/distill.yaml (the demo with a teacher on a vLLM
engine of its own). CI's tier: the policy as its own teacher (`distillation.teacher=tiny`), where the first step's
reverse KL must be zero: the teacher scored exactly the ids the student sampled, position by position (a teacher
that re-tokenized, or an off-by-one, shows at once); the teacher pool's state is in every step's metrics. The
scenario tier: the tiny teacher over 40 steps: the student's reverse KL to it falls by at least half and its
reward on the task rises; the same with tools (multi-turn: the teacher scores the model's tokens only) with the
policy as its own teacher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(900)

# vLLM's CPU kernels against the learner's transformers forward on the same weights, per token (float32)
SAME_MODEL_KL = 1e-3


def run(tmp_path: Path, name: str, config: str, *overrides: str) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", config, "--name", name, f"logging.dir={tmp_path}",
                        "logging.progress=false", *overrides],
                       cwd=ROOT, capture_output=True, text=True, timeout=850, env={**os.environ, "RAY_ADDRESS": ""})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_the_policy_as_its_own_teacher_is_zero_kl_before_it_moves(tmp_path):
    steps = run(tmp_path, "distill-self", "configs/distill.yaml", "distillation.teacher=tiny", "grpo.max_steps=2")
    assert len(steps) == 2
    assert abs(steps[0]["distill/reverse_kl"]) < SAME_MODEL_KL, steps[0]["distill/reverse_kl"]
    assert steps[1]["distill/reverse_kl"] > steps[0]["distill/reverse_kl"]  # the student moved away from itself
    for s in steps:
        assert s["distill/teacher_failures"] == 0 and s["teacher_pool/workers"] == 1
        assert s["teacher_pool/errors"] == 0 and s["teacher_pool/timeouts"] == 0


def test_the_student_moves_to_the_teacher_and_its_reward_rises(tmp_path):
    steps = run(tmp_path, "distill", "configs/distill.yaml")
    kl = [s["distill/reverse_kl"] for s in steps]
    reward = [s["rewards/letter/mean"] for s in steps]
    first, last = (mean(kl[:5]), mean(reward[:5])), (mean(kl[-5:]), mean(reward[-5:]))
    print(f"reverse KL {first[0]:.2f} -> {last[0]:.2f}; reward {first[1]:.3f} -> {last[1]:.3f}")
    assert last[0] <= 0.5 * first[0]
    assert last[1] >= first[1] + 0.2
    assert all(s["distill/teacher_failures"] == 0 for s in steps)


def test_with_tools_the_teacher_scores_the_models_tokens(tmp_path):
    """configs/tools.yaml's agent (tool results and chat-template scaffold in its completions) with the policy as
    its own teacher: zero reverse KL at the first step, as in the one-turn run: the teacher read each whole
    exchange as the student's ids (the loss's mask keeps the term to the model's tokens: tests/unit/actors/
    learner/test_distill.py)."""
    steps = run(tmp_path, "distill-tools", "configs/tools.yaml", "grpo.max_steps=2",
                "distillation={teacher: tiny-tools, engines: {num_cpus: 0.25, kv_cache_gib: 0.5}}")
    assert abs(steps[0]["distill/reverse_kl"]) < SAME_MODEL_KL, steps[0]["distill/reverse_kl"]
    assert all(s["distill/teacher_failures"] == 0 for s in steps)
    assert steps[0]["multiturn/tokens/tool"] > 0  # tool results were in the exchanges the teacher read
