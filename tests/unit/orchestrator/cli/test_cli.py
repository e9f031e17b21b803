"""Bad input fails fast with one clear line naming the field or function, before Ray or vLLM start."""


import pytest

from orchestrator.cli.main import main
from tests.conftest import ROOT

DEMO = str(ROOT / "configs" / "demo.yaml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([DEMO, "generation.num_generatons=4"], "generation.num_generatons: Extra inputs are not permitted"),
        ([DEMO, "grpo.loss_type=ppo"], "grpo.loss_type: Input should be"),
        ([DEMO, "rewards.0.function=no_such_module:fn"],
         "rewards[letter].function: reward 'letter': function 'no_such_module:fn': cannot import 'no_such_module'"),
        ([DEMO, "rewards.0.function=actors.rewards.builtin:nope"], "has no attribute 'nope'"),
        ([DEMO, "rewards.0.function=lettr_fraction"], "unknown built-in 'lettr_fraction'"),
        ([DEMO, "rewards.0.function=accuracy_reward"],
         "rewards[letter].function: trl.rewards:accuracy_reward takes the dataset column(s) ['solution']"),
        ([DEMO, "data.path=/nonexistent/prompts.jsonl"], "data.path '/nonexistent/prompts.jsonl': cannot load"),
        ([DEMO, "data.prompt_column=question"], "data.prompt_column 'question' not in dataset"),
        ([DEMO, "model.name_or_path=/nonexistent/model"],
         "model.name_or_path '/nonexistent/model': cannot load tokenizer"),
        ([DEMO, 'model.lora={"r": 8, "target_modules": ["q_prj"]}'],
         "model.lora.target_modules ['q_prj']: match no layer of Qwen2ForCausalLM"),
        ([DEMO, "model.lora.target_modules=[lm_head]"],
         "model.lora.target_modules ['lm_head']: adapt ['lm_head (Linear)']"),
        ([DEMO, "grpo.gradient_checkpointing_kwargs={use_reentrnt: true}"],
         "grpo.gradient_checkpointing_kwargs: ['use_reentrnt'] are not arguments of torch.utils.checkpoint.checkpoint"),
        ([str(ROOT / "nope.yaml")], "config file not found"),
        ([DEMO, "rewards.1.judge.template={x} y"], "override 'rewards.1.judge.template': its value is not YAML"),
        ([DEMO, "eval={data: {path: toy, prompt_column: question}}"],
         "eval.data.prompt_column 'question' not in dataset 'toy'"),
        ([DEMO, "eval={data: {path: /nonexistent/held_out.jsonl}}"],
         "eval.data.path '/nonexistent/held_out.jsonl': cannot load"),
        ([DEMO, "eval={data: {path: toy}}", "eval.num_generations=0"],
         "eval.num_generations: Input should be greater than or equal to 1"),
        ([DEMO, "eval={data: {path: toy}, rewards: [{name: x, function: lettr}]}"],
         "eval.rewards[x].function: unknown built-in 'lettr'"),
        ([DEMO, "eval={data: {path: toy}}", "grpo.save_best=eval/accuracy"],
         "grpo.save_best 'eval/accuracy': eval produces no such metric (it produces ['eval/reward', "),
        ([DEMO, "grpo.save_best=eval/reward"], "grpo.save_best 'eval/reward' needs an eval block"),
    ],
)
def test_run_rejects_bad_input_before_starting_anything(args, message, capsys, tiny_model_path):
    import ray

    was_up = ray.is_initialized()  # the integration tests' session cluster may be up in a full run
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert ray.is_initialized() == was_up  # failed before Ray was touched


@pytest.mark.parametrize(("config", "override", "message"), [
    ("judge.yaml", "rewards.1.judge.template='{nosuchcol} {completion}'",
     "rewards[judge].judge.template: fields ['nosuchcol'] are neither ['prompt', 'completion', 'conversation'] nor "
     "dataset columns (the dataset has ['letter', 'prompt'])"),
    ("judge.yaml", "rewards.1.judge.template='Letter: {letter}. Correct?'",  # issue 52: the judge sees no answer
     "rewards[judge].judge.template: names neither {completion} nor {conversation}, so the judge never reads the "
     "completion it scores (its fields: ['letter'])"),
    ("curriculum.yaml", "data.difficulty.weights={learnable: -1.0}",
     "data.difficulty.weights: learnable is -1 at step 0"),
])
def test_bad_judge_templates_and_curriculum_weights_fail_before_any_model_is_built(config, override, message, capsys,
                                                                                   tmp_path, monkeypatch):
    """The preset's built-in judge (and policy) are never built: the bad field is found by the cheap checks."""
    import ray

    monkeypatch.setenv("RAYWARD_CACHE", str(tmp_path / "cache"))  # an empty cache: a build would show up in it
    was_up = ray.is_initialized()
    assert main(["run", str(ROOT / "configs" / config), override]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err  # "invalid config:" and the field
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert ray.is_initialized() == was_up


def test_gradient_checkpointing_on_a_model_without_it_is_a_config_error(no_checkpointing_model_path, capsys):
    import ray

    was_up = ray.is_initialized()
    assert main(["run", DEMO, f"model.name_or_path={no_checkpointing_model_path}"]) == 2
    err = capsys.readouterr().err
    assert "grpo.gradient_checkpointing: JetMoeForCausalLM does not support gradient checkpointing" in err, err
    assert ray.is_initialized() == was_up


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([DEMO, "--checkpoint", "/nonexistent/checkpoint-40"],
         "--checkpoint '/nonexistent/checkpoint-40': not an HF model directory"),
        ([DEMO, "eval={data: {path: toy, prompt_column: question}}"],
         "eval.data.prompt_column 'question' not in dataset 'toy'"),
        ([DEMO, "eval={data: {path: toy}}", "eval.num_generations=0"],
         "eval.num_generations: Input should be greater than or equal to 1"),
        ([DEMO, "rewards.0.function=lettr_fraction"], "rewards[letter].function: unknown built-in 'lettr_fraction'"),
    ],
)
def test_eval_rejects_bad_input_before_starting_anything(args, message, capsys, tiny_model_path):
    import ray

    was_up = ray.is_initialized()
    assert main(["eval", *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert ray.is_initialized() == was_up


def test_scale_unreachable_address_is_one_line(capsys):
    code = main(["scale", "no-such-run", "--reward-workers", "2", "--address", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert (code == 3 and "cannot reach the Ray dashboard at http://127.0.0.1:1" in err
            and len(err.strip().splitlines()) == 1)


@pytest.mark.parametrize("args", [[], ["--reward-workers", "4", "--max", "8"]])
def test_scale_wants_a_count_or_bounds(args, capsys):
    assert main(["scale", "some-run", *args, "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "give --reward-workers N (a fixed count) or --min/--max (autoscaling bounds)" in err


def test_scale_refuses_bad_bounds_before_connecting(capsys):
    # the address is unreachable: exit 2, not 3, shows the bounds were refused before Ray was asked
    assert main(["scale", "some-run", "--min", "5", "--max", "4", "--address", "127.0.0.1:1"]) == 2
    assert "rayward scale: some-run: reward autoscaling needs 1 <= min_workers <= max_workers, got 5..4" in (
        capsys.readouterr().err)


def test_overrides_may_follow_options(capsys):
    # the override after --checkpoint is applied: its error comes first, before the checkpoint is looked at
    assert main(["eval", DEMO, "--checkpoint", "/nonexistent/ck", "grpo.max_steps=0"]) == 2
    assert "grpo.max_steps: Input should be greater than or equal to 1" in capsys.readouterr().err


def test_unknown_options_are_still_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["eval", DEMO, "--checkpont", "x"])
    assert "unrecognized arguments: --checkpont x" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", DEMO, "--name", "x", "grpo.max_steps=3", "seed=1"],
        ["run", DEMO, "grpo.max_steps=3", "--name", "x", "seed=1"],
        ["run", "--name", "x", DEMO, "grpo.max_steps=3", "seed=1"],
        ["run", DEMO, "grpo.max_steps=3", "--name", "x", "--verbose", "seed=1"],
    ],
)
def test_overrides_anywhere_on_the_line_keep_their_order(argv):
    from orchestrator.cli.main import parse_args

    args = parse_args(argv)
    assert (args.config, args.name, args.overrides) == (DEMO, "x", ["grpo.max_steps=3", "seed=1"])


def test_submit_takes_overrides_after_options_and_other_strays_are_errors(capsys):
    from orchestrator.cli.main import parse_args

    args = parse_args(["submit", DEMO, "--name", "x", "grpo.max_steps=3", "--debug", "--address", "http://h:8265"])
    assert args.overrides == ["grpo.max_steps=3"] and args.debug and args.address == "http://h:8265"
    for argv in (["run", DEMO, "--name", "x", "stray"], ["run", DEMO, "--nope"], ["rewards", "a=1"]):
        with pytest.raises(SystemExit) as info:
            parse_args(argv)
        assert info.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err


def test_samples_and_plot_of_a_missing_run_are_one_line(tmp_path, capsys):
    for cmd in ("samples", "plot"):
        assert main([cmd, "nope", "--dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"rayward {cmd}: no run 'nope'") and len(err.splitlines()) == 1, err
