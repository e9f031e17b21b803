"""TRL scripts, in the shape of TRL's GRPOTrainer documentation (tests/fixtures/trl_scripts/), run unchanged but
for `from trl import` -> `from rayward import` on their one import line: each its own `python script.py`, on an
embedded Ray cluster, the tiny models and data built in the script.

Every script is a run of its own with its own Ray cluster: the scenario tier (CI time). The quick start must learn
as it does in TRL (its functions pickled by value: CI's unit tier, tests/unit/orchestrator/trl/test_trainer.py, covers
the constructor with lambdas, closures and `__main__` functions); the scenario tier also runs the weighted rewards
(functions defined under `if __name__ == "__main__":`, a lambda and a closure among them) and the other five through
rayward (an environment_factory class defined in its script among them), and all seven through TRL itself, which proves
them valid TRL usage. TRL's documented quick start with its default config (docs_quickstart.py) runs through rayward
only: TRL refuses that config on a machine without a GPU."""

from __future__ import annotations

import pytest

from tests.fixtures.trl_scripts.run_script import HERE, MODEL_FOR, SCRIPTS, model_path, run

# A run's start (Ray, a vLLM engine, the workers) plus its steps, on a shared 2-core machine.
SCRIPT_TIMEOUT_S = 600
# The quick start in TRL (seed 42): first 5 steps' mean reward 0.031, last 5 0.149. The bar: the last five at least
# twice the first five and RISE above them (a 5-step mean is 320 samples; a policy that never moves stays below).
RISE = 0.04


def rayward(name: str, tmp_path, **kw) -> dict:
    return run(HERE / name, use="rayward", model=model_path(MODEL_FOR[name]), output_dir=tmp_path / "out",
               timeout=SCRIPT_TIMEOUT_S, **kw)


def test_the_quickstart_learns_with_the_rayward_import(tmp_path):
    r = rayward("quickstart.py", tmp_path)
    assert r["global_step"] == 30
    # the script's TrainerCallback, on the driver: begin, each step's log as the run wrote it, end
    assert r["callback_events"] == {"begin": 1, "end": 1} and r["callback_steps"] == list(range(1, 31)), r
    assert r["last5_reward"] > 2 * r["first5_reward"] and r["last5_reward"] > r["first5_reward"] + RISE, r
    closing = r["closing_row"]  # transformers' closing row (tests/unit/orchestrator/trl/test_trainer.py: its keys)
    assert closing["step"] == 30 and closing["train_runtime"] > 0 and "train_loss" in closing, closing


def test_trls_documented_quickstart_with_its_default_config_runs_on_a_driver_without_a_gpu(tmp_path):
    """TRL's quick start as documented, `GRPOConfig(output_dir=...)` with all of TRL's defaults (bf16 on, no
    use_cpu), which TRL itself refuses on a machine without a GPU: with the rayward import it trains here."""
    r = rayward("docs_quickstart.py", tmp_path)
    assert r["defaults"] == {"bf16": True, "use_cpu": False}
    # TRL's defaults sized it: 3 epochs of the 2 prompts, one prompt's 8 completions a step
    assert r["global_step"] == r["max_steps"] == 6 and len(r["rewards"]) == 6, r
    assert r["closing_row"]["step"] == 6 and r["closing_row"]["epoch"] == 3.0, r


def test_weighted_rewards_defined_in_the_main_block_lambda_and_closure_included(tmp_path):
    r = rayward("weighted_rewards.py", tmp_path)
    assert r["global_step"] == 4
    assert r["reward_names"] == ["letter_reward", "length_reward", "<lambda>"]  # TRL's names, in its log keys
    assert {f"rewards/{n}/mean" for n in r["reward_names"]} <= set(r["reward_keys"])
    assert r["max_weighted_sum_gap"] < 1e-5  # `reward` is the reward_weights-weighted sum, as in TRL


@pytest.mark.parametrize("name", ["curriculum.py", "lora.py", "tools.py", "conversational.py", "environment.py"])
def test_the_other_documentation_scripts_run_with_the_rayward_import(tmp_path, name):
    r = rayward(name, tmp_path)
    if name == "curriculum.py":  # trainer_state as TRL passes it: the steps done so far, and max_steps
        assert r["global_step"] == 5 and r["seen_steps"] == [0, 1, 2, 3, 4] and r["seen_max_steps"] == [5]
    elif name == "lora.py":  # save_model writes the adapter in PEFT's format, not a full model
        assert r["global_step"] == 4 and r["adapter_saved"] and not r["full_model_saved"]
    elif name in ("tools.py", "environment.py"):  # the tools (the class's methods) ran in the environment
        # workers, TRL's tool metrics were logged, and rewards read the episodes' environments
        assert r["global_step"] == 3 and all(f is not None for f in r["tool_call_frequency"])
        assert sum(r["tool_call_frequency"]) > 0 and max(r["rewards"]) > 0, r
    else:  # a held-out split evaluated at steps 2 and 4, and by trainer.evaluate(), under TRL's names
        assert r["global_step"] == 4
        assert {"rewards/letter_reward/mean", "rewards/asked_letter_reward/mean"} <= set(r["reward_keys"])
        assert r["evals_during_training"] >= 2 and "eval_reward" in r["final_eval_keys"], r


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_script_is_valid_trl_usage(tmp_path, script):
    r = run(script, use="trl", model=model_path(MODEL_FOR[script.name]), output_dir=tmp_path / "out",
            timeout=SCRIPT_TIMEOUT_S)
    assert r["global_step"] > 0


def test_a_group_sigterm_ends_a_script_with_a_checkpoint_and_143(tmp_path):
    """`timeout` and SLURM signal the script's whole process group: the quick start (rayward import) finishes its
    step, writes a checkpoint and exits 143 with one line, as `rayward run` does."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.fixtures.trl_scripts.run_script import ROOT, script_source

    script = tmp_path / "quickstart.py"
    script.write_text(script_source(HERE / "quickstart.py", "rayward"))
    out = tmp_path / "out"
    env = {**os.environ, "MODEL": str(model_path("tiny")), "OUTPUT_DIR": str(out), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + SCRIPT_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr[-3000:]
    assert "rayward: stopped at step" in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert any(p.name.startswith("checkpoint-") for p in out.iterdir()), sorted(p.name for p in out.iterdir())
