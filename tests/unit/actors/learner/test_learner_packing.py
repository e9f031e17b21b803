"""The Learner packed (grpo.padding_free) against padded on the tiny model: the same loss, metrics and gradients
for every loss type, with LoRA and gradient checkpointing; token-budget micro-batches; per-token completion masks
(multi-turn); the packing probe; the throughput metrics."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from actors.learner import layout
from actors.learner.learner import Learner
from actors.learner.sampling import mask_turns
from actors.types import TrainBatch
from tests.fixtures.learner import TIMED_METRICS, spec
from tests.fixtures.tolerance import TINY_MODEL, assert_close_at_scale

MAX_LEN = 9
# float32, the same micro-batches: packed and padded (and two cuts of a batch) are the same maths added in another
# order (the attention's sums, the matmuls' shapes, the micro-batches' gradient sums), so they differ by the tiny
# model's rounding, relative to each compared tensor's size (tests/fixtures/tolerance.py). The metrics are sums of
# terms of order one (advantages, ratios, log-probs of a few nats): TOL absolute too, for one that cancels to near 0.
TOL = TINY_MODEL
# Each loss type with options that exercise its normaliser and the terms the layouts feed: the KL reference, the
# vLLM IS correction in every mode, sequence-level IS (GSPO), num_iterations (frozen old logps), truncation masks.
CASES = {
    "grpo": dict(beta=0.1, is_mode="token_truncate"),
    "bnpo": dict(is_mode="sequence_mask"),
    "dr_grpo": dict(mask_truncated_completions=True, beta=0.1),
    "dapo": dict(is_mode="token_mask", num_iterations=2),
    "cispo": dict(epsilon_high=5.0, is_mode="sequence_truncate"),
    "sapo": dict(importance_sampling_level="sequence", beta=0.1),
    "luspo": dict(importance_sampling_level="sequence", is_mode="token_truncate"),
}


def make(path: str, **kw) -> Learner:
    """SGD at lr 0 and no clipping: the step leaves its gradient on the parameters."""
    return Learner(spec(path, **{"optim": "sgd", "learning_rate": 0.0, "max_grad_norm": None, "micro_batch_size": 3,
                                 "max_completion_length": MAX_LEN, **kw}))


def ragged_batch(n: int = 8, seed: int = 0, masked: bool = False) -> TrainBatch:
    """Prompts of 2-6 and completions of 1-MAX_LEN tokens, sampling logprobs near the tiny model's; `masked`: a
    multi-turn completion mask (a run of tool tokens inside some completions, NaN sampling logprobs there)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 500, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    comps = [torch.randint(3, 500, (int(torch.randint(1, MAX_LEN + 1, (1,), generator=g)),), generator=g).tolist()
             for _ in range(n)]
    logps = [(-6.2 + 0.3 * torch.randn(len(c), generator=g)).tolist() for c in comps]
    mask = None
    if masked:
        mask = [[0 if 1 <= j <= 2 and i % 2 == 0 else 1 for j in range(len(c))] for i, c in enumerate(comps)]
        logps = [[x if k else math.nan for x, k in zip(lp, m, strict=True)] for lp, m in zip(logps, mask, strict=True)]
    return TrainBatch(prompt_ids=prompts, completion_ids=comps, sampling_logprobs=logps,
                      advantages=torch.randn(n, generator=g).tolist(), truncated=[len(c) == MAX_LEN for c in comps],
                      completion_mask=mask)


def step(lr: Learner, b: TrainBatch) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    result = lr.train_step(b)
    grads = {n: p.grad.clone() for n, p in lr.model.named_parameters() if p.grad is not None}
    return {**result.metrics, "num_tokens": result.num_tokens}, grads


def assert_same_step(a, b, skip=()) -> None:
    (ma, ga), (mb, gb) = a, b
    assert ma.keys() == mb.keys()
    for k in ma.keys() - set(TIMED_METRICS) - {"learner/padding_frac", *skip}:
        assert mb[k] == pytest.approx(ma[k], rel=TOL, abs=TOL, nan_ok=True), k
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        assert_close_at_scale(gb[k], ga[k], TOL, msg=k)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("loss_type", list(CASES))
def test_packed_and_padded_give_the_same_loss_metrics_and_gradients(tiny_model_path, loss_type, masked):
    b = ragged_batch(masked=masked)
    runs = []
    for padding_free in (False, True):
        lr = make(tiny_model_path, loss_type=loss_type, padding_free=padding_free, **CASES[loss_type])
        assert lr.packed == padding_free
        runs.append(step(lr, b))
    assert_same_step(*runs)
    (padded, grads), (packed, _) = runs
    assert max(g.abs().max().item() for g in grads.values()) > 1e-3  # a real gradient, not all zeros
    assert packed["learner/padding_frac"] < padded["learner/padding_frac"]  # the ragged batch's pad is gone
    assert padded["learner/micro_batches"] == 3.0  # 8 rows in micro-batches of 3: the same cut both ways


@pytest.mark.parametrize("attn", ["eager"])  # flex_attention has no backward on CPU (its forward: test_layout.py)
def test_other_attention_implementations_pack_as_they_pad(tiny_model_path, attn):
    b = ragged_batch(masked=True)
    runs = [step(make(tiny_model_path, loss_type="grpo", beta=0.1, attn_implementation=attn,
                      padding_free=padding_free), b) for padding_free in (False, True)]
    assert_same_step(*runs)


@pytest.mark.parametrize("one_row", [False, True])
def test_lora_with_gradient_checkpointing_trains_packed_as_padded(tiny_model_path, one_row, monkeypatch):
    """LoRA (the reference: adapters disabled) with gradient checkpointing, packed into rows and into one row (the
    flash-attention layout, here on sdpa)."""
    lora = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
    b = ragged_batch(masked=True)
    runs = []
    for padding_free in (False, True):
        lr = make(tiny_model_path, loss_type="grpo", beta=0.1, lora=lora, gradient_checkpointing=True,
                  padding_free=padding_free)
        lr.one_row = one_row
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # lora_B starts at 0: a non-trivial adapter, so the KL term is not 0
            for n, p in lr.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        runs.append(step(lr, b))
    assert_same_step(*runs)
    assert runs[1][0]["kl"] > 0 and len(runs[1][1]) == 28  # lora_A and lora_B of 14 linear layers
    if one_row:
        assert runs[1][0]["learner/padding_frac"] == 0.0


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "bnpo"])
def test_the_update_does_not_depend_on_how_the_batch_is_cut(tiny_model_path, loss_type):
    """The step's gradient from micro-batches of 3, of 8 (one), and token-budget bins: the same for every loss type
    but bnpo, whose normaliser is each micro-batch's own token count (by definition)."""
    b = ragged_batch()
    cuts = [dict(micro_batch_size=3), dict(micro_batch_size=8), dict(max_tokens_per_microbatch=24)]
    runs = [step(make(tiny_model_path, loss_type=loss_type, **cut, **CASES[loss_type]), b) for cut in cuts]
    assert [r[0]["learner/micro_batches"] for r in runs][:2] == [3.0, 1.0] and runs[2][0]["learner/micro_batches"] > 3
    per_micro_batch = {"entropy", "kl", "learner/micro_batches"} | {k for k in runs[0][0]
                                                                    if "/" in k and "learner" not in k}
    if loss_type == "bnpo":  # its per-micro-batch normaliser moves the gradient by factors of order one, not rounding
        assert not torch.allclose(runs[0][1]["model.norm.weight"], runs[1][1]["model.norm.weight"], rtol=1e-3)
        return
    for other in runs[1:]:
        assert_same_step(runs[0], other, skip=per_micro_batch)


def test_a_sample_longer_than_the_budget_trains_alone_with_a_warning(tiny_model_path, caplog):
    b = ragged_batch()
    b.completion_ids[5] = list(range(10, 40))  # 30 tokens + its prompt: over the budget of 24
    b.sampling_logprobs[5] = [-6.0] * 30
    lr = make(tiny_model_path, loss_type="dapo", max_tokens_per_microbatch=24, learning_rate=0.1)
    plan = lr._plan(b)
    assert [5] in plan.micro_batches and plan.oversized == [5]
    assert all(sum(len(b.prompt_ids[i]) + len(b.completion_ids[i]) for i in mb) <= 24
               for mb in plan.micro_batches if mb != [5])
    with caplog.at_level(logging.WARNING, logger="rayward.learner"):
        result = lr.train_step(b)
    assert ("grpo.max_tokens_per_microbatch 24: 1 sample(s) of [" in caplog.text
            and "micro-batch of its own" in caplog.text)
    assert math.isfinite(result.metrics["loss"]) and result.metrics["learner/micro_batches"] == len(plan.micro_batches)


@pytest.mark.parametrize("padding_free", [False, True])
def test_a_masked_token_changes_neither_loss_nor_gradient(tiny_model_path, padding_free):
    """A tool token at a completion's end (so no later token sees it): another token id and another sampling logprob
    there leave the loss, its gradient, the entropy, the IS metrics and the loss-token count as they were; the
    same change on a token the model sampled moves them (the comparison can fail)."""
    kw = dict(loss_type="grpo", padding_free=padding_free, is_mode="token_truncate")
    base = ragged_batch()
    base.completion_ids[1] = base.completion_ids[1][:3] + [77]
    base.sampling_logprobs[1] = base.sampling_logprobs[1][:3] + [math.nan]
    base.completion_mask = [[1] * len(c) for c in base.completion_ids]
    base.completion_mask[1][3] = 0

    def changed(masked: bool) -> TrainBatch:
        b = TrainBatch(**{k: [list(x) if isinstance(x, list) else x for x in v] if isinstance(v, list) else v
                          for k, v in vars(base).items()})
        b.completion_ids[1][3] = 99
        b.sampling_logprobs[1][3] = -1.0 if masked else b.sampling_logprobs[1][3]
        if not masked:
            b.completion_mask[1][3] = 1
        return b

    ref = step(make(tiny_model_path, **kw), base)
    assert ref[0]["num_tokens"] == sum(len(c) for c in base.completion_ids) - 1
    assert_same_step(ref, step(make(tiny_model_path, **kw), changed(masked=True)))
    with pytest.raises(AssertionError):
        assert_same_step(ref, step(make(tiny_model_path, **kw), changed(masked=False)))


def test_a_completion_mask_must_match_the_completions():
    with pytest.raises(ValueError,
                       match=r"TrainBatch.completion_mask\[0\]: needs one 0 or 1 per completion token \(2\)"):
        TrainBatch([[1]], [[5, 6]], [[-1.0, -1.0]], [1.0], [False], completion_mask=[[1]])
    with pytest.raises(ValueError, match="TrainBatch.completion_mask: 2 rows for 1 completions"):
        TrainBatch([[1]], [[5, 6]], [[-1.0, -1.0]], [1.0], [False], completion_mask=[[1, 1], [1]])


def test_padding_frac_counts_the_pad_the_forwards_computed(tiny_model_path):
    b = ragged_batch()
    lr = make(tiny_model_path, loss_type="dapo", padding_free=False, micro_batch_size=8)
    metrics = lr.train_step(b).metrics
    real = sum(len(p) + len(c) for p, c in zip(b.prompt_ids, b.completion_ids, strict=True))
    positions = 8 * (max(map(len, b.prompt_ids)) + max(map(len, b.completion_ids)))
    assert metrics["learner/padding_frac"] == pytest.approx(1 - real / positions)  # integer counts, in float64
    assert metrics["learner/tokens_per_s"] > 0 and metrics["learner/micro_batches"] == 1.0


def _logits_without_use_cache(self, model, **extra):  # the bug the probe is for: use_cache left to the model's config
    with layout.head_only(model, self.keep):
        return model(input_ids=self.input_ids, position_ids=self.position_ids, logits_to_keep=0).logits[0], None


def _logits_with_a_mask(self, model, **extra):  # an all-ones attention mask also hides where samples start
    with layout.head_only(model, self.keep):
        return model(input_ids=self.input_ids, position_ids=self.position_ids, use_cache=False, logits_to_keep=0,
                     attention_mask=torch.ones_like(self.input_ids)).logits[0], None


@pytest.mark.parametrize("broken", [_logits_without_use_cache, _logits_with_a_mask])
def test_packed_rows_whose_samples_see_each_other_are_refused(tiny_model_path, monkeypatch, caplog, broken):
    monkeypatch.setattr(layout.Packed, "logits", broken)
    with caplog.at_level(logging.WARNING, logger="rayward.learner"):
        assert not make(tiny_model_path, loss_type="dapo").packed  # padding_free null: padded, with a warning
    assert "give log-probs" in caplog.text and "training on padded micro-batches" in caplog.text
    with pytest.raises(ValueError, match=r"grpo.padding_free: packed rows of Qwen2ForCausalLM give log-probs .* "
                                         r"nats away from the padded layout's"):
        make(tiny_model_path, loss_type="dapo", padding_free=True)
    monkeypatch.undo()
    assert make(tiny_model_path, loss_type="dapo").packed  # the real forward passes the probe


def test_mask_turns_numbers_the_runs_of_model_tokens():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1], [0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])
    assert mask_turns(mask).tolist() == [[0, 0, -1, -1, 1, -1, 2], [-1, 0, 0, 0, 0, 0, 0], [-1] * 7]


def test_the_logprob_gap_is_split_by_turn_for_multi_turn_batches(tiny_model_path):
    b = ragged_batch()
    b.completion_ids[0] = [5, 6, 7, 8, 9, 10]  # two model turns around two tool tokens
    b.sampling_logprobs[0] = [-6.0, -6.0, math.nan, math.nan, 30.0, 30.0]  # turn 1 far off any logprob
    b.completion_mask = [[1] * len(c) for c in b.completion_ids]
    b.completion_mask[0] = [1, 1, 0, 0, 1, 1]
    m = make(tiny_model_path, micro_batch_size=8).train_step(b).metrics
    assert m["sampling/sampling_logp_difference/max/turn_1"] > 30.0 > m["sampling/sampling_logp_difference/max/turn_0"]
    assert m["sampling/sampling_logp_difference/max"] == m["sampling/sampling_logp_difference/max/turn_1"]
    plain = make(tiny_model_path, micro_batch_size=8).train_step(ragged_batch()).metrics
    assert not any("/turn_" in k for k in plain)  # one-turn batches log what they always did
