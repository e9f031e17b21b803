"""rayward.GRPOTrainer's constructor (orchestrator/trl/trainer.py): what a TRL script hands over becomes a checked
RunConfig before anything starts, and the script's own functions travel by value. No Ray here: the runs are in
tests/integration/orchestrator/trl/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from actors import user_code  # noqa: E402
from orchestrator.builtin.models.tiny import ensure_tiny_model  # noqa: E402
from orchestrator.config import ConfigError  # noqa: E402
from rayward import GRPOConfig, GRPOTrainer  # noqa: E402

pytestmark = pytest.mark.slow  # imports TRL, builds the tiny model


def _helper(text: str) -> int:
    return len(text)


def module_level_reward(completions, **kwargs):
    """Defined in this test module, which a worker elsewhere cannot import: it must travel by value."""
    return [float(_helper(c)) for c in completions]


def letters() -> datasets.Dataset:
    return datasets.Dataset.from_list([{"prompt": f"Write the letter {c}:", "letter": c} for c in "abcdabcd"])


def config(tmp_path, **kw) -> GRPOConfig:
    base = dict(output_dir=str(tmp_path / "My_Run.v1"), use_cpu=True, max_steps=3, per_device_train_batch_size=8,
                num_generations=4, max_completion_length=16, report_to="none")
    return GRPOConfig(**{**base, **kw})


def test_script_functions_lambdas_and_closures_become_weighted_rewards_with_trls_names(tmp_path):
    target = 5
    closure = lambda completions, **kw: [float(len(c) == target) for c in completions]  # noqa: E731

    def make(scale):
        def scaled(completions, **kw):
            return [scale * len(c) for c in completions]
        return scaled

    t = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=[module_level_reward, closure, make(0.5)],
                    args=config(tmp_path, reward_weights=[1.0, 0.5, 0.25]), train_dataset=letters())
    cfg = t.cfg
    assert [(r.name, r.weight) for r in cfg.rewards] == [
        ("module_level_reward", 1.0), ("<lambda>", 0.5), ("scaled", 0.25)]
    assert all(r.function.startswith(user_code.BY_VALUE) for r in cfg.rewards)
    # the run directory is output_dir, named as a run may be
    assert (cfg.name, t.run_dir.parent) == ("my-run-v1", tmp_path)
    assert cfg.grpo.max_steps == 3 and cfg.generation.generation_batch_size == 8 and cfg.seed == 42
    assert cfg.data.path == str(tmp_path / "My_Run.v1" / "rayward-inputs" / "train")
    assert datasets.load_from_disk(cfg.data.path)["letter"] == list("abcdabcd")

    # a fresh interpreter that cannot import this test module (or rayward) runs them all
    refs = [r.function for r in cfg.rewards]
    code = ("import base64, json, sys, zlib, cloudpickle\n"
            "fns = [cloudpickle.loads(zlib.decompress(base64.b64decode(r.rpartition(':')[2]))) for r in "
            "json.load(sys.stdin)]\n"
            "print(json.dumps([f(completions=['aaaaa', 'bb']) for f in fns]))")
    out = subprocess.run([sys.executable, "-I", "-c", code], input=json.dumps(refs), capture_output=True,
                         text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[5.0, 2.0], [1.0, 0.0], [2.5, 1.0]]


def test_without_args_trls_default_config_is_built_on_a_machine_without_a_gpu(tmp_path, monkeypatch):
    """TRL's documented quick start passes no args: TRL builds GRPOConfig(output_dir="<model>-GRPO") with its
    defaults (bf16 on), which the driver, GPU-less or not, must build."""
    from tests.unit.orchestrator.test_trl_grpo_config import gpu_less

    gpu_less(monkeypatch)
    monkeypatch.chdir(tmp_path)
    model = ensure_tiny_model()
    t = GRPOTrainer(model=str(model), reward_funcs=module_level_reward, train_dataset=letters())
    assert isinstance(t.args, GRPOConfig) and (t.args.bf16, t.args.use_cpu) == (True, False)
    assert (t.args.output_dir, t.run_dir) == (f"{model.name}-GRPO", tmp_path / f"{model.name}-grpo")
    # TRL's defaults: 8 completions a step, 8 per prompt, 3 epochs of the 8 rows
    assert (t.cfg.generation.generation_batch_size, t.cfg.grpo.max_steps) == (8, 3 * 8)


def test_an_unpicklable_capture_is_named_before_anything_starts(tmp_path):
    import threading

    lock = threading.Lock()

    def locked(completions, **kw):
        with lock:
            return [0.0] * len(completions)

    with pytest.raises(user_code.UserCodeError, match="locked: cannot be sent to the workers"):
        GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=locked, args=config(tmp_path),
                    train_dataset=letters())


@pytest.mark.parametrize("kw, named", [
    ({"rollout_func": lambda prompts, trainer: {}}, "rollout_func: rayward cannot run it"),
    ({"optimizers": (object(), None)}, "optimizers: rayward cannot run it"),
    ({"args_kw": {"reward_weights": [1.0, 2.0]}}, "GRPOConfig.reward_weights: 2 weights for 1 reward_funcs"),
    ({"args_kw": {"entropy_coef": 0.5}}, "GRPOConfig.entropy_coef=0.5"),
    ({"args_kw": {"max_steps": -1}, "iterable": True}, "an IterableDataset needs GRPOConfig.max_steps"),
    ({"eval_dataset": {"a": None, "b": None}}, "eval_dataset: a dict of datasets"),
    ({"rayward": {"rewards": {"nope": {"timeout_s": 5}}}}, "rayward['rewards']['nope']: no such reward"),
    ({"rayward": {"cluster": {"num_reward_workrs": 3}}}, "cluster.num_reward_workrs"),
    ({"peft": {"use_dora": True}}, "peft_config: rayward's LoRA takes"),
])
def test_what_rayward_cannot_run_is_named_in_the_constructor(tmp_path, kw, named):
    import peft

    kw = dict(kw)
    a = config(tmp_path, **kw.pop("args_kw", {}))
    data = letters().to_iterable_dataset() if kw.pop("iterable", False) else letters()
    if "peft" in kw:
        kw["peft_config"] = peft.LoraConfig(r=4, **kw.pop("peft"))
    with pytest.raises(ConfigError) as err:
        GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=module_level_reward, args=a,
                    train_dataset=data, **kw)
    assert named in str(err.value)


def test_peft_config_rayward_keyword_yaml_and_an_iterable_dataset(tmp_path):
    import peft
    import yaml

    extra = tmp_path / "cluster.yaml"
    extra.write_text(yaml.safe_dump({
        "cluster": {"num_reward_workers": 3}, "loop": {"mode": "pipelined"},
        "rewards": {"module_level_reward": {"timeout_s": 7, "gate": {"reward": "module_level_reward_2",
                                                                      "threshold": 0.5}}}}))
    t = GRPOTrainer(
        model=str(ensure_tiny_model()), reward_funcs=[module_level_reward, module_level_reward],
        args=config(tmp_path, max_steps=2), train_dataset=letters().to_iterable_dataset(),
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        rayward=str(extra))
    cfg = t.cfg
    assert (cfg.model.lora.r, cfg.model.lora.lora_alpha, cfg.model.lora.target_modules) == (4, 8, ["q_proj", "v_proj"])
    assert cfg.cluster.num_reward_workers == 3 and cfg.loop.mode == "pipelined"
    first = cfg.rewards[0]
    assert (first.timeout_s, first.gate.reward, [r.name for r in cfg.rewards]) == (
        7, "module_level_reward_2", ["module_level_reward", "module_level_reward_2"])
    # an IterableDataset: the rows max_steps x prompts per step need (2 x 2), taken in order
    assert datasets.load_from_disk(cfg.data.path)["letter"] == list("abcd")
    # PEFT's default targets for the architecture, as get_peft_model picks them
    t2 = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=module_level_reward,
                     args=config(tmp_path / "b"), train_dataset=letters(), peft_config=peft.LoraConfig(r=2))
    assert t2.cfg.model.lora.target_modules == ["q_proj", "v_proj"]


def test_a_loaded_model_and_its_tokenizer_are_saved_for_the_workers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(ensure_tiny_model())
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    t = GRPOTrainer(model=model, processing_class=tok, reward_funcs=module_level_reward, args=config(tmp_path),
                    train_dataset=letters())
    saved = tmp_path / "My_Run.v1" / "rayward-inputs" / "model"
    assert t.cfg.model.name_or_path == str(saved)
    assert (saved / "config.json").is_file() and (saved / "tokenizer_config.json").is_file()


def test_async_functions_model_paths_and_loaded_reward_models_mix(tmp_path):
    """reward_funcs as TRL takes them: an async function (by value), a reward model's path (as given) and a
    loaded sequence-classification model (saved with its tokenizer, named after its checkpoint as TRL names it);
    the saved one scores as the loaded one does."""
    import asyncio

    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from actors.rewards.worker import RewardSpec
    from tests.unit.actors.rewards.test_worker import chunk, worker

    path = str(ensure_tiny_model())
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(path, num_labels=1))
    tok = AutoTokenizer.from_pretrained(path)
    rm.config.pad_token_id = tok.pad_token_id
    rm.config._name_or_path = "org/tiny-rm"

    async def judged(completions, **kw):
        await asyncio.sleep(0)
        return [1.0] * len(completions)

    t = GRPOTrainer(model=path, reward_funcs=[judged, path, rm], reward_processing_classes=[None, None, tok],
                    args=config(tmp_path), train_dataset=letters())
    r = t.cfg.rewards
    assert [x.name for x in r] == ["judged", Path(path).name, "tiny-rm"]  # a path names the reward after its last part
    assert r[0].function.startswith(user_code.BY_VALUE) and r[1].model == path
    saved = tmp_path / "My_Run.v1" / "rayward-inputs" / "reward-model-2"
    assert r[2].model == str(saved)
    c = chunk(["a short answer"])
    got = worker(RewardSpec("rm", model=str(saved))).score(c).scores[0][0]
    with torch.no_grad():
        ids = tok(c.prompts[0] + c.completions[0], add_special_tokens=False, return_tensors="pt")
        assert got == pytest.approx(rm(**ids).logits[0, 0].item(), abs=1e-4)
    assert user_code.is_async_callable(user_code.import_object(r[0].function, "rewards[0]"))


def test_an_eval_dataset_and_trls_eval_schedule_become_the_eval_block(tmp_path):
    t = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=module_level_reward, train_dataset=letters(),
                    eval_dataset={"held_out": letters().select(range(4))},
                    args=config(tmp_path, max_steps=6, eval_strategy="steps", eval_steps=3, eval_on_start=True,
                                num_generations_eval=2))
    e = t.cfg.eval
    assert (e.every_n_steps, e.at_start, e.num_generations) == (3, True, 2)
    assert datasets.load_from_disk(e.data.path)["letter"] == list("abcd")
    from orchestrator.trl.trainer import trl_row

    row = trl_row({"step": 3, "eval/reward": 0.5, "reward_fn/judge_calls": 2.0, "time/step": 1.5})
    assert (row["eval_reward"], row["judge_calls"], row["step_time"], row["eval/reward"]) == (0.5, 2.0, 1.5, 0.5)


def test_after_train_the_state_and_its_closing_row_are_what_transformers_trainer_leaves(tmp_path, monkeypatch):
    """The outside case: transformers' own Trainer.train on a micro model gives the closing row's keys and the state
    fields a script reads (`trainer.state.log_history[-1]["train_loss"]`); rayward's train() (its run replaced by
    a recorded history and a checkpoint) leaves the same, and TrainerCallbacks get the row through on_log."""
    import dataclasses

    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainerCallback, TrainingArguments

    micro = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                                         num_hidden_layers=1, intermediate_size=32))
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4]] * 4, "labels": [[1, 2, 3, 4]] * 4})
    hf = Trainer(model=micro, train_dataset=rows, args=TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=2, per_device_train_batch_size=2, logging_steps=1, report_to=[],
        use_cpu=True, save_strategy="no"))
    hf.train()
    theirs = hf.state.log_history[-1]

    logged = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            logged.append(dict(logs))

    t = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=module_level_reward, train_dataset=letters(),
                    args=config(tmp_path, max_steps=2, logging_steps=1), callbacks=[Record()])
    ckpt = t.run_dir / "checkpoint-2"
    ckpt.mkdir(parents=True)
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4), "model.layers.0.mlp.up_proj.weight": torch.zeros(3, 5)},
              str(ckpt / "model.safetensors"))
    history = [{"step": s, "loss": 0.5 * s, "reward": 0.1, "num_tokens": 100.0, "epoch": s / 4} for s in (1, 2)]
    monkeypatch.setattr("orchestrator.run.train.train", lambda *a, **k: history)
    monkeypatch.setattr("orchestrator.run.checkpoints.latest", lambda run_dir: ckpt)
    out = t.train()
    ours = t.state.log_history[-1]
    assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
    assert ours["train_loss"] == out.training_loss == 0.75 and ours["step"] == 2 and ours["epoch"] == 0.5
    assert ours["total_flos"] == 6 * 15 * 200  # 6 x non-embedding parameters x tokens, as transformers counts
    assert sorted(out.metrics) == sorted(k for k in theirs if k != "step")
    assert logged[-1] == ours  # callbacks see the closing row, as transformers' log() sends it
    fields = {f.name for f in dataclasses.fields(hf.state)}
    for name in ("global_step", "epoch", "max_steps", "logging_steps", "train_batch_size", "total_flos"):
        assert name in fields and getattr(t.state, name) not in (None, 0), name
    assert (t.state.global_step, t.state.max_steps, t.state.logging_steps) == (2, 2, 1)


def test_resume_from_checkpoint_auto_true_and_a_path_become_the_runs_resume(tmp_path, monkeypatch):
    """train(resume_from_checkpoint=...) as orchestrator.run.train's resume: "auto" (a requeued or restarted
    script: the latest checkpoint if there is one, else a fresh start) as it is, True and a checkpoint of the
    run directory as True, None as False; a checkpoint of another directory is refused."""
    t = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=module_level_reward, train_dataset=letters(),
                    args=config(tmp_path))
    asked = []
    monkeypatch.setattr("orchestrator.run.train.train", lambda *a, resume, **k: asked.append(resume) or [])
    monkeypatch.setattr("orchestrator.run.checkpoints.latest", lambda run_dir: None)
    for value in ("auto", True, str(t.run_dir / "checkpoint-2"), None):
        t.train(resume_from_checkpoint=value)
    assert asked == ["auto", True, True, False]
    with pytest.raises(ConfigError, match="rayward resumes from the latest checkpoint of its run directory"):
        t.train(resume_from_checkpoint=str(tmp_path / "elsewhere" / "checkpoint-2"))

