"""Two FSDP learner ranks (gloo, CPU) in a real run: they train, the generators load rank 0's full weights
after every step (logprob parity), and their checkpoint resumes on a single learner."""

import json
import math

from orchestrator.config import load_config
from orchestrator.train import train
from tests.conftest import ROOT

STEPS = 4
FSDP = ["cluster.num_learners=2", "cluster.learner_strategy=fsdp", "cluster.learner.num_cpus=0.5"]


def test_two_fsdp_ranks_train_sync_and_resume_on_one(ray_cluster, tmp_path):
    base = [f"logging.dir={tmp_path}", f"grpo.save_steps={STEPS}",
            "grpo.per_device_train_batch_size=16"]  # 64 completions: 4 micro-batches, 2 per rank
    cfg = load_config(ROOT / "configs" / "demo.yaml", [*base, *FSDP, f"grpo.max_steps={STEPS}"])
    history = train(cfg, name="fsdp-2", show_progress=False)
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    assert all(math.isfinite(h["loss"]) and h["grad_norm"] > 0 for h in history)
    assert all(h["num_tokens"] > 0 for h in history)
    gaps = [h["sampling/sampling_logp_difference/max"] for h in history]
    print(f"2 FSDP ranks: max |logp_vllm - logp_learner| per step {gaps}")
    assert max(gaps) < 1e-3  # the generators hold exactly the weights the ranks train (full, unsharded)
    ckpt = tmp_path / "fsdp-2" / f"checkpoint-{STEPS}"
    assert json.loads((ckpt / "rayward_state.json").read_text())["global_step"] == STEPS
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ckpt)  # a plain HF checkpoint, written by rank 0

    # the 2-rank checkpoint resumes on one learner (same on-disk format), and training goes on in parity
    one = load_config(ROOT / "configs" / "demo.yaml", [*base, f"grpo.max_steps={STEPS + 2}"])
    resumed = train(one, name="fsdp-2", resume=True, show_progress=False)
    assert [h["step"] for h in resumed] == [STEPS + 1, STEPS + 2]
    assert resumed[0]["policy_version"] == STEPS
    assert max(h["sampling/sampling_logp_difference/max"] for h in resumed) < 1e-3
