"""The padded and packed layouts of a micro-batch: how a packed row is built, that the tiny model computes the same
completion log-probs from both (sdpa, eager, flex; rows and one row), and which models and attention
implementations packing refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.learner.layout import pack, packing_refusal, pad
from tests.fixtures.tolerance import TINY_MODEL, assert_close_at_scale

CPU = torch.device("cpu")

samples = st.lists(
    st.tuples(st.lists(st.integers(3, 499), min_size=1, max_size=6), st.lists(st.integers(3, 499), max_size=9)),
    min_size=1, max_size=10,
)


@given(samples, st.booleans())
@settings(max_examples=200, deadline=None)
def test_a_packed_row_holds_whole_samples_with_restarting_positions(batch, one_row):
    prompts, comps = [p for p, _ in batch], [c for _, c in batch]
    rows = pack(prompts, comps, 0, CPU, one_row=one_row)
    r, n = rows.input_ids.shape
    cap = max(map(len, prompts)) + max(map(len, comps))
    assert r == 1 if one_row else n <= cap and r <= len(batch)  # never more attention work than padding
    ids, pos = rows.input_ids.flatten(), rows.position_ids.flatten()
    # every position that predicts a completion token is followed by that token, at the next position of its sample
    assert torch.equal(ids[rows.keep + 1], rows.targets) and torch.equal(pos[rows.keep + 1], pos[rows.keep] + 1)
    pairs = list(zip(rows.sample.tolist(), rows.offset.tolist(), strict=True))  # where each goes in [B, T]
    assert sorted(pairs) == [(i, j) for i, c in enumerate(comps) for j in range(len(c))]
    assert rows.targets.tolist() == [comps[i][j] for i, j in pairs]
    assert rows.shape == (len(batch), max(max(map(len, comps)), 1))
    assert rows.real_tokens == sum(len(p) + len(c) for p, c in batch)
    # cut at each position 0, a row is whole samples (positions 0, 1, ...) then at most one run of pad
    segments, tails = [], 0
    for row_ids, row_pos in zip(rows.input_ids.tolist(), rows.position_ids.tolist(), strict=True):
        starts = [j for j, x in enumerate(row_pos) if x == 0] + [n]
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            assert row_pos[a:b] == list(range(b - a))
            if set(row_ids[a:b]) == {0}:  # the pad id; sample tokens are >= 3
                assert b == n
                tails += 1
            else:
                segments.append(row_ids[a:b])
    assert sorted(segments) == sorted(p + c for p, c in batch) and tails <= r
    assert rows.positions - rows.real_tokens == sum(len(x) for x in rows.input_ids.tolist()) - rows.real_tokens
    if one_row:
        assert rows.positions == rows.real_tokens  # one row: no pad at all


def test_rows_fill_up_to_the_padded_row_length():
    """Samples of 12, 5, 4, 3 tokens (prompt 2 + completion), cap 2 + 10: first-fit-decreasing rows [12] and
    [5, 4, 3], the second row's positions 0..4, 0..3, 0..2."""
    prompts = [[5, 6]] * 4
    comps = [list(range(10, 20)), [7, 8, 9], [7, 8], [7]]
    rows = pack(prompts, comps, 0, CPU, one_row=False)
    assert rows.input_ids.shape == (2, 12) and rows.positions - rows.real_tokens == 0
    assert rows.position_ids[1].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]
    padded = pad(prompts, comps, 0, CPU)
    assert padded.positions == 4 * 12 and padded.real_tokens == 24


@pytest.mark.parametrize("impl", ["sdpa", "eager", "flex_attention"])
@pytest.mark.parametrize("one_row", [False, True])
def test_packed_and_padded_forwards_give_the_same_logprobs(tiny_model_path, impl, one_row):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation=impl).eval()
    assert packing_refusal(model) is None
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (3, 5, 2, 4, 3, 6)]
    comps = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (7, 1, 12, 4, 9, 2)]
    mask = torch.zeros(6, 12)
    for r, c in enumerate(comps):
        mask[r, : len(c)] = 1
    logps = []
    with torch.no_grad():
        for rows in (pad(prompts, comps, 0, CPU), pack(prompts, comps, 0, CPU, one_row=one_row)):
            lp = torch.log_softmax(rows.logits(model)[0], -1).gather(-1, rows.targets.unsqueeze(-1)).squeeze(-1)
            logps.append(rows.unflatten(lp) * mask)
    assert logps[1].shape == (6, 12)
    # float32, the same weights: packed and padded differ in the order the attention adds and in the matmuls'
    # shapes, the tiny model's rounding at the log-probs' size (tests/fixtures/tolerance.py)
    assert_close_at_scale(logps[1], logps[0], TINY_MODEL)
    assert logps[0].abs().min() == 0 and (logps[0] * mask).abs().sum() > 0  # compared on real tokens only


def test_the_head_runs_on_completion_positions_only(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    rows = pack([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], 0, CPU, one_row=False)
    with torch.no_grad():
        assert rows.logits(model)[0].shape == (5, 512)  # [completion tokens, vocabulary]
    assert model.get_output_embeddings()._forward_pre_hooks == {}  # the gather hook is gone afterwards


def test_packing_refuses_state_carrying_layers_and_unknown_attention(tiny_model_path):
    from transformers import AutoModelForCausalLM, Lfm2Config

    from actors.learner.model import meta_model

    assert packing_refusal(meta_model(tiny_model_path)) is None  # Qwen2, sdpa
    why = packing_refusal(meta_model(tiny_model_path, attn_implementation="paged|eager"))
    assert "Qwen2ForCausalLM runs attention implementation 'paged|eager'; packed rows need one of" in why
    cfg = Lfm2Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                     num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"])
    with torch.device("meta"):
        lfm2 = AutoModelForCausalLM.from_config(cfg)
    assert packing_refusal(lfm2) == "Lfm2ForCausalLM has ['conv'] layers, which carry state across the samples " \
                                    "of a packed row"
