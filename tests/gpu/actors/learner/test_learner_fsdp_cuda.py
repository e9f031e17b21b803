"""FSDP learner ranks on CUDA (skipped without a GPU): one rank against the single-device learner in float32,
one rank with bfloat16 mixed precision (float32 masters), and two NCCL ranks when there are two GPUs."""

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load as safetensors_load

from actors.learner.checkpoint import full_state_dict
from actors.learner.learner import Learner
from actors.runtime.net import free_port
from tests.fixtures.learner import SCENARIOS, assert_step_follows_advantages, make_batch, scenario_spec

ATOL = 1e-5  # fp32 on one GPU: the same kernels; FSDP adds only the (exact) all-gather and reduce


def _cuda_spec(path: str, name: str):
    return scenario_spec(path, **SCENARIOS[name][1], device="cuda")


def _assert_same_weights(got: dict, single: Learner) -> None:
    want = {k: v for k, v in single.model.state_dict().items() if k not in single.tied}
    assert got.keys() == want.keys()
    for k, v in want.items():
        torch.testing.assert_close(got[k].cpu(), v.cpu(), rtol=0, atol=ATOL, msg=k)


@pytest.mark.parametrize("name", ["grpo", "dapo"])  # grpo: with a sharded reference model (beta 0.1)
def test_one_fsdp_rank_on_cuda_matches_the_single_device_learner(tiny_model_path, name):
    n = SCENARIOS[name][0]
    single = Learner(_cuda_spec(tiny_model_path, name))
    m1 = single.train_step(make_batch(n)).metrics
    fsdp = Learner(_cuda_spec(tiny_model_path, name), strategy="fsdp")  # world 1: its own process group
    assert fsdp.device.type == "cuda"
    m2 = fsdp.train_step(make_batch(n)).metrics
    _assert_same_weights(full_state_dict(fsdp.train_state()), single)
    for k in ("loss", "grad_norm", "entropy"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
    got, want = safetensors_load(fsdp.export_weights()), safetensors_load(single.export_weights())
    assert got.keys() == want.keys()


def test_bf16_fsdp_keeps_fp32_masters_and_learns(tiny_model_path):
    spec = scenario_spec(tiny_model_path, loss_type="dapo", micro_batch_size=4, optim="adamw_torch",
                         learning_rate=1e-2, device="cuda", dtype="bfloat16")
    lr = Learner(spec, strategy="fsdp")
    assert all(p.dtype == torch.float32 for p in lr.model.parameters())  # masters; compute in bf16
    b = make_batch(8)
    b.advantages = [1.0, -1.0] * 4
    stats = assert_step_follows_advantages(lr, b)
    exported = safetensors_load(lr.export_weights())
    assert {t.dtype for t in exported.values()} == {torch.bfloat16}  # the generators' dtype, half the bytes
    single = Learner(spec)  # the single-device bf16 learner: bf16 weights, same first loss
    assert single.train_step(b).metrics["loss"] == pytest.approx(stats["loss"], rel=2e-2, abs=1e-4)


def _nccl_rank(rank: int, port: int, path: str, out: str) -> None:
    lr = Learner(_cuda_spec(path, "grpo"), strategy="fsdp", rank=rank, world_size=2,
                 init_method=f"tcp://127.0.0.1:{port}")
    metrics = lr.train_step(make_batch(SCENARIOS["grpo"][0])).metrics
    weights = full_state_dict(lr.train_state())
    if rank == 0:
        torch.save({"metrics": metrics, "weights": weights}, out)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_nccl_ranks_match_the_single_device_learner(tiny_model_path, tmp_path):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(_nccl_rank, args=(free_port(), tiny_model_path, out), nprocs=2, join=True)
    seen = torch.load(out, weights_only=False)
    single = Learner(_cuda_spec(tiny_model_path, "grpo"))
    m1 = single.train_step(make_batch(SCENARIOS["grpo"][0])).metrics
    _assert_same_weights(seen["weights"], single)
    assert seen["metrics"]["loss"] == pytest.approx(m1["loss"], rel=1e-4, abs=1e-6)
