"""DAPO dynamic sampling on a local Ray cluster: zero-spread groups are dropped and refilled; when refills run
out, the step trains on the groups it accepted."""

from orchestrator.config import load_config
from orchestrator.train import train
from tests.conftest import ROOT

TARGET_GROUPS = 8  # demo: generation_batch_size 64 / num_generations 8


def run(tmp_path, name, function, rounds):
    cfg = load_config(ROOT / "configs" / "demo.yaml", [
        f"logging.dir={tmp_path}", "grpo.max_steps=3", "grpo.dynamic_sampling=true",
        f"grpo.max_refill_rounds={rounds}", f"rewards.0.function=tests.fixtures.ds_rewards:{function}",
        "logging.check_logprob_parity=false",
    ])
    return train(cfg, name=name, show_progress=False)


def test_zero_spread_groups_are_refilled(ray_cluster, tmp_path):
    history = run(tmp_path, "ds-refill", "flat_for_a", rounds=6)
    assert len(history) == 3
    for h in history:
        assert h["dynamic_sampling/accepted_groups"] == TARGET_GROUPS and h["batch/groups"] == TARGET_GROUPS
        assert h["dynamic_sampling/filled"] == 1.0
        assert 0.3 < h["dynamic_sampling/pass_rate"] < 1.0  # ~3/4 of groups have spread
        assert h["frac_reward_zero_std"] == 0.0  # no zero-spread group reached the learner
    assert sum(h["dynamic_sampling/refill_rounds"] for h in history) >= 1


def test_step_completes_on_accepted_groups_when_refills_run_out(ray_cluster, tmp_path):
    history = run(tmp_path, "ds-short", "flat_for_abc", rounds=1)
    assert [h["step"] for h in history] == [1, 2, 3]  # every step completed
    short = [h for h in history if h["dynamic_sampling/filled"] == 0.0]
    assert short, "with 3/4 of groups flat and one refill, some step must come up short"
    for h in short:
        assert 0 < h["batch/groups"] == h["dynamic_sampling/accepted_groups"] < TARGET_GROUPS
        assert h["dynamic_sampling/refill_rounds"] == 1 and h["dynamic_sampling/pass_rate"] < 0.6
