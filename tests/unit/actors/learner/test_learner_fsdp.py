"""Two FSDP learner ranks (torch.multiprocessing + gloo, no Ray) against the single-rank Learner.

One spawn of 2 ranks runs every scenario (the spawn, not the tiny model, is the slow part) and rank 0
writes what it saw; the tests compare it with single-rank learners built here on the same batch:
updated weights, metrics, export bytes, and checkpoints moving 2 ranks -> 1 rank and 1 rank -> 2 ranks, for full
fine-tuning and for LoRA (adapters sharded with their layers, the reference by disabled adapters, the merged export,
the adapter checkpoint), with micro-batches of a fixed size and token-budget bins, packed (the default) and padded.
Gradient checkpointing is on (the Learner's default, TRL's) on both sides.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load as safetensors_load

from actors.learner.checkpoint import full_state_dict
from actors.learner.learner import Learner
from actors.runtime.net import free_port
from tests.fixtures.learner import SCENARIOS, TIMED_METRICS, make_batch, scenario_spec

# Scenario tier (CI time): spawns two gloo rank processes and builds a dozen learners; CI's tier keeps the one-rank
# learner, and the cross-node FSDP run is in tests/integration/cluster/test_multinode_learner.py.
pytestmark = pytest.mark.slow

WORLD = 2
# fp32, the same micro-batches through the same kernels: only the sums over the ranks and the micro-batches (a
# handful of terms) add in another order, so the gradients differ by a few roundings and SGD's weights (order one,
# moved linearly in the gradient) by a few float32 eps of their size, which ATOL holds.
ATOL = 1e-6
# AdamW steps each element by about lr whatever its gradient's size (m / sqrt(v)), so an element whose gradient is
# near its own rounding steps by an amount that rounding decides, up to lr either way. Such elements exist: the
# k_proj biases' gradient nearly cancels in the dimensions RoPE turns slowly (softmax ignores a shift common to all
# keys). Their rounding is still a small part of them here, so the weights stay within a small share of lr (lr
# 1e-3 here); the moments, linear in the gradient, are the tight check (_assert_optimizer_states_close).
ATOL_ADAM = 5e-5
# Scenarios whose checkpoints move between 1 and 2 ranks: AdamW moments, plain SGD (no optimizer state at all), LoRA.
CHECKPOINTED = ("dapo", "grpo", "lora")


def _rank(rank: int, port: int, path: str, out: str, *ckpts: str) -> None:
    """One rank: every scenario, then the checkpoints. Rank 0 saves its observations to `out`."""
    torch.set_num_threads(1)
    fsdp = dict(strategy="fsdp", rank=rank, world_size=WORLD, init_method=f"tcp://127.0.0.1:{port}")
    seen = {}
    lr = Learner(scenario_spec(path, loss_type="dapo"), **fsdp)
    seen["export_at_init"] = lr.export_weights()
    for name, (n, kw) in SCENARIOS.items():
        lr = Learner(scenario_spec(path, **kw), **fsdp)
        result = lr.train_step(make_batch(n))
        seen[name] = {"result": result, "weights": full_state_dict(lr.train_state()), "export": lr.export_weights()}
        if name in CHECKPOINTED:
            lr.save_checkpoint(f"{out}-ckpt-{name}-2rank", extra={"note": "2 ranks"})
    for name, ckpt in zip(CHECKPOINTED, ckpts, strict=True):
        lr = Learner(scenario_spec(path, **SCENARIOS[name][1]), **fsdp)
        seen[f"loaded_1rank_{name}"] = lr.load_checkpoint(ckpt)
        lr.save_checkpoint(f"{out}-ckpt-{name}-resaved")
    if rank == 0:
        torch.save(seen, out)


@pytest.fixture(scope="module")
def ranks(tiny_model_path, tmp_path_factory):
    """Rank 0's observations, after a 1-rank checkpoint of the dapo scenario was written for them to load."""
    tmp = tmp_path_factory.mktemp("fsdp")
    ckpts = [single_after_step(tiny_model_path, name).save_checkpoint(str(tmp / f"ckpt-{name}-1rank"),
                                                                      extra={"note": "1 rank"})
             for name in CHECKPOINTED]
    out = str(tmp / "rank0.pt")
    mp.spawn(_rank, args=(free_port(), tiny_model_path, out, *ckpts), nprocs=WORLD, join=True)
    return torch.load(out, weights_only=False), tmp


def single_after_step(path: str, name: str) -> Learner:
    n, kw = SCENARIOS[name]
    lr = Learner(scenario_spec(path, **kw))
    lr.result = lr.train_step(make_batch(n))
    return lr


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_ranks_update_and_report_as_one(ranks, tiny_model_path, name):
    seen, _ = ranks
    single = single_after_step(tiny_model_path, name)
    got = seen[name]
    want = {k: v for k, v in single.model.state_dict().items() if k not in single.tied}
    atol = ATOL_ADAM if single.optimizer.__class__.__name__ == "AdamW" else ATOL
    assert got["weights"].keys() == want.keys()
    for k, v in want.items():
        torch.testing.assert_close(got["weights"][k], v, rtol=0, atol=atol, msg=k)
    fresh = Learner(scenario_spec(tiny_model_path, **SCENARIOS[name][1]))
    moved = max((single.model.state_dict()[k] - v).abs().max().item() for k, v in fresh.model.state_dict().items())
    assert moved > 10 * atol  # the step really moved the weights, the comparison is not vacuous
    m1, m2 = single.result.metrics, got["result"].metrics
    assert m1.keys() == m2.keys()
    for k in m1.keys() - TIMED_METRICS:  # per-micro-batch values of the same forwards, averaged over all ranks
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
    assert got["result"].num_tokens == single.result.num_tokens  # the whole batch's loss tokens on every rank
    assert got["result"].global_step == single.result.global_step == SCENARIOS[name][1].get("num_iterations", 1)
    if name in ("grpo", "lora"):
        assert m2["kl"] > 0  # the sharded reference model (LoRA: the sharded policy, adapters disabled) took part
    if name == "dapo":
        assert 0 < m2["sampling/importance_sampling_ratio/mean"] and m2["sampling/importance_sampling_ratio/max"] <= 3.0
    if "budget" in name:  # several bins, balanced over the ranks (one may pad a slot)
        assert m2["learner/micro_batches"] >= 3 and m2["learner/padding_frac"] == m1["learner/padding_frac"]


@pytest.mark.parametrize("name", ["dapo", "lora"])
def test_export_weights_from_rank0_equals_single_rank(ranks, tiny_model_path, name):
    seen, _ = ranks
    single = Learner(scenario_spec(tiny_model_path, loss_type="dapo"))
    assert seen["export_at_init"] == single.export_weights()  # byte for byte
    trained = single_after_step(tiny_model_path, name)
    got, want = safetensors_load(seen[name]["export"]), safetensors_load(trained.export_weights())
    assert got.keys() == want.keys() and "lm_head.weight" not in got  # tied: sent once, as today
    assert not any("lora_" in k or "base_layer" in k for k in got)  # LoRA: merged, under the HF names
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=ATOL_ADAM, msg=k)


def _assert_optimizer_states_close(a: dict, b: dict) -> None:
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for key in a["state"][i]:
            # the moments, the gradient's running mean and mean square: its relative rounding, doubled for the square
            torch.testing.assert_close(a["state"][i][key].cpu().float(), b["state"][i][key].cpu().float(),
                                       rtol=1e-4, atol=1e-7, msg=f"{i}.{key}")
    # torch.distributed.checkpoint hands AdamW's betas back as a list: the same values for load_state_dict
    same = [[{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in x["param_groups"]] for x in (a, b)]
    assert same[0] == same[1]


@pytest.mark.parametrize("name", CHECKPOINTED)
def test_checkpoint_from_two_ranks_resumes_on_one(ranks, tiny_model_path, name):
    seen, tmp = ranks
    single = single_after_step(tiny_model_path, name)
    other = Learner(scenario_spec(tiny_model_path, **SCENARIOS[name][1]))
    state = other.load_checkpoint(str(tmp / f"rank0.pt-ckpt-{name}-2rank"))
    assert state["note"] == "2 ranks" and other.global_step == 2
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(other.model.state_dict()[k], v, rtol=0, atol=ATOL_ADAM, msg=k)
    _assert_optimizer_states_close(other.optimizer.state_dict(), single.optimizer.state_dict())
    assert bool(other.optimizer.state_dict()["state"]) == (SCENARIOS[name][1].get("optim") == "adamw_torch")
    assert other.scheduler.state_dict() == single.scheduler.state_dict()
    # and the resumed learner trains on
    assert math.isfinite(other.train_step(make_batch(12)).metrics["loss"]) and other.global_step == 4


@pytest.mark.parametrize("name", CHECKPOINTED)
def test_checkpoint_from_one_rank_resumes_on_two(ranks, name):
    seen, tmp = ranks
    assert seen[f"loaded_1rank_{name}"]["note"] == "1 rank"
    from safetensors.torch import load_file

    a, b = tmp / f"ckpt-{name}-1rank", tmp / f"rank0.pt-ckpt-{name}-resaved"  # loaded on 2 ranks, saved again
    file = "adapter_model.safetensors" if name == "lora" else "model.safetensors"
    wa, wb = load_file(str(a / file)), load_file(str(b / file))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    oa = torch.load(a / "optimizer.pt", weights_only=False)
    ob = torch.load(b / "optimizer.pt", weights_only=False)
    _assert_optimizer_states_close(ob["optimizer"], oa["optimizer"])
    assert oa["scheduler"] == ob["scheduler"]
    if name == "lora":  # PEFT writes target_modules from a set: its order varies between processes
        ca, cb = (json.loads((d / "adapter_config.json").read_text()) for d in (a, b))
        assert sorted(ca.pop("target_modules")) == sorted(cb.pop("target_modules")) and ca == cb
    else:
        assert (b / "config.json").read_text() == (a / "config.json").read_text()


def test_strategy_single_refuses_several_ranks(tiny_model_path):
    with pytest.raises(ValueError, match="world_size"):
        Learner(scenario_spec(tiny_model_path, loss_type="dapo"), world_size=2)
