"""The learner on CUDA (skipped without a GPU): the same update as on CPU, in float32 and bfloat16."""

import pytest
import torch

from actors.learner.learner import Learner
from actors.types import TrainBatch
from tests.fixtures.learner import assert_step_follows_advantages, spec


def _batch():
    g = torch.Generator().manual_seed(0)
    comps = [torch.randint(3, 500, (8,), generator=g).tolist() for _ in range(8)]
    return TrainBatch(prompt_ids=[[10, 11, 12]] * 8, completion_ids=comps, sampling_logprobs=[[float("nan")] * 8] * 8,
                      advantages=[1.0, -1.0] * 4, truncated=[False] * 8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_step_matches_cpu_direction(tiny_model_path, dtype):
    lr = Learner(spec(tiny_model_path, loss_type="dapo", learning_rate=1e-2, micro_batch_size=4, dtype=dtype))
    assert lr.device.type == "cuda"
    assert_step_follows_advantages(lr, _batch())


def test_cuda_logprobs_match_cpu(tiny_model_path):
    gpu = Learner(spec(tiny_model_path, loss_type="dapo"))
    ids = [5, 17, 42, 8, 99, 23, 61]
    cpu_model = gpu.model.to("cpu")
    cpu_lp = Learner._forward_logps.__get__(gpu)  # same code path, model moved
    gpu.device = torch.device("cpu")
    want = cpu_lp(cpu_model, gpu.layout([ids[:1]], [ids[1:]]), with_entropy=False)[0]
    gpu.model, gpu.device = cpu_model.to("cuda"), torch.device("cuda")
    got = gpu._forward_logps(gpu.model, gpu.layout([ids[:1]], [ids[1:]]), with_entropy=False)[0].cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
