"""LoRA end to end on a local Ray cluster: checkpoints hold the adapter in PEFT's format, the finished run writes
the merged model, --resume continues from the adapter checkpoint (a short run), and the demo task learns
with adapters, the generators running the merged weights. Both are runs of their own: the scenario tier (CI time;
CI's tier checks the adapter checkpoint, PEFT's merge and resume on the learner alone: tests/unit/actors/learner/
test_lora.py)."""

import json

from orchestrator.config import load_config
from orchestrator.run.train import train
from tests.conftest import ROOT

STEPS = 30
SHORT_STEPS = 2
RISE = 0.03
# Adapters on q_proj and v_proj only, at a larger step than the demo's (3e-3 barely moves them): the fastest
# learner in bench/README.md, "LoRA on the demo". Sampling is seeded per request (run seed, step, prompt draw), so
# the run is the same every time on one set of packages. The bar: the last 5 steps' mean at least twice the first 5
# steps' and RISE above it. A 5-step mean is 320 samples of a rate near 0.02-0.06, whose standard error is
# 0.008-0.013, so a difference of RISE is over two standard errors of the difference: a run whose adapters never
# reach the generators (no learning) stays below it.
LORA = ['model.lora={"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "save_merged": true}',
        "grpo.learning_rate=2e-2"]
# The merged generators' logprobs against the learner's base + adapter (float32 on both ends).
PARITY_GAP = 1e-3


def test_lora_checkpoints_in_peft_format_writes_the_merged_model_and_resumes(ray_cluster, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = [f"logging.dir={tmp_path}", f"grpo.save_steps={SHORT_STEPS}", *LORA]
    cfg = load_config(ROOT / "configs" / "demo.yaml", [*base, f"grpo.max_steps={SHORT_STEPS}"])
    history = train(cfg, name="lora", show_progress=False)
    assert max(h["sampling/sampling_logp_difference/max"] for h in history) < PARITY_GAP  # base + adapter, merged

    run_dir = tmp_path / "lora"
    ckpt = run_dir / f"checkpoint-{SHORT_STEPS}"
    assert json.loads((ckpt / "rayward_state.json").read_text())["global_step"] == SHORT_STEPS
    assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    base_path = json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"]
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), ckpt)  # PEFT's own loader
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged")  # a plain HF model, no PEFT
    assert type(merged).__name__ == "Qwen2ForCausalLM" and (run_dir / "merged" / "tokenizer.json").exists()

    more = load_config(ROOT / "configs" / "demo.yaml", [*base, f"grpo.max_steps={SHORT_STEPS + 2}"])
    resumed = train(more, name="lora", resume=True, show_progress=False)
    assert [h["step"] for h in resumed] == [SHORT_STEPS + 1, SHORT_STEPS + 2]
    assert resumed[0]["policy_version"] == SHORT_STEPS  # the generators got the checkpoint's merged weights
    assert max(h["sampling/sampling_logp_difference/max"] for h in resumed) < PARITY_GAP


def test_lora_learns_with_the_generators_on_the_merged_weights(ray_cluster, tmp_path):
    cfg = load_config(ROOT / "configs" / "demo.yaml", [f"logging.dir={tmp_path}", f"grpo.max_steps={STEPS}", *LORA])
    history = train(cfg, name="lora-learn", show_progress=False)
    letter = [h["rewards/letter/mean"] for h in history]
    first, last = sum(letter[:5]) / 5, sum(letter[-5:]) / 5
    print(f"LoRA letter reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}; "
          f"per step {[round(x, 3) for x in letter]}")
    assert last > first + RISE and last > 2 * first, (first, last)
    assert max(h["sampling/sampling_logp_difference/max"] for h in history) < PARITY_GAP
