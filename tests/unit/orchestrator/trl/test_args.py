"""TRL's GRPOConfig as a rayward run (orchestrator/trl/args.py): every field classified and read, TRL's defaults
kept, what rayward cannot honour refused by name."""

from __future__ import annotations

import dataclasses

import pytest

trl = pytest.importorskip("trl")

from orchestrator.config import ConfigError, parse_config  # noqa: E402
from orchestrator.trl import args as trl_args  # noqa: E402

pytestmark = pytest.mark.slow  # imports TRL


def args(**kw):
    return trl.GRPOConfig(output_dir="/tmp/rayward-trl-args", use_cpu=True, **kw)


def test_every_field_of_trls_grpoconfig_is_classified_and_every_mapped_one_is_read():
    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert names - set(trl_args.FIELDS) == set(), "a GRPOConfig field rayward does not classify"
    assert set(trl_args.FIELDS) - names == set(), "FIELDS names a field TRL does not have"
    trl_args._Reader.read.clear()
    trl_args.run_tree(args(eval_strategy="steps", eval_steps=5), train_rows=100, has_eval=True, model_max_len=None)
    mapped = {k for k, v in trl_args.FIELDS.items() if isinstance(v, trl_args.Mapped)}
    assert mapped - trl_args._Reader.read == set(), "a Mapped field run_tree never reads"


def _config_field(path: str):
    """The RunConfig field a Mapped target names ("section.field", "field" or "section"), or None."""
    import typing

    from orchestrator.config import RunConfig

    model = RunConfig
    for part in path.split("."):
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        # through `X | None` and `list[X]` to the section's model
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        kinds += [a for k in kinds for a in typing.get_args(k)]
        model = next((k for k in kinds if hasattr(k, "model_fields")), None)
    return field


def test_every_mapped_target_is_a_config_field_and_every_mapped_field_reaches_it():
    """The one mapping: each Mapped target (what docs/trl.md prints) is a field of rayward's config, and the
    tree run_tree builds has a value there for every Mapped field."""
    targets = {name: kind.target for name, kind in trl_args.FIELDS.items() if isinstance(kind, trl_args.Mapped)}
    assert {n: t for n, t in targets.items() if _config_field(t) is None} == {}
    tree = trl_args.run_tree(args(eval_strategy="steps", eval_steps=5, reward_weights=[1.0]), train_rows=100,
                             has_eval=True, model_max_len=None)
    missing = []
    for name, target in targets.items():
        node = tree
        for part in target.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:
            missing.append(name)
    assert missing == []
    assert tree["rewards"] == [{"weight": 1.0}] and tree["logging"]["dir"] == "/tmp"


def test_a_script_relying_on_the_defaults_trains_with_trls_defaults():
    a = args(per_device_train_batch_size=4, gradient_accumulation_steps=3, num_generations=4)
    tree = trl_args.run_tree(a, train_rows=100, has_eval=False, model_max_len=4096)
    g, o = tree["generation"], tree["grpo"]
    assert (o["lr_scheduler_type"], tree["seed"], g["max_completion_length"], o["learning_rate"]) == (
        "linear", 42, 512, 1e-6)
    assert g["generation_batch_size"] == 12 and o["per_device_train_batch_size"] == 4  # bs x GA per step
    # max_steps -1: num_train_epochs (3) x ceil(100 rows / 3 prompts per step)
    assert o["max_steps"] == 3 * 34
    assert (o["loss_type"], o["beta"], o["epsilon"], o["save_steps"]) == ("dapo", 0.0, 0.2, 500)
    assert g["max_model_len"] == 512 + trl_args.PROMPT_ROOM_TOKENS
    assert tree["logging"]["log_completions"] is False and tree["logging"]["report_to"] == ["jsonl"]
    cfg = parse_config({**{k: v for k, v in tree.items() if k not in ("eval", "reward_weights", "output_dir")},
                        "rewards": [{"name": "r", "function": "letter_fraction"}]})
    assert cfg.grpo.lr_scheduler_type == "linear" and cfg.seed == 42


def test_fractions_and_spellings_map_as_transformers_reads_them():
    tree = trl_args.run_tree(args(max_steps=40, warmup_steps=0.1, save_steps=0.5, optim="adamw_torch_fused",
                                  lr_scheduler_type="constant_with_warmup", scale_rewards="none",
                                  report_to=["tensorboard", "wandb"]),
                             train_rows=10, has_eval=False, model_max_len=None)
    o = tree["grpo"]
    assert (o["warmup_steps"], o["save_steps"], o["optim"], o["lr_scheduler_type"], o["scale_rewards"]) == (
        4, 20, "adamw_torch", "constant", "none")
    assert tree["logging"]["report_to"] == ["jsonl", "tensorboard", "wandb"]
    assert trl_args.run_tree(args(max_steps=4, save_strategy="no"), train_rows=10, has_eval=False,
                             model_max_len=None)["grpo"]["save_steps"] == 4  # only the final checkpoint
    # an MoE's load-balancing loss: TRL's field and rule (None: the model config's coefficient), as rayward's
    for coef in (None, 0.0, 0.02):
        assert trl_args.run_tree(args(max_steps=4, router_aux_loss_coef=coef), train_rows=10, has_eval=False,
                                 model_max_len=None)["grpo"]["router_aux_loss_coef"] == coef


def logging_of(installed=("mlflow", "tensorboard", "wandb", "trackio"), **kw) -> dict:
    """The logging section of args(**kw), built and mapped on a machine with the `installed` integrations."""
    from unittest import mock

    found = "transformers.integrations.get_available_reporting_integrations"
    with mock.patch(found, lambda: list(installed)):
        return trl_args.run_tree(args(**kw), train_rows=10, has_eval=False, model_max_len=None)["logging"]


def test_trackers_run_name_and_project_map_to_the_logging_section():
    """TRL's report_to with trackio among rayward's trackers; "all" (which transformers has already turned
    into the installed integrations) as the installed trackers; run_name and a project the script set go to
    the trackers, TRL's default project ("huggingface", only trackio's in TRL) leaves rayward's default."""
    got = logging_of(report_to="trackio", run_name="lr-sweep-3", project="letters")
    assert (got["report_to"], got["run_name"], got["project"]) == (
        ["jsonl", "trackio"], "lr-sweep-3", "letters")
    unset = logging_of(report_to="none")
    assert (unset["report_to"], unset["run_name"], unset["project"]) == (["jsonl"], None, None)
    # "all" as the script writes it, whatever is installed; the installed list written out means the same
    some = ("wandb", "codecarbon")
    assert logging_of(some, report_to="all")["report_to"] == ["jsonl", "wandb"]
    assert logging_of(some, report_to=["codecarbon", "wandb"])["report_to"] == ["jsonl", "wandb"]
    assert logging_of(report_to="all")["report_to"] == ["jsonl", "mlflow", "tensorboard", "wandb", "trackio"]
    assert logging_of(report_to=["all", "wandb"])["report_to"] == ["jsonl", "all"]
    with pytest.raises(ConfigError, match=r"GRPOConfig.report_to: \['codecarbon'\] are not rayward sinks"):
        logging_of((*some, "trackio"), report_to=["codecarbon", "wandb"])


@pytest.mark.parametrize("kw, named", [
    ({"entropy_coef": 0.1}, "GRPOConfig.entropy_coef=0.1"),
    ({"push_to_hub": True, "hub_model_id": "me/x"}, "GRPOConfig.push_to_hub=True"),
    ({"top_entropy_quantile": 0.2, "min_p": 0.1}, "GRPOConfig.min_p=0.1"),
])
def test_a_field_rayward_cannot_honour_is_named_before_anything_starts(kw, named):
    with pytest.raises(ConfigError) as err:
        trl_args.check_fields(args(**kw))
    assert named in str(err.value) and "instead:" in str(err.value)


@pytest.mark.parametrize("kw, named", [
    ({"optim": "adafactor"}, "GRPOConfig.optim='adafactor'"),
    ({"lr_scheduler_type": "polynomial"}, "GRPOConfig.lr_scheduler_type='polynomial'"),
    ({"steps_per_generation": 4}, "GRPOConfig.generation_batch_size=32 (steps_per_generation=4)"),
    ({"report_to": "comet_ml"}, "GRPOConfig.report_to"),
    ({"model_init_kwargs": {"device_map": "auto"}}, "GRPOConfig.model_init_kwargs['device_map']"),
    ({"eval_strategy": "steps", "eval_steps": 2}, "give eval_dataset too"),
])
def test_values_rayward_cannot_map_are_named(kw, named):
    with pytest.raises(ConfigError) as err:
        trl_args.run_tree(args(max_steps=4, **kw), train_rows=10, has_eval=False, model_max_len=None)
    assert named in str(err.value)


def notes(a) -> list[str]:
    """check_fields' lines but the autocast one (TRL turns bf16 on by itself, on a CPU with use_cpu too)."""
    return [n for n in trl_args.check_fields(a) if not n.startswith("GRPOConfig.bf16/fp16")]


def test_ignored_fields_say_so_in_one_line_each_and_untouched_ones_say_nothing():
    assert notes(args()) == []
    said = notes(args(dataloader_num_workers=4, save_total_limit=2, logging_steps=1))
    assert sorted(n.split("=")[0] for n in said) == ["GRPOConfig.dataloader_num_workers", "GRPOConfig.save_total_limit"]
    assert trl_args.check_fields(args(bf16=True))[0].startswith("GRPOConfig.bf16/fp16: rayward's learner does not")


def test_a_field_a_newer_trl_adds_is_refused_when_set():
    @dataclasses.dataclass
    class NewerConfig(trl.GRPOConfig):
        shiny_new_knob: float = 0.0

    assert notes(NewerConfig(output_dir="/tmp/x", use_cpu=True)) == []
    with pytest.raises(ConfigError, match="GRPOConfig.shiny_new_knob=1.5: rayward does not know this field"):
        trl_args.check_fields(NewerConfig(output_dir="/tmp/x", use_cpu=True, shiny_new_knob=1.5))


def test_the_docs_table_is_current():
    from scripts.update_trl_table import PAGE, current

    assert current(PAGE.read_text()) == trl_args.field_table(), (
        "docs/trl.md is stale: run `python scripts/update_trl_table.py`")
