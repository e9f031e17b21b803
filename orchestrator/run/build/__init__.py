"""Building a run: check everything cheap first (`prepare`), then start the actor groups the loop drives
(`start_groups`), then assemble the run from them (`assemble_run`; the loop tests assemble theirs from fakes
of the groups, tests/fixtures/fakes.py, with the same function). `build_run` is the last two.

Every choice (how many generators, where reward workers go, which loss, the selector, the evaluator) is made
here, when the run is built; the loop only calls phases on it.

    specs.py     what each actor is built from, read off the config (pure)
    checks.py    the cheap checks before Ray starts -> `Prepared`
    start.py     the actor groups started -> `Groups`
    assemble.py  the `Run` from its groups; recovery's new learner; teardown
"""

from orchestrator.run.build.assemble import (
    assemble_run,
    build_run,
    eval_set,
    evaluator,
    observed,
    rebuild_learner,
    replace_learner,
    run_evaluator,
    run_logger,
    selector,
    shutdown_run,
)
from orchestrator.run.build.checks import (
    Prepared,
    check_judge_templates,
    check_learner_model,
    check_moe,
    load_images,
    load_tokenizer,
    prepare,
    prepare_eval,
)
from orchestrator.run.build.specs import (
    JUDGE_MAX_MODEL_LEN,
    agent_kwargs,
    autoscale_settings,
    check_teacher_tokenizer,
    engine_pool_kwargs,
    generator_cpu_share,
    judge_spec,
    learner_concurrency,
    learner_spec,
    lora_kwargs,
    loss_config,
    overlapped_sync,
    resolve_judges,
    resolve_model,
    resolve_path,
    reward_specs,
    rollout_kind,
    teacher_spec,
    training_sampling,
)
from orchestrator.run.build.start import (
    EVAL_REWARD_WORKERS,
    Groups,
    ray_node_id,
    start_env_pool,
    start_generators,
    start_groups,
    start_judge_pools,
    start_learner,
    start_reward_pool,
    start_teacher_pool,
    weight_transfer,
)

__all__ = [
    "JUDGE_MAX_MODEL_LEN",
    "agent_kwargs",
    "autoscale_settings",
    "check_teacher_tokenizer",
    "engine_pool_kwargs",
    "generator_cpu_share",
    "judge_spec",
    "learner_concurrency",
    "learner_spec",
    "lora_kwargs",
    "loss_config",
    "overlapped_sync",
    "resolve_judges",
    "resolve_model",
    "resolve_path",
    "reward_specs",
    "rollout_kind",
    "teacher_spec",
    "training_sampling",
    "Prepared",
    "check_judge_templates",
    "check_learner_model",
    "check_moe",
    "load_images",
    "load_tokenizer",
    "prepare",
    "prepare_eval",
    "EVAL_REWARD_WORKERS",
    "Groups",
    "ray_node_id",
    "start_env_pool",
    "start_generators",
    "start_groups",
    "start_judge_pools",
    "start_learner",
    "start_reward_pool",
    "start_teacher_pool",
    "weight_transfer",
    "assemble_run",
    "build_run",
    "eval_set",
    "evaluator",
    "observed",
    "rebuild_learner",
    "replace_learner",
    "run_evaluator",
    "run_logger",
    "selector",
    "shutdown_run",
]
