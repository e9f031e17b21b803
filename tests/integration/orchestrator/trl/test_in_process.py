"""rayward.GRPOTrainer built in a test module, as a notebook or a test suite builds it: a function of this module,
a lambda and a closure over a local variable as rewards, trained on the session's Ray cluster, then save_model,
then a new trainer with more steps resumed with train(resume_from_checkpoint=True)."""

from __future__ import annotations

import pytest

datasets = pytest.importorskip("datasets")



def module_reward(completions, letter, **kwargs):
    """Defined in this test module: the workers get it by value."""
    return [float(want in c) for c, want in zip(completions, letter, strict=True)]


def test_a_trainer_built_in_a_test_module_trains_and_saves(ray_cluster, tmp_path):
    from orchestrator.builtin.models.tiny import ensure_tiny_model
    from rayward import GRPOConfig, GRPOTrainer

    target = 6
    short = lambda completions, **kw: [float(len(c) <= target) for c in completions]  # noqa: E731

    def make(bonus):
        def bonus_reward(completions, **kw):
            return [bonus] * len(completions)
        return bonus_reward

    data = datasets.Dataset.from_list([{"prompt": f"Write the letter {c}:", "letter": c} for c in "abcd" * 4])
    settings = dict(output_dir=str(tmp_path / "inproc"), use_cpu=True, per_device_train_batch_size=16,
                    num_generations=4, max_completion_length=8, report_to="none", save_strategy="no",
                    disable_tqdm=True)
    args = GRPOConfig(**settings, max_steps=2)
    trainer = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=[module_reward, short, make(0.25)], args=args,
                          train_dataset=data)
    out = trainer.train()
    assert out.global_step == 2 == trainer.state.global_step
    rows = [r for r in trainer.state.log_history if "reward" in r]
    for name in ("module_reward", "<lambda>", "bonus_reward"):
        assert all(r[f"rewards/{name}/errors"] == 0 for r in rows), name
    assert all(r["rewards/bonus_reward/mean"] == pytest.approx(0.25) for r in rows)  # the closure's captured value
    trainer.save_model(str(tmp_path / "final"))
    assert ({"config.json", "model.safetensors", "tokenizer_config.json"}
            <= {p.name for p in (tmp_path / "final").iterdir()})

    # TRL's resume: a new trainer, the same output_dir, more steps; it goes on from checkpoint-2 (save_strategy
    # "no" still writes the final checkpoint rayward resumes from)
    more = GRPOConfig(**settings, max_steps=4)
    again = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=[module_reward, short, make(0.25)], args=more,
                        train_dataset=data)
    out = again.train(resume_from_checkpoint=True)
    assert out.global_step == 4
    assert [r["step"] for r in again.state.log_history if "reward" in r] == [3, 4]


def test_resume_auto_starts_a_run_without_checkpoints_and_continues_one_with_them(ray_cluster, tmp_path):
    """train(resume_from_checkpoint="auto"), what a script requeued by SLURM or restarted by --max-retries
    calls every time: the first start finds no checkpoint and trains from the initial model; the restart (a
    new trainer, the same output_dir, more steps) continues from the run's latest checkpoint."""
    from orchestrator.builtin.models.tiny import ensure_tiny_model
    from rayward import GRPOConfig, GRPOTrainer

    data = datasets.Dataset.from_list([{"prompt": f"Write the letter {c}:", "letter": c} for c in "abcd" * 2])
    settings = dict(output_dir=str(tmp_path / "requeued"), per_device_train_batch_size=8, num_generations=4,
                    max_completion_length=8, report_to="none", save_strategy="no", disable_tqdm=True)
    for max_steps, trained in ((1, [1]), (2, [2])):
        trainer = GRPOTrainer(model=str(ensure_tiny_model()), reward_funcs=module_reward, train_dataset=data,
                              args=GRPOConfig(**settings, max_steps=max_steps))
        assert trainer.train(resume_from_checkpoint="auto").global_step == max_steps
        assert [r["step"] for r in trainer.state.log_history if "reward" in r] == trained


def test_trls_documented_vlm_example_runs_unchanged_but_for_the_import(ray_cluster, tmp_path):
    """TRL's GRPO trainer page's vision-language example (a conversational prompt and an `image` column, a reward on
    conversational completions), with rayward's tiny Qwen2.5-VL, its processor as processing_class and the built-in
    colours as the dataset: the images reach the engines and the learner, and the reward functions see TRL's
    arguments (the prompts' image parts, the `image` column)."""
    from PIL import Image
    from transformers import AutoProcessor

    from orchestrator.builtin.models.vlm import ensure_tiny_vlm
    from orchestrator.builtin.tasks.colors import colors_dataset
    from rayward import GRPOConfig, GRPOTrainer

    def reward_num_unique_chars(completions, **kwargs):  # TRL's own example reward
        return [len(set(c[0]["content"])) for c in completions]

    def saw_the_image(prompts, image, **kwargs):
        return [float(isinstance(p[-1]["content"][0]["image"], Image.Image) and isinstance(im, Image.Image))
                for p, im in zip(prompts, image, strict=True)]

    model = str(ensure_tiny_vlm())
    dataset = datasets.Dataset.from_list(colors_dataset(16))
    args = GRPOConfig(output_dir=str(tmp_path / "vlm"), use_cpu=True, per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=8, report_to="none", save_strategy="no",
                      disable_tqdm=True, max_steps=2)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_num_unique_chars, saw_the_image], args=args,
                          train_dataset=dataset, processing_class=AutoProcessor.from_pretrained(model))
    assert trainer.train().global_step == 2
    rows = [r for r in trainer.state.log_history if "reward" in r]
    assert all(r["rewards/saw_the_image/mean"] == 1.0 for r in rows)


def test_a_trl_vlm_script_whose_tool_returns_images_runs_unchanged_but_for_the_import(ray_cluster, tmp_path):
    """TRL's environment_factory with a VLM, the tool returning TRL's multimodal tool response (the cards task's
    CardEnv, which TRL's own GRPOTrainer runs as it is: bench/vlm_vs_trl.py --task cards), under `from rayward
    import`: the reward functions see the conversation as TRL passes it (the tool message's image a PIL image)."""
    from PIL import Image
    from transformers import AutoProcessor

    from orchestrator.builtin.models.vlm import ensure_tiny_tool_vlm
    from orchestrator.builtin.tasks.cards import CardEnv, card_letter, cards_dataset
    from rayward import GRPOConfig, GRPOTrainer

    def saw_the_card(completions, **kwargs):
        return [float(any(m["role"] == "tool" and isinstance(m["content"], list)
                          and isinstance(m["content"][0]["image"], Image.Image) for m in c)) for c in completions]

    model = str(ensure_tiny_tool_vlm())
    args = GRPOConfig(output_dir=str(tmp_path / "cards"), use_cpu=True, per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=48, max_tool_calling_iterations=2,
                      report_to="none", save_strategy="no", disable_tqdm=True, max_steps=2)
    trainer = GRPOTrainer(model=model, reward_funcs=[card_letter, saw_the_card], args=args,
                          train_dataset=datasets.Dataset.from_list(cards_dataset(16)),
                          processing_class=AutoProcessor.from_pretrained(model), environment_factory=CardEnv)
    assert trainer.train().global_step == 2
    rows = [r for r in trainer.state.log_history if "reward" in r]
    assert rows and all(r["rewards/saw_the_card/mean"] >= 0.9 for r in rows)
