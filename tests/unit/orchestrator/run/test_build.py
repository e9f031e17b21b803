"""orchestrator/run/build.py's pure choices, from the config: each actor's cores and environment, the reward pool's
autoscaling settings."""

import pytest

from actors.runtime.cpus import SHARED_CORES_ENV, shared_cores_env
from orchestrator.config import parse_config
from orchestrator.run.build import autoscale_settings, generator_cpu_share

MINIMAL = {"rewards": [{"name": "r", "function": "letter_fraction"}]}


def cfg(loop: str, **cluster):
    return parse_config({**MINIMAL, "loop": {"mode": loop}, "cluster": cluster})


def test_sync_loop_binds_nothing_but_both_sides_wait_passively():
    """The phases take turns, but a weight sync runs the learner's sender and the engine's reload at once."""
    c = cfg("sync")
    assert generator_cpu_share(c) is None
    for res in (c.cluster.learner, c.cluster.generator):
        assert SHARED_CORES_ENV.items() <= shared_cores_env(res.num_gpus)["runtime_env"]["env_vars"].items()


def test_pipelined_cpu_binds_the_generator_to_its_split():
    c = cfg("pipelined", cpu_split=0.25)
    assert generator_cpu_share(c) == (0.25, 1.0)  # the learner is not bound: it borrows these cores when idle


def test_pipelined_gpu_generators_keep_every_core():
    c = cfg("pipelined", learner={"num_gpus": 1}, generator={"num_gpus": 1})
    assert generator_cpu_share(c) is None


def test_autoscale_settings_are_the_config_section():
    s = autoscale_settings(parse_config({**MINIMAL, "cluster": {"reward_autoscale": {"min_workers": 2, "max_workers": 6,
                                                                                       "target_utilization": 0.3}}}))
    assert (s.min_workers, s.max_workers, s.target_utilization) == (2, 6, 0.3)
    assert autoscale_settings(parse_config(MINIMAL)) is None


def test_env_autoscale_settings_are_their_own_section():
    c = parse_config({**MINIMAL, "cluster": {"env_autoscale": {"min_workers": 1, "max_workers": 5},
                                             "reward_autoscale": {"max_workers": 3}}})
    s = autoscale_settings(c, "env_autoscale")
    assert (s.min_workers, s.max_workers) == (1, 5) and autoscale_settings(c).max_workers == 3
    assert autoscale_settings(parse_config(MINIMAL), "env_autoscale") is None



# --------------------------------------------------------------------------------------------- the learner's spec
def test_learner_spec_carries_the_run_config():
    from actors.learner.loss import ImportanceSampling
    from orchestrator.run.build import learner_spec

    c = parse_config({
        **MINIMAL, "seed": 7, "model": {"dtype": "bfloat16"},
        "generation": {"temperature": 0.7, "max_completion_length": 33},
        "grpo": {"learning_rate": 3e-5, "optim": "sgd", "weight_decay": 0.1, "adam_beta1": 0.8, "adam_beta2": 0.95,
                 "lr_scheduler_type": "cosine", "warmup_steps": 2, "max_steps": 10, "max_grad_norm": None,
                 "per_device_train_batch_size": 4, "num_iterations": 2, "mask_truncated_completions": True,
                 "loss_type": "cispo", "epsilon": 0.3, "epsilon_high": 4.0, "delta": 1.5,
                 "importance_sampling_level": "sequence", "beta": 0.04, "use_bias_correction_kl": False,
                 "vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": 2.0,
                 "vllm_importance_sampling_clip_min": 0.5},
    })
    s = learner_spec(c, "/models/m")
    assert (s.model.name_or_path, s.model.dtype, s.seed, s.device) == ("/models/m", "bfloat16", 7, None)
    o = s.optim
    assert (o.optim, o.learning_rate, o.weight_decay, o.adam_betas) == ("sgd", 3e-5, 0.1, (0.8, 0.95))
    assert (o.lr_scheduler_type, o.warmup_steps, o.max_steps, o.max_grad_norm) == ("cosine", 2, 10, None)
    assert (s.step.micro_batch_size, s.step.num_iterations, s.step.mask_truncated_completions) == (4, 2, True)
    e = s.loss
    assert (e.loss_type, e.epsilon, e.epsilon_high, e.delta) == ("cispo", 0.3, 4.0, 1.5)
    assert (e.importance_sampling_level, e.beta, e.use_bias_correction_kl) == ("sequence", 0.04, False)
    assert (e.max_completion_length, e.temperature, e.steps_per_generation) == (33, 0.7, None)
    assert e.vllm_importance_sampling == ImportanceSampling("token_truncate", clip_max=2.0, clip_min=0.5)
    off = parse_config({**MINIMAL, "grpo": {"vllm_importance_sampling_correction": False}})
    assert learner_spec(off, "m").loss.vllm_importance_sampling is None
    assert learner_spec(parse_config(MINIMAL), "m") == learner_spec(parse_config(MINIMAL), "m")  # pure


def test_lora_and_gradient_checkpointing_reach_the_learner_as_peft_and_trl_take_them():
    from orchestrator.config import load_config
    from orchestrator.run.build import learner_spec, lora_kwargs
    from tests.conftest import ROOT

    cfg = load_config(ROOT / "configs" / "demo.yaml",
                      ['model.lora={"r": 8, "alpha": 16}', "model.lora.target_modules=all-linear"])
    assert lora_kwargs(cfg) == {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear",
                                "bias": "none", "use_rslora": False}  # PEFT LoraConfig arguments
    assert (learner_spec(cfg, "m").model.lora == lora_kwargs(cfg)
            and learner_spec(parse_config(MINIMAL), "m").model.lora is None)
    cfg = parse_config({**MINIMAL, "grpo": {"gradient_checkpointing_kwargs": {"use_reentrant": True}}})
    m = learner_spec(cfg, "m").model
    assert m.gradient_checkpointing is True and m.gradient_checkpointing_kwargs == {"use_reentrant": True}


# --------------------------------------------------------------------------------------------- packed micro-batches
def test_packing_and_token_budgets_reach_the_learner():
    from orchestrator.run.build import learner_spec

    default = learner_spec(parse_config(MINIMAL), "m")
    assert (default.step.padding_free, default.step.max_tokens_per_microbatch) == (None, None)  # packed where correct
    assert default.model.attn_implementation is None
    s = learner_spec(parse_config({**MINIMAL, "grpo": {"padding_free": False, "max_tokens_per_microbatch": 4096},
                                   "model": {"attn_implementation": "eager"}}), "m")
    assert ((s.step.padding_free, s.step.max_tokens_per_microbatch, s.model.attn_implementation)
            == (False, 4096, "eager"))


def test_packing_where_it_cannot_be_correct_is_a_config_error(tmp_path, tiny_model_path):
    """Checked on the meta-device model, before anything loads: a model whose layers carry state along a row
    (LFM2's convolutions), and an attention implementation that is not installed."""
    import pytest
    from transformers import Lfm2Config

    from orchestrator.config import ConfigError
    from orchestrator.run.build import check_learner_model

    Lfm2Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, layer_types=["conv", "full_attention"]).save_pretrained(tmp_path)
    asked = parse_config({**MINIMAL, "grpo": {"padding_free": True}})
    with pytest.raises(ConfigError, match=r"grpo.padding_free: Lfm2ForCausalLM has \['conv'\] layers, which carry "
                                          r"state across the samples of a packed row; set grpo.padding_free=false"):
        check_learner_model(asked, str(tmp_path))
    check_learner_model(parse_config(MINIMAL), str(tmp_path))  # null: the learner trains it padded
    check_learner_model(asked, tiny_model_path)  # Qwen2 on sdpa packs
    flash = parse_config({**MINIMAL, "model": {"attn_implementation": "flash_attention_2"}})
    with pytest.raises(ConfigError, match="model.attn_implementation 'flash_attention_2': FlashAttention2 has been "
                                          "toggled on, but it cannot be used"):
        check_learner_model(flash, tiny_model_path)


def test_the_rollout_kind_follows_the_tools():
    from orchestrator.loop.rollout import Agentic, OneTurn
    from orchestrator.run.agents import AgentSetup
    from orchestrator.run.build import rollout_kind

    assert isinstance(rollout_kind(None), OneTurn)
    setup = AgentSetup(spec=None, schemas={None: []}, env_classes={None: "BoxEnv"}, env_rewards=[],
                       env_reward_specs=[], keep_state=True)
    assert rollout_kind(setup) == Agentic(env_classes={None: "BoxEnv"}, keep_state=True)


def test_generators_get_the_environment_pool_and_the_agent_settings(tiny_tools_cfg):
    from actors.envs.client import PoolEnvironments
    from orchestrator.config import load_config
    from orchestrator.run.agents import AgentSetup
    from orchestrator.run.build import agent_kwargs
    from tests.conftest import ROOT

    class Pool:
        handle = "the pool actor"

    schemas = {None: [{"type": "function", "function": {"name": "open_box"}}]}
    setup = AgentSetup(spec=None, schemas=schemas, env_classes={None: "BoxEnv"}, env_rewards=[],
                       env_reward_specs=[], keep_state=False)
    kw = agent_kwargs(tiny_tools_cfg, setup, Pool())
    assert isinstance(kw["environments"], PoolEnvironments) and kw["environments"].pool == "the pool actor"
    a = kw["agent"]
    assert (a.tools, a.max_tool_tokens, a.trajectory_timeout_s, a.max_tool_calling_iterations, a.prompt_column) == (
        schemas, 128, 120.0, 3, "prompt")
    assert agent_kwargs(tiny_tools_cfg, setup, Pool(), "question")["agent"].prompt_column == "question"
    assert a.served_model is None  # the environment-class driver
    agent_cfg = load_config(ROOT / "configs" / "agent.yaml")  # an agent function: the generators serve its endpoint
    assert agent_kwargs(agent_cfg, setup, Pool())["agent"].served_model == "tiny-tools"


@pytest.fixture
def tiny_tools_cfg():
    from orchestrator.config import load_config
    from tests.conftest import ROOT

    return load_config(ROOT / "configs" / "tools.yaml", [])


def test_training_and_eval_sampling_are_one_record_from_the_config():
    """generation.* for the training batches; an eval's: eval.num_generations, and eval's max_completion_length and
    temperature where it sets them (the training batches' where it does not)."""
    from actors.types import Sampling
    from orchestrator.run.build import eval_set, training_sampling

    train = parse_config({**MINIMAL, "generation": {"num_generations": 4, "max_completion_length": 64,
                                                     "temperature": 0.9, "top_p": 0.95, "top_k": 20}})
    assert training_sampling(train) == Sampling(n=4, max_tokens=64, temperature=0.9, top_p=0.95, top_k=20)
    evals = {"data": {"path": "toy"}, "num_generations": 2}
    same = parse_config({**MINIMAL, "generation": train.generation.model_dump(), "eval": evals})
    assert eval_set(same, [], pool=None).sampling == Sampling(n=2, max_tokens=64, temperature=0.9, top_p=0.95,
                                                              top_k=20)
    own = parse_config({**MINIMAL, "generation": train.generation.model_dump(),
                        "eval": {**evals, "max_completion_length": 16, "temperature": 0.5}})
    assert eval_set(own, [], pool=None).sampling == Sampling(n=2, max_tokens=16, temperature=0.5, top_p=0.95, top_k=20)


def test_moe_options_are_checked_against_the_architecture(tmp_path, tiny_model_path):
    """grpo.router_replay needs a mixture of experts, grpo.router_aux_loss_coef one that returns router logits (TRL
    refuses it on a dense model too); both pass on the tiny MoE and reach the learner's spec; `tiny-moe` names it."""
    import pytest

    from orchestrator.builtin.models.moe import ensure_tiny_moe
    from orchestrator.config import ConfigError
    from orchestrator.run.build import check_learner_model, learner_spec, resolve_model

    replay = parse_config({**MINIMAL, "grpo": {"router_replay": "R3"}})
    with pytest.raises(ConfigError, match=r"grpo.router_replay: Qwen2ForCausalLM is not a mixture of experts"):
        check_learner_model(replay, tiny_model_path)
    aux = parse_config({**MINIMAL, "grpo": {"router_aux_loss_coef": 0.01}})
    with pytest.raises(ConfigError, match=r"grpo.router_aux_loss_coef: Qwen2ForCausalLM is not a mixture-of-experts"):
        check_learner_model(aux, tiny_model_path)
    moe = str(ensure_tiny_moe("qwen2_moe"))
    check_learner_model(replay, moe)
    check_learner_model(aux, moe)
    step = learner_spec(parse_config({**MINIMAL, "grpo": {"router_replay": "R2", "router_aux_loss_coef": 0.0}}),
                        "m").step
    assert (step.router_replay, step.router_aux_loss_coef) == ("R2", 0.0)
    assert learner_spec(parse_config(MINIMAL), "m").step.router_replay is None
    assert resolve_model(parse_config({**MINIMAL, "model": {"name_or_path": "tiny-qwen2-moe"}})) == moe
    with pytest.raises(Exception, match="router_replay"):
        parse_config({**MINIMAL, "grpo": {"router_replay": "R4"}})


def test_a_teacher_must_have_the_policys_tokenizer(tiny_model_path, tmp_path):
    """The teacher reads the student's ids. Accepted: the same vocabulary under another family's chat template
    (TRL's own Llama 3 template: the template changes no id). Refused, naming the field and the tokens: one token
    more (a family that added a thinking token) and a tokenizer trained on other text (another family)."""
    from pathlib import Path

    import trl
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from orchestrator.config import ConfigError
    from orchestrator.run.build import check_teacher_tokenizer

    student = AutoTokenizer.from_pretrained(tiny_model_path)
    other_template = AutoTokenizer.from_pretrained(tiny_model_path)
    other_template.chat_template = (Path(trl.__file__).parent / "chat_templates" / "llama3.jinja").read_text()
    check_teacher_tokenizer(student, other_template, "llama-templated")
    added = AutoTokenizer.from_pretrained(tiny_model_path)
    added.add_tokens(["<think>"], special_tokens=True)
    with pytest.raises(ConfigError, match=r"distillation.teacher 'thinking'.*512 vs 513 tokens; 1 differ.*'<think>': "
                                          r"policy None / teacher 512"):
        check_teacher_tokenizer(student, added, "thinking")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["an entirely different corpus of words"] * 10,
                            trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    foreign = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")
    with pytest.raises(ConfigError, match="is not the policy's .*give a teacher of the policy's model family"):
        check_teacher_tokenizer(student, foreign, "other-family")


def test_distillation_reaches_the_loss_and_the_sampler():
    from orchestrator.run.build import loss_config, rollout_kind

    on = parse_config({**MINIMAL, "distillation": {"teacher": "t", "coef": 0.5, "mode": "loss"}})
    assert (loss_config(on).distill_coef, loss_config(on).distill_mode) == (0.5, "loss")
    assert loss_config(parse_config(MINIMAL)).distill_coef == 0.0
    assert rollout_kind(None, teacher=True).prompt_ids and not rollout_kind(None).prompt_ids
