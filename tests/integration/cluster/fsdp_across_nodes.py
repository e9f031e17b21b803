"""Driver for test_multinode_learner.py, run as a subprocess against a multi-node cluster (its own Ray client):

    python -m tests.integration.cluster.fsdp_across_nodes HOST:PORT OUT_DIR

Builds the learner exactly as `rayward run` does (`orchestrator.run.build.learner_spec` of a config with
`cluster.learner_placement: spread`, `actors.runtime.group.LearnerGroup`), 2 FSDP ranks and, beside them, 1 single
learner, and feeds both the same batches: step 1, a checkpoint of the 2 ranks, a fresh pair of spread ranks resuming
from it, step 2 on both sides, and a single learner resuming from the 2-rank checkpoint. Writes OUT_DIR/result.json: the
nodes each rank ran on, the losses, and the largest weight difference at each comparison (fp32, SGD)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from actors.types import TrainBatch
from tests.conftest import ROOT

COMPLETIONS, MICRO = 32, 16  # 2 micro-batches per step: one per rank

OVERRIDES = [
    "cluster.num_learners=2", "cluster.learner_strategy=fsdp", "cluster.learner_placement=spread",
    "cluster.learner.num_cpus=0.5", f"grpo.per_device_train_batch_size={MICRO}",
    f"generation.generation_batch_size={COMPLETIONS}",
    # SGD: weights move linearly in the gradient, so the ranks' summation order stays at ~1e-7 (AdamW would divide
    # exactly-zero gradients' float noise by itself: see tests/unit/actors/learner/test_learner_fsdp.py)
    "grpo.optim=sgd", "grpo.learning_rate=0.1", "grpo.beta=0.04",
]


def batch(seed: int) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    comps = [torch.randint(3, 500, (int(torch.randint(2, 17, (1,), generator=g)),), generator=g).tolist()
             for _ in range(COMPLETIONS)]
    return TrainBatch(
        prompt_ids=[[10, 11, 12 + i % 5] for i in range(COMPLETIONS)], completion_ids=comps,
        sampling_logprobs=[(-6.2 + 0.3 * torch.randn(len(c), generator=g)).tolist() for c in comps],
        advantages=torch.randn(COMPLETIONS, generator=g).tolist(), truncated=[False] * COMPLETIONS,
    )


def weights(group) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    blob = group.submit_export_weights().result()  # rank 0's full tensors (what the generators would receive)
    return load(blob)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def main(address: str, out: Path) -> None:
    import ray
    from ray.util.placement_group import placement_group_table

    from actors.learner.learner import Learner
    from actors.runtime.group import LearnerGroup
    from orchestrator.builtin.models.tiny import ensure_tiny_model
    from orchestrator.config import load_config
    from orchestrator.run.build import learner_spec
    from orchestrator.run.cluster import check_learner_placement

    cfg = load_config(ROOT / "configs" / "demo.yaml", OVERRIDES)
    ray.init(address=address, namespace="rayward-mn-fsdp", runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    check_learner_placement(cfg.cluster, ray.nodes())  # what train() checks at Ray start: it passes here
    kw = {"spec": learner_spec(cfg, str(ensure_tiny_model()))}
    opts = {"num_cpus": cfg.cluster.learner.num_cpus}

    def spread(name: str) -> LearnerGroup:
        return LearnerGroup(Learner, 2, run_name=name, strategy="fsdp", placement="spread", options=opts, kwargs=kw)

    two = spread("two")
    one = LearnerGroup(Learner, 1, run_name="one", strategy="single", options=opts, kwargs=kw)
    res: dict = {"nodes": placement_group_table(two.placement_group)["bundles_to_node_id"],
                 "initial_diff": max_diff(weights(two), weights(one))}
    initial = weights(one)
    m2, m1 = two.train_step(batch(1)).metrics, one.train_step(batch(1)).metrics
    w2, w1 = weights(two), weights(one)
    res |= {"loss_2": m2["loss"], "loss_1": m1["loss"], "kl_2": m2["kl"], "kl_1": m1["kl"],
            "step1_diff": max_diff(w2, w1), "moved": max_diff(w1, initial)}
    ckpt = str(out / "checkpoint-1")
    two.save_checkpoint(ckpt, extra={"note": "2 ranks on 2 nodes"})
    two.kill()

    resumed = spread("resumed")  # fresh ranks on two nodes, from the checkpoint rank 0 wrote
    res["resumed_nodes"] = placement_group_table(resumed.placement_group)["bundles_to_node_id"]
    res["resumed_state"] = resumed.load_checkpoint(ckpt)
    res["resumed_diff"] = max_diff(weights(resumed), w2)
    r2, r1 = resumed.train_step(batch(2)), one.train_step(batch(2))
    res |= {"loss2_2": r2.metrics["loss"], "loss2_1": r1.metrics["loss"], "step2_global": r2.global_step,
            "step2_diff": max_diff(weights(resumed), weights(one))}
    single = LearnerGroup(Learner, 1, run_name="single-from-2", strategy="single", options=opts, kwargs=kw)
    single.load_checkpoint(ckpt)
    res["single_from_2_diff"] = max_diff(weights(single), w2)
    (out / "result.json").write_text(json.dumps(res))
    for g in (resumed, one, single):
        g.kill()
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
