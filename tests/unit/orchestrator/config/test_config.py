
import pytest
from pydantic import ValidationError

from orchestrator.config import ConfigError, RunConfig, apply_overrides, load_config, parse_config
from tests.conftest import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
MINIMAL = {"rewards": [{"name": "r", "function": "letter_fraction"}]}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_preset_parses(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig) and cfg.rewards


def test_presets_exist():
    assert {"demo.yaml"} <= {p.name for p in CONFIGS}


def test_unknown_key_names_the_field_path():
    with pytest.raises(ConfigError, match=r"generation\.num_generatons"):
        parse_config({**MINIMAL, "generation": {"num_generatons": 4}})


def test_bad_value_names_the_field_path():
    with pytest.raises(ConfigError, match=r"grpo\.learning_rate"):
        parse_config({**MINIMAL, "grpo": {"learning_rate": -1}})
    with pytest.raises(ConfigError, match=r"rewards\.0\.on_error"):
        parse_config({"rewards": [{"name": "r", "function": "letter_fraction", "on_error": "ignore"}]})


def test_kv_after_update_takes_keep_or_recompute_and_refuses_anything_else_naming_the_field():
    assert parse_config(MINIMAL).generation.kv_after_update == "recompute"
    assert parse_config({**MINIMAL, "generation": {"kv_after_update": "keep"}}).generation.kv_after_update == "keep"
    with pytest.raises(ConfigError, match=r"generation\.kv_after_update"):
        parse_config({**MINIMAL, "generation": {"kv_after_update": "reuse"}})


def test_batch_must_divide_into_groups():
    with pytest.raises(ConfigError, match="multiple of num_generations"):
        parse_config({**MINIMAL, "generation": {"num_generations": 3, "generation_batch_size": 8}})
    with pytest.raises(ConfigError, match="per_device_train_batch_size"):
        parse_config({**MINIMAL, "generation": {"generation_batch_size": 32},
                      "grpo": {"per_device_train_batch_size": 12}})


def test_reward_needs_exactly_one_source():
    """Neither source names an environment's get_reward(): only with an environment_factory."""
    with pytest.raises(ConfigError, match="no `function`, `model` or `judge`, which names an environment's get_reward"):
        parse_config({"rewards": [{"name": "r"}]})
    with pytest.raises(ConfigError, match="give one of `function`, `model` or `judge`, not function and model"):
        parse_config({"rewards": [{"name": "r", "function": "letter_fraction", "model": "m"}]})
    with pytest.raises(ConfigError, match="not model and judge"):
        parse_config({"rewards": [{"name": "r", "model": "m", "judge": JUDGE}]})
    with pytest.raises(ConfigError, match="rewards: give at least one reward"):
        parse_config({"rewards": []})
    cfg = parse_config({"rewards": [{"name": "BoxEnv", "weight": 2.0}],
                        "environment_factory": "orchestrator.builtin.tasks.boxes:BoxEnv"})
    assert cfg.rewards[0].function is None and cfg.rewards[0].weight == 2.0
    # its get_reward
    assert parse_config({"environment_factory": "orchestrator.builtin.tasks.boxes:BoxEnv"}).rewards == []


def test_gate_errors():
    r = lambda name, gate=None: {"name": name, "function": "letter_fraction", **({"gate": gate} if gate else {})}  # noqa: E731
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        parse_config({"rewards": [r("a", {"reward": "nope", "threshold": 1})]})
    with pytest.raises(ConfigError, match="cycle"):
        parse_config(
            {"rewards": [r("a", {"reward": "c", "threshold": 1}), r("b", {"reward": "a", "threshold": 1}),
                         r("c", {"reward": "b", "threshold": 1})]}
        )
    with pytest.raises(ConfigError, match="reward names must be unique"):
        parse_config({"rewards": [r("a"), r("a")]})
    ok = parse_config({"rewards": [r("a"), r("b", {"reward": "a", "threshold": 0.5}),
                                   r("c", {"reward": "b", "threshold": 1})]})
    assert ok.rewards[2].gate.reward == "b"


JUDGE = {"model": "tiny-judge", "template": "Letter: {letter}\nAnswer: {completion}", "labels": {"yes": 1, "no": 0}}


def test_judge_reward_config():
    """A judge is a reward source of its own: one scoring rule, no function-only options; lazily gated by default
    (a function's gate stays eager unless asked), and a function may not be gated lazily on a judge (judges are
    scored after the functions)."""
    a = {"name": "a", "function": "letter_fraction"}
    gate = {"reward": "a", "threshold": 0.5}
    cfg = parse_config({"rewards": [a, {"name": "j", "judge": JUDGE, "gate": gate},
                                    {"name": "b", "function": "brevity", "gate": gate}]})
    assert cfg.rewards[1].lazy and not cfg.rewards[2].lazy and cfg.rewards[1].has_source
    assert not parse_config({"rewards": [a, {"name": "j", "judge": JUDGE, "gate": {**gate, "lazy": False}}]}
                            ).rewards[1].lazy
    assert cfg.rewards[1].judge.engines.num_engines == 1 and cfg.rewards[1].judge.temperature == 0.0
    for judge, message in [
        ({**JUDGE, "regex": "(\\d)"}, "give exactly one of regex, labels, parser.*'regex', 'labels'"),
        ({k: v for k, v in JUDGE.items() if k != "labels"}, "got none"),
        ({**JUDGE, "labels": None, "regex": "("}, "regex '\\(':"),
        ({**JUDGE, "labels": None, "parser": "nocolon"}, "parser 'nocolon' is not of the form module:function"),
        ({**JUDGE, "temprature": 0.5}, "temprature"),
        ({**JUDGE, "engines": {"num_engines": 0}}, "num_engines"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"rewards": [a, {"name": "j", "judge": judge}]})
    with pytest.raises(ConfigError, match="a judge reward takes no `batched` or `kwargs`"):
        parse_config({"rewards": [{"name": "j", "judge": JUDGE, "batched": True}]})
    with pytest.raises(ConfigError, match="gate.lazy: its gating reward 'j' is a judge"):
        parse_config({"rewards": [{"name": "j", "judge": JUDGE},
                                  {"name": "b", "function": "brevity", "gate": {"reward": "j", "threshold": 1,
                                                                                "lazy": True}}]})


def test_lazy_gate_errors_name_the_reward_and_why():
    lazy = {"reward": "a", "threshold": 0.5, "lazy": True}
    a = {"name": "a", "function": "letter_fraction"}
    ok = parse_config({"rewards": [a, {"name": "b", "function": "brevity", "gate": lazy}]})
    assert ok.rewards[1].gate.lazy and not parse_config({"rewards": [a]}).rewards[0].gate
    for b, message in [
        ({"name": "b", "function": "brevity", "batched": True, "gate": lazy}, "gate.lazy: 'b' is batched"),
        ({"name": "b", "model": "some/rm", "gate": lazy}, "gate.lazy: 'b' is a reward model"),
        ({"name": "b", "gate": lazy}, "gate.lazy: 'b' is an environment's reward"),
        ({"name": "b", "function": "brevity", "gate": {**lazy, "threshold": {"type": "linear", "start": 0, "end": 1,
                                                                             "start_step": 0, "end_step": 5}}},
         "the threshold must be a number"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"rewards": [a, b]})
    chained = [{**a, "gate": {"reward": "c", "threshold": 0.5}}, {"name": "b", "function": "brevity", "gate": lazy},
               {"name": "c", "function": "letter_fraction"}]
    with pytest.raises(ConfigError, match="its gating reward 'a' is itself gated"):
        parse_config({"rewards": chained})


def test_schedule_validation():
    with pytest.raises(ConfigError, match="end_step"):
        parse_config({"rewards": [{"name": "r", "function": "f",
                                   "schedule": {"type": "linear", "start": 1, "end": 0, "start_step": 5,
                                                "end_step": 5}}]})
    with pytest.raises(ConfigError, match="strictly increasing"):
        parse_config({"rewards": [{"name": "r", "function": "f",
                                   "schedule": {"type": "piecewise", "steps": [[5, 1], [2, 0]]}}]})
    with pytest.raises(ConfigError, match=r"rewards\.0\.schedule"):
        parse_config({"rewards": [{"name": "r", "function": "f", "schedule": {"type": "exponential"}}]})


def test_overrides():
    tree = {"grpo": {"max_steps": 5}, "rewards": [{"name": "r", "function": "f"}]}
    apply_overrides(tree, ["grpo.max_steps=7", "generation.num_generations=4", "rewards.0.weight=0.5",
                           "model.name_or_path=foo/bar"])
    assert tree["grpo"]["max_steps"] == 7 and tree["generation"]["num_generations"] == 4
    assert tree["rewards"][0]["weight"] == 0.5 and tree["model"]["name_or_path"] == "foo/bar"
    with pytest.raises(ConfigError, match="no item '3'"):
        apply_overrides(tree, ["rewards.3.weight=1"])
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_overrides(tree, ["grpo.max_steps"])


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_config_is_frozen_and_documented():
    cfg = parse_config(MINIMAL)
    with pytest.raises(ValidationError):
        cfg.grpo.max_steps = 3
    from orchestrator.config import config_reference

    rows = config_reference()
    assert all(doc for _, _, doc in rows), [k for k, _, d in rows if not d]
    assert any(k == "generation.num_generations" for k, _, _ in rows)


def test_partial_resources_keep_the_role_defaults():
    cfg = parse_config({**MINIMAL, "cluster": {"reward_worker": {"resources": {"reward_node": 1}}}})
    assert cfg.cluster.reward_worker.num_cpus == 0.25 and cfg.cluster.reward_worker.resources == {"reward_node": 1}
    assert cfg.cluster.generator.num_cpus == 0.5


def test_learner_ranks():
    cfg = parse_config({**MINIMAL, "cluster": {"num_learners": 2, "learner_strategy": "fsdp"}})
    assert cfg.cluster.num_learners == 2 and parse_config(MINIMAL).cluster.learner_strategy == "single"
    with pytest.raises(ConfigError, match=r"cluster: learner_strategy 'single' runs one learner; num_learners \(2\)"):
        parse_config({**MINIMAL, "cluster": {"num_learners": 2}})
    with pytest.raises(ConfigError, match=r"learner\.num_gpus \(0\.5\)"):
        parse_config({**MINIMAL, "cluster": {"num_learners": 2, "learner_strategy": "fsdp",
                                             "learner": {"num_gpus": 0.5}}})
    with pytest.raises(ConfigError, match=r"cluster\.num_learners \(8\) is more than the micro-batches per step"):
        parse_config({**MINIMAL, "generation": {"generation_batch_size": 32},
                      "grpo": {"per_device_train_batch_size": 8},
                      "cluster": {"num_learners": 8, "learner_strategy": "fsdp"}})


def test_reward_autoscale_section():
    assert parse_config(MINIMAL).cluster.reward_autoscale is None  # off: a fixed pool
    cfg = parse_config({**MINIMAL, "cluster": {"reward_autoscale": {"max_workers": 8}}})
    a = cfg.cluster.reward_autoscale
    assert (a.min_workers, a.max_workers, a.upscale_delay_s, a.downscale_delay_s) == (1, 8, 30.0, 600.0)
    with pytest.raises(ConfigError, match=r"cluster\.reward_autoscale\.max_workers: Field required"):
        parse_config({**MINIMAL, "cluster": {"reward_autoscale": {"min_workers": 2}}})
    with pytest.raises(ConfigError, match=r"cluster\.reward_autoscale: min_workers \(5\) must not exceed max_workers"):
        parse_config({**MINIMAL, "cluster": {"reward_autoscale": {"min_workers": 5, "max_workers": 4}}})
    with pytest.raises(ConfigError, match=r"cluster\.reward_autoscale\.target_utilisation: Extra inputs"):
        parse_config({**MINIMAL, "cluster": {"reward_autoscale": {"max_workers": 4, "target_utilisation": 0.5}}})
    keys = {k for k, _, _ in __import__("orchestrator.config", fromlist=["x"]).config_reference()}
    assert {"cluster.reward_autoscale", "cluster.reward_autoscale.max_workers"} <= keys


def test_lora_section_takes_peft_names_and_the_short_aliases():
    assert parse_config(MINIMAL).model.lora is None  # full fine-tuning
    short = parse_config({**MINIMAL, "model": {"lora": {"r": 8, "alpha": 16, "dropout": 0.05}}}).model.lora
    peft = parse_config({**MINIMAL, "model": {"lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05}}}).model.lora
    assert short == peft and (short.r, short.lora_alpha, short.lora_dropout) == (8, 16, 0.05)
    assert short.bias == "none" and not short.save_merged  # PEFT's defaults
    assert short.target_modules == "all-linear"  # rayward's default, not PEFT's q/v (config docstring)
    cfg = load_config(ROOT / "configs" / "demo.yaml",
                      ['model.lora={"r": 8, "alpha": 16}', "model.lora.target_modules=all-linear"])
    assert cfg.model.lora.target_modules == "all-linear" and cfg.model.lora.lora_alpha == 16
    with pytest.raises(ConfigError, match=r"model\.lora: give `lora_alpha` or its alias `alpha`, not both"):
        parse_config({**MINIMAL, "model": {"lora": {"alpha": 16, "lora_alpha": 8}}})
    with pytest.raises(ConfigError, match=r"model\.lora\.rank: Extra inputs"):
        parse_config({**MINIMAL, "model": {"lora": {"rank": 8}}})
    with pytest.raises(ConfigError, match=r"model\.lora\.r: Input should be greater than or equal to 1"):
        parse_config({**MINIMAL, "model": {"lora": {"r": 0}}})
    with pytest.raises(ConfigError, match=r"model\.lora\.dropout: Input should be less than 1"):
        parse_config({**MINIMAL, "model": {"lora": {"dropout": 1.5}}})


def test_gradient_checkpointing_defaults_to_trls():
    g = parse_config(MINIMAL).grpo
    assert g.gradient_checkpointing is True and g.gradient_checkpointing_kwargs is None
    cfg = parse_config({**MINIMAL, "grpo": {"gradient_checkpointing_kwargs": {"use_reentrant": True}}})
    assert cfg.grpo.gradient_checkpointing_kwargs == {"use_reentrant": True}


def test_learner_placement():
    fsdp = {"num_learners": 2, "learner_strategy": "fsdp"}
    assert parse_config({**MINIMAL, "cluster": fsdp}).cluster.learner_placement == "pack"
    assert parse_config({**MINIMAL, "cluster": {**fsdp,
                                                "learner_placement": "spread"}}).cluster.learner_placement == "spread"
    with pytest.raises(ConfigError,
                       match=r"cluster: learner_placement 'spread' puts each learner rank on its own node"):
        parse_config({**MINIMAL, "cluster": {"learner_placement": "spread"}})
    with pytest.raises(ConfigError, match=r"cluster\.learner_placement: Input should be 'pack' or 'spread'"):
        parse_config({**MINIMAL, "cluster": {**fsdp, "learner_placement": "scatter"}})


EVAL = {"data": {"path": "toy"}}


def test_eval_block():
    cfg = parse_config({**MINIMAL, "eval": {**EVAL, "every_n_steps": 10, "at_start": True, "num_generations": 4}})
    assert cfg.eval.num_generations == 4 and cfg.eval.temperature is None and cfg.eval.rewards is None
    assert parse_config(MINIMAL).eval is None  # off unless given
    with pytest.raises(ConfigError, match=r"eval\.num_generations: Input should be greater than or equal to 1"):
        parse_config({**MINIMAL, "eval": {**EVAL, "num_generations": 0}})
    with pytest.raises(ConfigError, match=r"eval\.data: Field required"):
        parse_config({**MINIMAL, "eval": {"every_n_steps": 5}})
    with pytest.raises(ConfigError, match=r"eval\.every_n_step: Extra inputs are not permitted"):
        parse_config({**MINIMAL, "eval": {**EVAL, "every_n_step": 5}})
    with pytest.raises(ConfigError, match=r"temperature 0 \(greedy\) makes the num_generations \(4\)"):
        parse_config({**MINIMAL, "eval": {**EVAL, "temperature": 0, "num_generations": 4}})
    assert parse_config({**MINIMAL, "eval": {**EVAL, "temperature": 0}}).eval.temperature == 0
    with pytest.raises(ConfigError,
                       match=r"eval\.max_completion_length \(512\) must be below generation\.max_model_len"):
        parse_config({**MINIMAL, "eval": {**EVAL, "max_completion_length": 512}})
    gated = {"name": "b", "function": "brevity", "gate": {"reward": "nope", "threshold": 1}}
    with pytest.raises(ConfigError, match=r"eval: .*gate names unknown reward 'nope'"):
        parse_config({**MINIMAL, "eval": {**EVAL, "rewards": [gated]}})


def test_save_best_names_a_metric_eval_produces():
    with_eval = {**MINIMAL, "eval": {**EVAL, "num_generations": 4}}
    for metric in ("eval/reward", "eval/pass@1", "eval/pass@4", "eval/rewards/r/mean", "eval/mean_length"):
        assert parse_config({**with_eval, "grpo": {"save_best": metric}}).grpo.save_best == metric
    for metric in ("eval/accuracy", "eval/pass@8", "reward", "eval/rewards/other/mean"):
        with pytest.raises(ConfigError, match=rf"grpo\.save_best '{metric}': eval produces no such metric"):
            parse_config({**with_eval, "grpo": {"save_best": metric}})
    with pytest.raises(ConfigError, match=r"grpo\.save_best 'eval/reward' needs an eval block"):
        parse_config({**MINIMAL, "grpo": {"save_best": "eval/reward"}})
    own = {**MINIMAL, "eval": {**EVAL, "rewards": [{"name": "short", "function": "brevity"}]}}
    assert parse_config({**own, "grpo": {"save_best": "eval/rewards/short/mean"}})
    with pytest.raises(ConfigError, match="no such metric"):  # eval.rewards replaces the training rewards
        parse_config({**own, "grpo": {"save_best": "eval/rewards/r/mean"}})


def test_config_reference_documents_the_eval_block():
    from orchestrator.config import config_reference

    rows = {k: (d, doc) for k, d, doc in config_reference()}
    assert rows["eval"][0] == "None" and "eval.data.path" in rows and "eval.data.shuffle_dataset" not in rows
    assert rows["eval.num_generations"][0] == "1" and rows["grpo.save_best"][0] == "None"
    assert "rewards[].name" in rows and "eval.rewards" in rows and "eval.rewards[].name" not in rows


def test_distillation_config_takes_trls_names_and_refuses_what_a_teacher_of_sampled_tokens_cannot_serve():
    base = {"rewards": [{"name": "a", "function": "letter_fraction"}]}
    cfg = parse_config({**base, "distillation": {"teacher_model_name_or_path": "some/teacher"}})  # TRL's name
    d = cfg.distillation
    assert (d.teacher, d.mode, d.coef, d.beta, d.loss_top_k, d.loss_add_tail) == ("some/teacher", "advantage", 1.0,
                                                                                  1.0, 1, True)
    assert parse_config(base).distillation is None
    for distillation, message in [
        ({"teacher": "t", "beta": 0.5}, "beta 0.5: only 1"),
        ({"teacher": "t", "loss_top_k": 20}, "loss_top_k 20: only 1"),
        ({"teacher": "t", "loss_add_tail": False}, "the term is always 0"),
        ({"teacher": "t", "reverse_kl_top_1_mode": "argmax"}, "reverse_kl_top_1_mode"),
        ({"teacher": "t", "mode": "forward"}, "mode"),
        ({"teacher": "t", "coef": 0}, "coef"),
        ({"teacher": "t", "lmbda": 0.5}, "lmbda"),  # GKD's knob: not this trainer's, refused by name
        ({}, "teacher"),
        ({"teacher": "t", "engines": {"max_model_len": 512}}, "distillation.engines.max_model_len \\(512\\) must "
                                                              "exceed generation.max_model_len \\(512\\)"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config({**base, "distillation": distillation})


def test_async_corrects_per_token_unless_the_config_names_a_mode():
    """A weight load lands mid-sequence in the async loop: TRL's sequence-level default would span versions."""
    base = {"loop": {"mode": "async"}, "rewards": [{"name": "r", "function": "brevity"}]}
    assert parse_config(base).grpo.vllm_importance_sampling_mode == "token_truncate"
    named = {**base, "grpo": {"vllm_importance_sampling_mode": "sequence_mask"}}
    assert parse_config(named).grpo.vllm_importance_sampling_mode == "sequence_mask"
    assert parse_config({"rewards": base["rewards"]}).grpo.vllm_importance_sampling_mode == "sequence_mask"


def test_generation_engine_kwargs_pass_vllm_arguments_and_refuse_the_ones_rayward_rests_on():
    cfg = parse_config({**MINIMAL, "generation": {"engine_kwargs": {"max_num_seqs": 64,
                                                         "logits_processors": ["bench.long_tail:LogNormalLengths"]}}})
    assert cfg.generation.engine_kwargs["max_num_seqs"] == 64
    with pytest.raises(ConfigError, match=r"generation.*engine_kwargs: logprobs_mode, worker_extension_cls cannot"):
        parse_config({**MINIMAL, "generation": {"engine_kwargs": {"worker_extension_cls": "x.Y",
                                                                 "logprobs_mode": "raw_logprobs"}}})
