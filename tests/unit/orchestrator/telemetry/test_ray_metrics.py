"""Step metrics -> rayward's tagged Ray gauges (pure mapping; the export itself: tests/integration)."""

from __future__ import annotations

from orchestrator.telemetry.ray_metrics import GAUGES, map_step_metrics


def test_step_metrics_map_onto_tagged_gauges():
    m = {
        "reward": 0.4, "reward_std": 0.1, "rewards/letter/mean": 0.3, "rewards/letter/std": 0.2,
        "rewards/letter/gated_mean": 0.3, "rewards/letter/latency_s": 0.05, "rewards/letter/timeouts": 0,
        "rewards/fmt/mean": float("nan"), "gates/fmt<-letter/closed_frac": 0.75, "time/generate": 1.5,
        "time/reward": 0.2, "time/train": 2.0, "time/sync": 0.3, "time/step": 4.1, "tokens_per_s": 900.0,
        "sampling/sampling_logp_difference/max": 2e-6, "global_step": 7, "loss": 0.01, "kl": None,
        "policy_version": 6, "completions/mean_length": 12.0, "note": "text",
        "sync/gather_s": 0.1, "sync/transfer_s": 0.2, "sync/load_s": 0.05, "sync/bytes": 4e8, "sync/gb_per_s": 1.2,
        "reward_pool/workers": 3,
        "reward_pool/target_workers": 5, "reward_pool/queue_wait_s": 0.4, "reward_pool/utilization": 0.6,
    }
    got = {(n, tuple(sorted(t.items()))): v for n, v, t in map_step_metrics("r1", 7, m)}

    def g(name, **tags):
        return got[(name, tuple(sorted({"run": "r1", **tags}.items())))]

    assert g("rayward_global_step") == 7
    assert g("rayward_reward") == 0.4 and g("rayward_reward_std") == 0.1
    assert g("rayward_reward_fn_mean", reward="letter") == 0.3
    assert ("rayward_reward_fn_mean", (("reward", "fmt"), ("run", "r1"))) not in got  # NaN skipped
    assert g("rayward_reward_fn_latency_s", reward="letter") == 0.05
    assert g("rayward_reward_fn_timeouts", reward="letter") == 0
    assert g("rayward_gate_closed_frac", gate="fmt<-letter") == 0.75
    assert {p: g("rayward_phase_seconds", phase=p) for p in ("generate", "reward", "train", "sync", "step")} == {
        "generate": 1.5, "reward": 0.2, "train": 2.0, "sync": 0.3, "step": 4.1}
    assert g("rayward_weight_sync_s") == 0.3 and g("rayward_tokens_per_s") == 900.0
    assert g("rayward_logprob_gap_max") == 2e-6 and g("rayward_policy_version") == 6
    assert {p: g("rayward_weight_sync_part_s", part=p) for p in ("gather", "transfer", "load")} == {
        "gather": 0.1, "transfer": 0.2, "load": 0.05}
    assert g("rayward_weight_sync_bytes") == 4e8 and g("rayward_weight_sync_gb_per_s") == 1.2
    assert g("rayward_reward_pool_workers") == 3 and g("rayward_reward_pool_target_workers") == 5
    assert g("rayward_reward_pool_queue_wait_s") == 0.4 and g("rayward_reward_pool_utilization") == 0.6
    assert {n for n, _ in got} <= set(GAUGES)
    assert not any(n == "rayward_kl" for n, _ in got)  # None skipped


def test_non_numbers_are_skipped():
    got = {n for n, _, _ in map_step_metrics("r", 1, {"reward": 1.0, "time/generate": "not a number"})}
    assert "rayward_reward" in got and "rayward_phase_seconds" not in got


def test_eval_metrics_map_onto_eval_gauges_without_moving_the_step():
    m = {"eval/reward": 0.4, "eval/rewards/letter/mean": 0.3, "eval/pass@1": 0.25, "eval/pass@4": 0.6,
         "eval/mean_length": 12.0, "eval/policy_version": 10, "eval/seconds": 1.5}
    got = {(n, tuple(sorted(t.items()))): v for n, v, t in map_step_metrics("r1", 10, m, with_step=False)}
    assert got == {
        ("rayward_eval_reward", (("run", "r1"),)): 0.4,
        ("rayward_eval_reward_fn_mean", (("reward", "letter"), ("run", "r1"))): 0.3,
        ("rayward_eval_pass_at", (("k", "1"), ("run", "r1"))): 0.25,
        ("rayward_eval_pass_at", (("k", "4"), ("run", "r1"))): 0.6,
        ("rayward_eval_mean_length", (("run", "r1"),)): 12.0,
        ("rayward_eval_policy_version", (("run", "r1"),)): 10,
    }
    assert {n for n, _ in got} <= set(GAUGES)


def test_learner_and_multiturn_metrics_map_onto_their_gauges():
    """The learner's packing metrics and an agentic step's multiturn/* metrics (orchestrator/loop/rollout.py) reach
    Prometheus: the conversation shape, tool health and stop reasons a platform team watches."""
    m = {"learner/tokens_per_s": 190.0, "learner/padding_frac": 0.0, "learner/micro_batches": 2,
         "multiturn/turns": 2.8, "multiturn/tool_calls": 1.9, "multiturn/tool_failures": 0.1, "multiturn/env_s": 0.3,
         "multiturn/tokens/model": 44.0, "multiturn/tokens/tool": 39.0, "multiturn/template_mismatch_frac": 0.0,
         "multiturn/stop_reason/eos": 0.9, "multiturn/stop_reason/max_turns": 0.1}
    got = {(n, tuple(sorted(t.items()))): v for n, v, t in map_step_metrics("r1", 3, m, with_step=False)}
    run = (("run", "r1"),)
    assert got == {
        ("rayward_learner_tokens_per_s", run): 190.0,
        ("rayward_learner_padding_frac", run): 0.0,
        ("rayward_learner_micro_batches", run): 2,
        ("rayward_multiturn_turns", run): 2.8,
        ("rayward_multiturn_tool_calls", run): 1.9,
        ("rayward_multiturn_tool_failures", run): 0.1,
        ("rayward_multiturn_env_s", run): 0.3,
        ("rayward_multiturn_tokens", (("kind", "model"), *run)): 44.0,
        ("rayward_multiturn_tokens", (("kind", "tool"), *run)): 39.0,
        ("rayward_multiturn_template_mismatch_frac", run): 0.0,
        ("rayward_multiturn_stop_reason", (("reason", "eos"), *run)): 0.9,
        ("rayward_multiturn_stop_reason", (("reason", "max_turns"), *run)): 0.1,
    }
    assert {n for n, _ in got} <= set(GAUGES)
