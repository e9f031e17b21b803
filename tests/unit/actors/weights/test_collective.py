"""The weight-transfer collective without Ray or vLLM: bucket plans, packing, and real gloo groups in spawned
processes (a clean transfer, a member that never joins, a receiver that stalls)."""

from __future__ import annotations

import json

import pytest
import torch

from actors.weights.collective import (
    ALIGN_BYTES,
    DIRECT,
    bucket_tensors,
    plan_from_wire,
    plan_to_wire,
    receive_buffers,
    wire_tensors,
)
from tests.fixtures.collective import JOIN_TIMEOUT_S, plan_of, run_members, tensors


def test_plan_cuts_buckets_at_the_size_and_keeps_every_tensor_in_order():
    ts = tensors()
    plan = plan_of(ts, bucket_bytes=300)
    assert [m.name for b in plan for m in b.tensors] == list(ts)
    assert len(plan) > 1
    assert [m.name for b in plan for m in b.tensors if m.offset == DIRECT] == ["d"]
    for b in plan:
        assert all(m.offset % ALIGN_BYTES == 0 for m in b.tensors if m.offset != DIRECT)
        # a bucket exceeds the size only when a single tensor does
        assert sum(m.nbytes for m in b.tensors) <= 300 or len(b.tensors) == 1
    assert plan_from_wire(json.loads(json.dumps(plan_to_wire(plan)))) == plan  # survives plain serialisation


def test_wire_then_views_are_exact_for_mixed_dtypes_and_direct_tensors_are_not_copied():
    ts = tensors()
    (bucket,) = plan_of(ts, bucket_bytes=1 << 20)
    wire = wire_tensors(bucket, list(ts.values()), torch.device("cpu"))
    assert len(wire) == 2 and wire[0].dtype == torch.uint8 and wire[0].numel() == bucket.nbytes
    assert wire[1].data_ptr() == ts["d"].data_ptr()  # sent as it is
    assert ([(b.shape, b.dtype) for b in receive_buffers(bucket, torch.device("cpu"))]
            == [(w.shape, w.dtype) for w in wire])
    out = dict(bucket_tensors(bucket, wire))
    assert list(out) == list(ts)
    for k, v in ts.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k
    assert bucket.wire_bytes == bucket.nbytes + ts["d"].nbytes


@pytest.mark.slow  # spawns the group's processes
def test_gloo_group_moves_buckets_exactly(tmp_path):
    results = run_members(tmp_path, world=3, started=3, mode="ok", timeout_s=JOIN_TIMEOUT_S)
    assert all(r.get("equal") for r in results), results


@pytest.mark.slow  # spawns the group's processes
def test_a_member_that_never_joins_is_a_timeout_not_a_hang(tmp_path):
    r0, r1 = run_members(tmp_path, world=3, started=2, mode="ok")
    assert "did not form within 3 s: ranks [2] never joined" in r0["error"], r0  # rank 0 holds the store
    assert "did not form within 3 s" in r1["error"], r1


@pytest.mark.slow  # spawns the group's processes
def test_a_stalled_receiver_times_out_the_sender_naming_the_bucket(tmp_path):
    r0, r1 = run_members(tmp_path, world=2, started=2, mode="stall")
    assert "weight transfer failed at bucket 1" in r0["error"] and "timeout 3 s" in r0["error"], r0


@pytest.mark.parametrize("bucket_bytes", [1, 10**9])
def test_plan_extremes(bucket_bytes):
    ts = tensors()
    plan = plan_of(ts, bucket_bytes=bucket_bytes)
    assert len(plan) == (len(ts) if bucket_bytes == 1 else 1)
