"""What CI runs, said once: every test under tests/unit and tests/integration except SCENARIOS.

`bash scripts/test.sh` (README's test command, which `.ci/run` calls) runs CI's tier; `bash scripts/test.sh --all`
runs it, then the scenarios one file at a time. A scenario is minutes of CPU beyond CI's whole runs (the demo, the
tools run, the agent-endpoint run, a judge's and a teacher's short runs): learning runs, several Ray nodes, jobs on a
`ray start` cluster, chaos, signals and exact resume, a pool's fault and scaling cases, a second engine layout,
process groups. tests/conftest.py marks each test SCENARIOS names `scenario` (so `-m scenario` selects them), and
tests/unit/test_tiers.py fails on an entry that names no test.

An entry is a test file, a test (`file::name`), or a glob over test ids (`fnmatch`), with why it is a scenario.
"""

from __future__ import annotations

SCENARIOS: dict[str, str] = {
    "tests/integration/actors/engines/test_judge_pool.py::test_answers_in_order_across_engines_and_a_killed_engines_requests_answered_once":
        "a judge pool's faults and scaling",
    "tests/integration/actors/engines/test_judge_pool.py::test_rayward_scale_judge_engines": "a judge pool's faults and scaling",
    "tests/integration/actors/engines/test_judge_pool.py::test_the_pool_grows_while_the_judge_is_slow_and_shrinks_back_when_it_is_fast":
        "a judge pool's faults and scaling",
    "tests/integration/actors/envs/test_pool.py::test_rayward_scale_env_workers": "the environment pool's faults, scaling and its start from a config",
    "tests/integration/actors/envs/test_pool.py::test_retiring_workers_finish_their_sessions": "the environment pool's faults, scaling and its start from a config",
    "tests/integration/actors/envs/test_pool.py::test_sigkilled_worker_loses_exactly_its_sessions_and_is_replaced":
        "the environment pool's faults, scaling and its start from a config",
    "tests/integration/actors/envs/test_pool.py::test_sigstopped_worker_is_detected_at_its_deadline_and_replaced":
        "the environment pool's faults, scaling and its start from a config",
    "tests/integration/actors/envs/test_pool.py::test_start_env_pool_from_the_config": "the environment pool's faults, scaling and its start from a config",
    "tests/integration/actors/generation/test_moe_engine.py::test_routes_come_back_from_an_engine_core_in_its_own_process":
        "a second engine layout (vLLM's engine core in its own process)",
    "tests/integration/actors/rewards/test_pool.py::test_a_stopped_worker_does_not_hold_up_the_learners_state_push":
        "the reward pool's faults and scaling",
    "tests/integration/actors/rewards/test_pool.py::test_a_worker_that_cannot_be_placed_does_not_hold_up_scoring":
        "the reward pool's faults and scaling",
    "tests/integration/actors/rewards/test_pool.py::test_autoscaling_grows_for_a_held_batch_and_shrinks_when_idle":
        "the reward pool's faults and scaling",
    "tests/integration/actors/rewards/test_pool.py::test_hung_reward_is_cut_at_its_timeout": "the reward pool's faults and scaling",
    "tests/integration/actors/rewards/test_pool.py::test_rayward_scale_pins_the_count_and_min_max_resume_autoscaling":
        "the reward pool's faults and scaling",
    "tests/integration/actors/rewards/test_pool.py::test_scale_up_and_down_mid_batch_scores_every_sample_once":
        "the reward pool's faults and scaling",
    "tests/integration/actors/rewards/test_pool.py::test_sigkilled_worker_is_replaced_and_its_chunks_rerun":
        "the reward pool's faults and scaling",
    "tests/integration/actors/weights/test_transfer.py": "weight transfer into engines of its own, several layouts",
    "tests/integration/cluster/test_multinode.py": "several Ray nodes on one machine (cluster/local_cluster.sh), or SLURM's daemons",
    "tests/integration/cluster/test_multinode_learner.py": "several Ray nodes on one machine (cluster/local_cluster.sh), or SLURM's daemons",
    "tests/integration/cluster/test_node_loss.py": "several Ray nodes on one machine (cluster/local_cluster.sh), or SLURM's daemons",
    "tests/integration/cluster/test_prometheus.py": "several Ray nodes on one machine (cluster/local_cluster.sh), or SLURM's daemons",
    "tests/integration/cluster/test_slurm.py": "several Ray nodes on one machine (cluster/local_cluster.sh), or SLURM's daemons",
    "tests/integration/orchestrator/cli/test_cli.py::test_a_failing_reward_at_step_3_is_one_short_block": "a run of its own that fails at step 3",
    "tests/integration/orchestrator/cli/test_jobs.py": "a `ray start --head` cluster and jobs submitted to it",
    "tests/integration/orchestrator/telemetry/test_trackers_resume.py": "two runs: stopped by SIGTERM, resumed",
    "tests/integration/orchestrator/trl/test_in_process.py": "TRL scripts, each a run of its own (and through TRL itself)",
    "tests/integration/orchestrator/trl/test_scripts.py": "TRL scripts, each a run of its own (and through TRL itself)",
    "tests/integration/orchestrator/trl/test_submit.py": "a TRL script submitted to a `ray start --head` cluster",
    "tests/integration/runs/agentic/test_async_learning.py": "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/test_fleet.py": "a run scaled 1 -> 2 -> 1 generators through its dashboard, one engine killed",
    "tests/integration/runs/agentic/test_tools_run.py::test_rayward_eval_runs_the_tools": "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/agentic/test_trl_patterns.py::test_an_environment_that_owns_its_data_writes_the_prompts":
        "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/agentic/test_trl_patterns.py::test_rayward_trains_on_a_dataset_with_only_an_environment_column":
        "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/agentic/test_trl_patterns.py::test_rayward_trains_without_a_dataset": "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/agentic/test_trl_patterns.py::test_the_alarm_tools_own_timeout_reads_the_same_in_both":
        "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/agentic/test_trl_patterns.py::test_the_reward_function_reads_each_games_own_state":
        "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/agentic/test_trl_patterns.py::test_the_sql_environments_reward_is_its_get_reward":
        "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/agentic/test_trl_patterns.py::test_tools_answer_in_rayward_as_often_as_in_trl": "agentic runs beyond CI's tools and agent runs",
    "tests/integration/runs/faults/test_exact_resume.py": "runs stopped, killed and resumed",
    "tests/integration/runs/faults/test_recovery.py": "runs stopped, killed and resumed",
    "tests/integration/runs/test_code_task.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_distill_faults.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_distill_run.py::test_the_student_moves_to_the_teacher_and_its_reward_rises":
        "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_distill_run.py::test_with_tools_the_teacher_scores_the_models_tokens": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_eval.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_judge_faults.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_judge_run.py::test_the_lazy_runs_advantages_are_the_eager_runs_to_the_bit":
        "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_lazy_gating.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_learner_placement.py::test_spread_on_the_embedded_cluster_is_one_line_from_the_cli":
        "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_lora.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_moe.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_async.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_pipelined.py": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_resume.py::test_without_an_address_a_run_starts_its_own_cluster_beside_the_machines_own":
        "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_vlm.py::test_a_short_run_whose_tool_returns_images_evaluates_and_logs_each_image":
        "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_vlm.py::test_a_short_vlm_run_evaluates_and_logs_which_image_each_sample_saw":
        "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_vlm.py::test_the_vlm_config_learns_what_only_the_image_tells": "a learning run, or a run of its own beyond CI's demo",
    "tests/integration/runs/test_vlm.py::test_the_vlm_tools_config_learns_what_only_the_tools_image_tells": "a learning run, or a run of its own beyond CI's demo",
    "tests/unit/actors/learner/test_gpu_smoke.py::test_the_dry_run_on_the_cpu_passes_every_check_a_cpu_can_run":
        "the GPU smoke script's dry run on the CPU (a subprocess loading models)",
    "tests/unit/actors/learner/test_learner_fsdp.py": "FSDP process groups of two ranks (gloo)",
    "tests/unit/actors/learner/test_moe.py::test_two_fsdp_ranks_train_an_moe_as_one": "FSDP process groups of two ranks (gloo)",
    "tests/unit/orchestrator/builtin/models/test_gates.py::test_warmed_up_models_pass_their_gates_on_another_cpu":
        "five SFT builds on another CPU (minutes)",
    "tests/integration/actors/generation/*[engine-core-process*":
        "every generator and engine-loop test again on a second engine layout (vLLM's engine core in its own process)",
}
