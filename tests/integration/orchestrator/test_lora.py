"""LoRA end to end on a local Ray cluster: the demo task learns with adapters (the generators running the merged
weights), checkpoints hold the adapter in PEFT's format, the finished run writes the merged model, and --resume
continues from the adapter checkpoint."""

import json

from orchestrator.config import load_config
from orchestrator.train import train
from tests.conftest import ROOT

STEPS = 30
RISE = 0.03
# Adapters on q_proj and v_proj only, at a larger step than the demo's (3e-3 barely moves them): the fastest
# learner in bench/README.md, "LoRA on the demo". Sampling is seeded per request (run seed, step, prompt draw), so
# the run is the same every time on one set of packages. The bar: the last 5 steps' mean at least twice the first 5
# steps' and RISE above it. A 5-step mean is 320 samples of a rate near 0.02-0.06, whose standard error is
# 0.008-0.013, so a difference of RISE is over two standard errors of the difference: a run whose adapters never
# reach the generators (no learning) stays below it.
LORA = ['model.lora={"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "save_merged": true}',
        "grpo.learning_rate=2e-2"]


def test_lora_learns_checkpoints_in_peft_format_writes_the_merged_model_and_resumes(ray_cluster, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = [f"logging.dir={tmp_path}", f"grpo.save_steps={STEPS}", *LORA]
    cfg = load_config(ROOT / "configs" / "demo.yaml", [*base, f"grpo.max_steps={STEPS}"])
    history = train(cfg, name="lora", show_progress=False)
    letter = [h["rewards/letter/mean"] for h in history]
    first, last = sum(letter[:5]) / 5, sum(letter[-5:]) / 5
    print(f"LoRA letter reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}; per step {[round(x, 3) for x in letter]}")
    assert last > first + RISE and last > 2 * first, (first, last)
    gaps = [h["sampling/sampling_logp_difference/max"] for h in history]
    assert max(gaps) < 1e-3, gaps  # the generators run exactly base + adapter, merged

    run_dir = tmp_path / "lora"
    ckpt = run_dir / f"checkpoint-{STEPS}"
    assert json.loads((ckpt / "rayward_state.json").read_text())["global_step"] == STEPS
    assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    base_path = json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"]
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), ckpt)  # PEFT's own loader
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged")  # a plain HF model, no PEFT
    assert type(merged).__name__ == "Qwen2ForCausalLM" and (run_dir / "merged" / "tokenizer.json").exists()

    more = load_config(ROOT / "configs" / "demo.yaml", [*base, f"grpo.max_steps={STEPS + 2}"])
    resumed = train(more, name="lora", resume=True, show_progress=False)
    assert [h["step"] for h in resumed] == [STEPS + 1, STEPS + 2]
    assert resumed[0]["policy_version"] == STEPS  # the generators got the checkpoint's merged weights
    assert max(h["sampling/sampling_logp_difference/max"] for h in resumed) < 1e-3
