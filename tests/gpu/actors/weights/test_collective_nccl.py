"""The weight-transfer collective on CUDA: the same code makes an NCCL group (one rank per GPU). Skipped without
CUDA (tests/conftest.py) and without two GPUs (NCCL refuses two ranks on one device)."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.collective import JOIN_TIMEOUT_S, plan_of, run_members, tensors

needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one NCCL rank per GPU)")


@needs_two
def test_nccl_group_moves_buckets_exactly(tmp_path):
    results = run_members(tmp_path, world=2, started=2, mode="ok", device_type="cuda", timeout_s=JOIN_TIMEOUT_S)
    assert all(r.get("equal") for r in results), results


@needs_two
def test_nccl_member_that_never_joins_is_a_timeout(tmp_path):
    results = run_members(tmp_path, world=3, started=2, mode="ok", device_type="cuda")
    assert all("could not join" in r.get("error", "") or "failed at bucket" in r.get("error", "") for r in results)


def test_wire_tensors_on_the_gpu():
    from actors.weights.collective import bucket_tensors, wire_tensors

    ts = {k: v.cuda() for k, v in tensors().items()}
    (bucket,) = plan_of(ts, bucket_bytes=1 << 20)
    out = dict(bucket_tensors(bucket, wire_tensors(bucket, list(ts.values()), torch.device("cuda"))))
    assert all(torch.equal(out[k], v) for k, v in ts.items())
