"""The learner on CUDA (skipped without a GPU): the same update as on CPU, in float32 and bfloat16."""

import functools

import pytest
import torch

from actors.learner.learner import Learner
from actors.types import TrainBatch
from orchestrator.grpo import grpo_loss


def _batch():
    g = torch.Generator().manual_seed(0)
    comps = [torch.randint(3, 500, (8,), generator=g).tolist() for _ in range(8)]
    return TrainBatch(prompt_ids=[[10, 11, 12]] * 8, completion_ids=comps, sampling_logprobs=[[float("nan")] * 8] * 8,
                      advantages=[1.0, -1.0] * 4, truncated=[False] * 8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_step_matches_cpu_direction(tiny_model_path, dtype):
    lr = Learner(tiny_model_path, loss_fn=functools.partial(grpo_loss, loss_type="dapo"), learning_rate=1e-2,
                 micro_batch_size=4, dtype=dtype)
    assert lr.device.type == "cuda"
    assert_step_follows_advantages(lr, _batch())


def assert_step_follows_advantages(lr: Learner, b: dict) -> dict:
    """One train_step on a batch with advantages +1, -1, ...: the +1 sequences gain logprob, the -1 ones
    lose it. Returns the step's stats."""
    with torch.no_grad():
        before, _ = lr._forward_logps(lr.model, b.prompt_ids, b.completion_ids, with_entropy=False)
    stats = lr.train_step(b)
    with torch.no_grad():
        after, _ = lr._forward_logps(lr.model, b.prompt_ids, b.completion_ids, with_entropy=False)
    delta = (after - before).sum(-1).float().cpu()
    assert torch.isfinite(torch.tensor(stats["loss"])) and stats["grad_norm"] > 0
    assert (delta[0::2] > 0).all() and (delta[1::2] < 0).all()
    return stats


def test_cuda_logprobs_match_cpu(tiny_model_path):
    kw = dict(loss_fn=functools.partial(grpo_loss, loss_type="dapo"))
    gpu = Learner(tiny_model_path, **kw)
    ids = [5, 17, 42, 8, 99, 23, 61]
    cpu_model = gpu.model.to("cpu")
    cpu_lp = Learner._forward_logps.__get__(gpu)  # same code path, model moved
    gpu.device = torch.device("cpu")
    want = cpu_lp(cpu_model, [ids[:1]], [ids[1:]], with_entropy=False)[0]
    gpu.model, gpu.device = cpu_model.to("cuda"), torch.device("cuda")
    got = gpu._forward_logps(gpu.model, [ids[:1]], [ids[1:]], with_entropy=False)[0].cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
