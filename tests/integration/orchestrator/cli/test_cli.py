"""`rayward run` as a user runs it: a subprocess with its own embedded Ray cluster and real vLLM. Every bad
input ends in a short message and a non-zero exit, never a Python traceback; a failed run keeps its last
checkpoint. (SIGTERM: tests/integration/runs/test_resume.py and tests/integration/runs/faults/test_exact_resume.py; the
terminal of a good run: test_e2e.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(900)

TRACEBACK = "Traceback (most recent call last)"
# What a user must not have to read: Ray's, asyncio's and rayward's own machinery, vLLM's start-up.
INTERNALS = ("ray::", "RayTaskError", "asyncio", "concurrent", "actors/", "orchestrator/", "site-packages",
             "Triton", "NUMA", "safetensors", "pid=")


def rayward_run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, "RAY_ADDRESS": ""},  # its own embedded cluster, not the session's
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["configs/nope.yaml"], "rayward: config file not found: configs/nope.yaml"),
        (["configs/demo.yaml", "grpo.loss_type=ppo"], "grpo.loss_type: Input should be"),
        # overrides after an option reach the config too (here: a missing data file)
        (["configs/demo.yaml", "--name", "x", "grpo.max_steps=3", "data.path=/nonexistent/prompts.jsonl"],
         "data.path '/nonexistent/prompts.jsonl': cannot load"),
    ],
)
def test_bad_config_or_missing_file_is_a_short_message(args, message):
    r = rayward_run(*args, timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr and TRACEBACK not in r.stderr + r.stdout, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 3 and r.stdout == "", (r.stdout, r.stderr)


# One real run (its own Ray, engine, learner and reward pool) for the whole path from a user's reward function to
# the block on stderr. The messages of the other ways a reward goes wrong (wrong length, strings) are made by the
# same RewardWorker and travel the same way as this one: tests/unit/orchestrator/run/test_errors.py checks them.
def test_a_failing_reward_at_step_3_is_one_short_block(tmp_path):
    """The reward scores steps 1-2, then raises."""
    name = "bad-raise"
    reward = '[{name: bad, function: "tests.fixtures.bad_rewards:misbehaving", kwargs: {mode: raise, from_step: 2}}]'
    r = rayward_run("configs/demo.yaml", "--name", name, f"rewards={reward}", "grpo.max_steps=6", "grpo.save_steps=1",
                    "generation.generation_batch_size=16", "grpo.per_device_train_batch_size=16",
                    "logging.check_logprob_parity=false",
                    f"logging.dir={tmp_path}")
    out, err = r.stdout, r.stderr
    assert r.returncode == 1, (out[-2000:], err[-4000:])
    assert TRACEBACK not in out + err, err
    assert re.search(r"^step +2/6 \| reward", out, re.M), out  # not a terminal: one line per step
    lines = err.strip().splitlines()
    # the block may follow the run's own warnings (on a loaded machine: a reward worker slow to start)
    head = f"rayward: run '{name}' failed at step 3"
    assert head in lines, err
    lines = lines[lines.index(head):]
    assert re.fullmatch(r"reward 'bad' raised on sample \d+: ValueError: verifier exploded", lines[1]), err
    assert lines[2].startswith("  prompt:     'Write the letter ") and lines[3].startswith("  completion: '"), err
    assert ('File "tests/fixtures/bad_rewards.py", line 14, in check_answer\n'
            '    raise ValueError("verifier exploded")') in err
    assert f"last checkpoint: {tmp_path / name / 'checkpoint-2'} (continue with --name {name} --resume)" in err
    assert lines[-1].startswith("(--debug shows the full traceback; the actors' output is in "), err
    assert len(lines) <= 12, err
    for internal in INTERNALS:
        assert internal not in err.replace(str(tmp_path), "<run>"), (internal, err)
    # the last checkpoint is the complete one before the failing step
    state = json.loads((tmp_path / name / "checkpoint-2" / "rayward_state.json").read_text())
    assert state["global_step"] == 2 and not (tmp_path / name / "checkpoint-3").exists()
