"""`rayward scale` for the environment pool, and `rayward run` refusing bad tools or environments, before Ray or
vLLM start (what the pool does with them: tests/integration/actors/envs/test_pool.py)."""

import pytest

from orchestrator.cli.main import main
from tests.conftest import ROOT

DEMO = str(ROOT / "configs" / "demo.yaml")


def test_env_workers_passes_the_argument_checks(capsys):
    # unreachable address: exit 3 shows the arguments were accepted and Ray was asked
    assert main(["scale", "some-run", "--env-workers", "2", "--address", "127.0.0.1:1"]) == 3
    assert "cannot reach the Ray dashboard at http://127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--env-workers", "2", "--reward-workers", "2"],
                                  ["--env-workers", "2", "--max", "3"]])
def test_one_action_at_a_time(args, capsys):
    assert main(["scale", "some-run", *args, "--address", "127.0.0.1:1"]) == 2
    assert "for the environment pool --env-workers N, or --pool env --min/--max" in capsys.readouterr().err


def test_judge_engines_passes_the_argument_checks_and_judge_needs_a_judge_action(capsys):
    assert main(["scale", "some-run", "--judge-engines", "2", "--judge", "j", "--address", "127.0.0.1:1"]) == 3
    assert "cannot reach the Ray dashboard at http://127.0.0.1:1" in capsys.readouterr().err
    assert main(["scale", "some-run", "--reward-workers", "2", "--judge", "j", "--address", "127.0.0.1:1"]) == 2
    assert "--judge names the judge reward whose engines" in capsys.readouterr().err
    assert main(["scale", "some-run", "--judge-engines", "2", "--env-workers", "1", "--address", "127.0.0.1:1"]) == 2
    assert "for a judge's engines --judge-engines N (--judge REWARD)" in capsys.readouterr().err


def test_env_bounds_are_refused_naming_the_pool_before_connecting(capsys):
    assert main(["scale", "some-run", "--pool", "env", "--min", "5", "--max", "4", "--address", "127.0.0.1:1"]) == 2
    assert "rayward scale: some-run: env autoscaling needs 1 <= min_workers <= max_workers, got 5..4" in (
        capsys.readouterr().err)


@pytest.mark.parametrize(("overrides", "message"), [
    (["environment_factory=tests.fixtures.bad_envs:NoReset"], "class NoReset has no `reset` method"),
    (["tools=[tests.fixtures.bad_envs:no_docstring]"],
     "tools[0] 'tests.fixtures.bad_envs:no_docstring': no tool schema"),
    (["environment_factory=orchestrator.builtin.tasks.boxes:BoxEnv"],
     "model.name_or_path 'tiny' (a chat template TRL does not ship): its chat template cannot render tool calls "
     "(it drops the tool call's name"),
])
def test_run_refuses_bad_tools_and_environments_before_starting_anything(overrides, message, capsys, tiny_model_path):
    import ray

    was_up = ray.is_initialized()
    assert main(["run", DEMO, *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert ray.is_initialized() == was_up


def test_teacher_engines_passes_the_argument_checks_and_is_one_action(capsys):
    assert main(["scale", "some-run", "--teacher-engines", "2", "--address", "127.0.0.1:1"]) == 3
    assert "cannot reach the Ray dashboard at http://127.0.0.1:1" in capsys.readouterr().err
    assert main(["scale", "some-run", "--teacher-engines", "2", "--judge-engines", "1",
                 "--address", "127.0.0.1:1"]) == 2
    assert "for the distillation teacher's --teacher-engines N, or --pool teacher --min/--max" in (
        capsys.readouterr().err)
    assert main(["scale", "some-run", "--pool", "teacher", "--min", "3", "--max", "2", "--address", "127.0.0.1:1"]) == 2
    assert "teacher autoscaling needs 1 <= min_workers <= max_workers, got 3..2" in capsys.readouterr().err


def test_run_refuses_a_teacher_with_another_tokenizer_before_starting_anything(capsys, tiny_model_path, tmp_path):
    """An outside teacher: a tokenizer of another vocabulary (a thinking token added, as some families' next
    version does) beside the tiny model's weights."""
    import shutil

    import ray
    from transformers import AutoTokenizer

    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_path, teacher)
    tok = AutoTokenizer.from_pretrained(teacher)
    tok.add_tokens(["<think>"], special_tokens=True)
    tok.save_pretrained(teacher)
    was_up = ray.is_initialized()
    assert main(["run", DEMO, f"distillation={{teacher: {teacher}}}"]) == 2
    err = capsys.readouterr().err
    assert f"distillation.teacher '{teacher}': its tokenizer is not the policy's" in err and "Traceback" not in err, err
    assert ray.is_initialized() == was_up
