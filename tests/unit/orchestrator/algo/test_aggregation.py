import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.algo.aggregation import Gate, RewardAggregator, apply_gates
from orchestrator.config import parse_config, scheduled
from tests.conftest import ROOT


def sched(**kw):
    return parse_config({"rewards": [{"name": "r", "function": "f", "schedule": kw}]}).rewards[0].schedule


def test_schedules():
    lin = sched(type="linear", start=1.0, end=0.0, start_step=0, end_step=50)
    assert [scheduled(lin, s) for s in (0, 25, 50, 80)] == [1.0, 0.5, 0.0, 0.0]
    cos = sched(type="cosine", start=0.0, end=2.0, start_step=10, end_step=20)
    assert scheduled(cos, 0) == 0.0 and scheduled(cos, 15) == pytest.approx(1.0)
    assert scheduled(cos, 20) == pytest.approx(2.0) and scheduled(cos, 99) == pytest.approx(2.0)
    pw = sched(type="piecewise", steps=[[0, 0.0], [20, 1.0], [40, 0.5]])
    assert [scheduled(pw, s) for s in (0, 19, 20, 39, 40, 100)] == [0.0, 0.0, 1.0, 1.0, 0.5, 0.5]
    assert scheduled(sched(type="constant", value=3.0), 7) == 3.0
    assert scheduled(2.5, 7) == 2.5


@given(st.integers(0, 200), st.integers(0, 100), st.integers(1, 100), st.floats(-5, 5), st.floats(-5, 5))
def test_ramps_stay_between_endpoints(step, start_step, length, a, b):
    for kind in ("linear", "cosine"):
        s = sched(type=kind, start=a, end=b, start_step=start_step, end_step=start_step + length)
        v = scheduled(s, step)
        assert min(a, b) - 1e-9 <= v <= max(a, b) + 1e-9
        if step <= start_step:
            assert v == pytest.approx(a)
        if step >= start_step + length:
            assert v == pytest.approx(b)


def test_gate_replaces_gated_reward_below_threshold():
    raw = torch.tensor([[0.0, 5.0], [1.0, 5.0], [math.nan, 5.0], [0.4, math.nan]])
    out, closed = apply_gates(raw, [Gate(gated=1, gating=0, threshold=0.5, fill=-1.0)])
    assert out[:, 1].tolist()[:2] == [-1.0, 5.0]
    assert out[2, 1] == 5.0  # a None gating value leaves the gate open
    assert out[3, 1] == -1.0  # a closed gate fills even where the gated reward had no opinion
    assert closed[:, 0].tolist() == [True, False, False, True]
    assert torch.equal(out[:, 0].nan_to_num(7), raw[:, 0].nan_to_num(7))  # the gating reward is untouched


def test_gates_chain_in_dependency_order():
    # A gates B (B < 1 -> 0), B gates C; given in reverse order, A's closing must still propagate to C.
    raw = torch.tensor([[0.0, 1.0, 3.0], [1.0, 1.0, 3.0]])
    gates = [Gate(gated=2, gating=1, threshold=1.0, fill=0.0), Gate(gated=1, gating=0, threshold=1.0, fill=0.0)]
    out, closed = apply_gates(raw, gates)
    assert out.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 3.0]]
    assert closed.tolist() == [[True, True], [False, False]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.floats(-3, 3)), min_size=3, max_size=3), min_size=1, max_size=16),
       st.floats(-2, 2), st.floats(-2, 2))
def test_gate_properties(rows, t1, t2):
    raw = torch.tensor([[math.nan if v is None else v for v in r] for r in rows])
    gates = [Gate(1, 0, t1, 0.0), Gate(2, 1, t2, -9.0)]
    out, closed = apply_gates(raw, gates)
    # ungated column unchanged; a gated entry is either its raw value or the fill
    assert torch.equal(out[:, 0].nan_to_num(123.0), raw[:, 0].nan_to_num(123.0))
    for i in range(len(rows)):
        assert bool(closed[i, 0]) == bool(raw[i, 0] < t1)
        assert out[i, 1].item() == 0.0 if closed[i, 0] else (math.isnan(out[i, 1]) == math.isnan(raw[i, 1]))
        assert bool(closed[i, 1]) == bool(out[i, 1] < t2)


def test_aggregator_weights_follow_schedules_and_gate_thresholds():
    cfg = parse_config({"rewards": [
        {"name": "correct", "function": "f", "weight": 2.0},
        {"name": "fmt", "function": "f", "weight": 1.0,
         "schedule": {"type": "linear", "start": 1, "end": 0, "end_step": 10}},
        {"name": "style", "function": "f",
         "gate": {"reward": "correct", "threshold": {"type": "piecewise", "steps": [[0, 0.0], [5, 1.0]]}}},
    ]})
    agg = RewardAggregator(cfg.rewards)
    assert agg.weights(0).tolist() == [2.0, 1.0, 1.0]
    assert agg.weights(5).tolist() == [2.0, 0.5, 1.0]
    raw = torch.tensor([[0.5, 1.0, 1.0], [1.0, 1.0, 1.0]])
    early, late = agg(raw, 0), agg(raw, 5)
    assert early.gated[:, 2].tolist() == [1.0, 1.0] and early.gate_closed == {"style<-correct": 0.0}
    assert late.gated[:, 2].tolist() == [0.0, 1.0] and late.gate_closed == {"style<-correct": 0.5}


def test_readme_worked_example():
    """The worked example of docs/rewards.md: configs/letter-curriculum.yaml at step 12."""

    from orchestrator.algo.grpo import compute_advantages
    from orchestrator.config import load_config

    cfg = load_config(ROOT / "configs" / "letter-curriculum.yaml")
    agg = RewardAggregator(cfg.rewards)
    raw = torch.tensor([[1.0, 1.0, 1 / 1.5], [0.5, 1.0, 0.8], [0.0, 0.0, 0.8]])  # letter, starts, brevity
    out = agg(raw, 12)
    assert out.weights.tolist() == pytest.approx([1.0, 0.3, 0.3])
    assert out.gated[:, 2].tolist() == pytest.approx([1 / 1.5, 0.8, 0.0])
    total = compute_advantages(out.gated, out.weights, 3, "group", "sum_then_normalize").total
    assert total.tolist() == pytest.approx([1.5, 1.04, 0.0])
    assert agg(raw, 9).weights[2] == 0.0  # brevity off before step 10
