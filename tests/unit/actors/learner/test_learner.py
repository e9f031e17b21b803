"""The Learner as a plain class on the tiny model: logprobs, the update, num_iterations, weights, checkpoints."""

import math

import pytest
import torch
from safetensors.torch import load as safetensors_load

from actors.learner.learner import Learner
from actors.types import TrainResult
from tests.fixtures.learner import batch, spec
from tests.fixtures.tolerance import TINY_MODEL, assert_close_at_scale, same_order


def make(path, **kw):
    return Learner(spec(path, **{"loss_type": "dapo", "learning_rate": 1e-2, "micro_batch_size": 4, **kw}))


def test_logprobs_match_trl_conventions(tiny_model_path):
    from trl.trainer.utils import selective_log_softmax

    lr = make(tiny_model_path, temperature=0.7)
    b = batch([0.0] * 3)
    logp, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    ids = torch.tensor([p + c for p, c in zip(b.prompt_ids, b.completion_ids, strict=True)])
    logits = lr.model(input_ids=ids).logits[:, 2:-1]  # positions predicting the completion tokens
    want = selective_log_softmax(logits, torch.tensor(b.completion_ids), 0.7)
    # the same maths, the learner's head on the completion positions only: the model's rounding at the log-probs' size
    assert_close_at_scale(logp, want, TINY_MODEL)


def test_update_moves_logprobs_along_advantages(tiny_model_path):
    lr = make(tiny_model_path)
    b = batch([1.0, 1.0, -1.0, -1.0])
    with torch.no_grad():
        before, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    result = lr.train_step(b)
    with torch.no_grad():
        after, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    delta = (after - before).sum(-1)
    assert delta[:2].min() > 0 and delta[2:].max() < 0, delta
    assert isinstance(result, TrainResult) and result.global_step == 1
    stats = result.metrics
    assert stats["grad_norm"] > 0 and "clip_ratio/region_mean" in stats
    assert not {"global_step", "num_tokens", "time/train_compute"} & stats.keys()  # TrainResult's own fields
    assert result.num_tokens == 4 * 6 and result.compute_s > 0  # every token of the 4 completions counts


def test_num_iterations_runs_one_optimizer_step_each_with_frozen_old_logps(tiny_model_path):
    lr = make(tiny_model_path, num_iterations=3, learning_rate=5e-2)
    result = lr.train_step(batch([1.0, -1.0, 1.0, -1.0, 0.5, -0.5, 1.0, -1.0]))
    assert lr.global_step == 3 and result.global_step == 3
    # later iterations are off-policy against the frozen old logps, so the ratio leaves [1-eps, 1+eps]
    assert result.metrics["clip_ratio/region_mean"] > 0


def test_importance_weights_and_logp_gap_are_reported(tiny_model_path):
    lr = make(tiny_model_path, is_mode="token_truncate")
    b = batch([1.0, -1.0, 1.0, -1.0])
    with torch.no_grad():
        logp, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    b.sampling_logprobs = (logp - 0.25).tolist()  # the sampler was 0.25 nats less confident on every token
    stats = lr.train_step(b).metrics
    # the step's first forward recomputes these log-probs (with grad, checkpointed): the model's rounding at their
    # size, in nats, which exp turns into the same relative error of the ratio
    tol = TINY_MODEL * logp.abs().max().item()
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx(0.25, abs=tol)
    assert stats["sampling/importance_sampling_ratio/mean"] == pytest.approx(torch.exp(torch.tensor(0.25)).item(),
                                                                             rel=tol)


def test_export_weights_and_checkpoint_roundtrip(tiny_model_path, tmp_path):
    lr = make(tiny_model_path)
    lr.train_step(batch([1.0, -1.0, 1.0, -1.0]))
    state = safetensors_load(lr.export_weights())
    assert "lm_head.weight" not in state or not lr.model.config.tie_word_embeddings  # tied: sent once
    assert torch.equal(state["model.norm.weight"], lr.model.state_dict()["model.norm.weight"].cpu())  # a copy
    path = lr.save_checkpoint(str(tmp_path / "checkpoint-1"), extra={"note": "x"})
    other = make(tiny_model_path)
    assert other.load_checkpoint(path)["note"] == "x" and other.global_step == 1
    for (k, a), (_, b) in zip(lr.model.state_dict().items(), other.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k  # saved and loaded: copies
    assert other.optimizer.state_dict()["state"]  # AdamW moments restored
    from transformers import AutoTokenizer  # a model directory on its own: vLLM and `rayward eval` load it

    assert AutoTokenizer.from_pretrained(path).encode("Write the letter a:") == AutoTokenizer.from_pretrained(
        tiny_model_path).encode("Write the letter a:")


def test_beta_loads_a_frozen_reference_and_reports_kl(tiny_model_path):
    """The reference stays the initial policy while the policy moves: the first iteration's KL is exactly 0 (policy
    == reference), the second's is positive, so the step's mean KL is positive; with the policy as its own
    reference (or beta ignored) it would be 0 (or absent)."""
    lr = make(tiny_model_path, beta=0.1, loss_type="grpo", num_iterations=2)
    initial = {k: v.clone() for k, v in lr.model.state_dict().items()}
    stats = lr.train_step(batch([1.0, -1.0, 1.0, -1.0])).metrics
    assert lr.ref_model is not None and stats["kl"] > 0
    assert all(not p.requires_grad for p in lr.ref_model.parameters())
    ref = lr.ref_model.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in initial.items())  # frozen at the initial weights ...
    assert any(not torch.equal(lr.model.state_dict()[k], v) for k, v in initial.items())  # ... the policy moved


@pytest.mark.parametrize("lora", [None, {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}])
def test_gradient_checkpointing_keeps_loss_and_gradients(tiny_model_path, lora):
    """The same step with and without gradient checkpointing: the same loss, KL and gradients (SGD at lr 0 keeps
    the gradients on the parameters). With beta the reference forward runs too (a copy, or disabled adapters)."""
    seen = []
    for on in (False, True):
        lr = make(tiny_model_path, gradient_checkpointing=on, lora=lora, beta=0.1, optim="sgd", learning_rate=0.0,
                  max_grad_norm=None, loss_type="grpo")
        assert lr.model.is_gradient_checkpointing == on
        if lora:  # lora_B starts at 0: give the adapters a non-trivial gradient and the KL a non-zero value
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for n, p in lr.model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        stats = lr.train_step(batch([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5])).metrics
        seen.append((stats, {n: p.grad.clone() for n, p in lr.model.named_parameters() if p.grad is not None}))
    (off, g_off), (on, g_on) = seen
    tol = same_order(lr.device)  # the recomputed forward is the same kernels on the same data: equal on a CPU
    assert (on["loss"] == pytest.approx(off["loss"], rel=tol, abs=tol)
            and on["kl"] == pytest.approx(off["kl"], rel=tol, abs=tol))
    assert g_on.keys() == g_off.keys() and len(g_on) == (28 if lora else 26)
    for k in g_off:
        assert_close_at_scale(g_on[k], g_off[k], tol, msg=k)


def test_gradient_checkpointing_on_a_model_without_it_is_refused(no_checkpointing_model_path):
    with pytest.raises(ValueError, match="JetMoeForCausalLM does not support gradient checkpointing"):
        make(no_checkpointing_model_path, gradient_checkpointing=True)
    stats = make(no_checkpointing_model_path, gradient_checkpointing=False).train_step(batch([1.0, -1.0])).metrics
    assert math.isfinite(stats["loss"])  # it trains, without checkpointing


def test_cpu_threads_follow_model_size_and_the_cores_allowed():
    from actors.learner.model import PARAMS_PER_THREAD, threads_for

    assert threads_for(200_000, 8) == 1  # the tiny model: one thread
    assert threads_for(5 * PARAMS_PER_THREAD, 2) == 2  # a 100M model on a 2-core box: both cores
    assert threads_for(5 * PARAMS_PER_THREAD, 16) == 5


def test_the_recorded_rows_come_back_with_their_first_pass_logprobs(tiny_model_path):
    """TrainBatch.record: the token record's rows (rayward view) get the learner's log-probs of their completion
    tokens from the step's first pass, before the update; the other rows none."""
    from dataclasses import replace

    lr = make(tiny_model_path, temperature=0.7)
    b = replace(batch([1.0, -1.0, 1.0, -1.0]), record=(0, 3))
    with torch.no_grad():
        want, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    got = lr.train_step(b).token_records
    assert sorted(got) == [0, 3]
    for i in (0, 3):
        learner = got[i]["learner_logprobs"]
        assert got[i]["ids"] == list(b.completion_ids[i]) and got[i]["logprobs"] == list(b.sampling_logprobs[i])
        assert len(learner) == len(b.completion_ids[i]) and got[i]["mask"] is None
        assert_close_at_scale(torch.tensor(learner), want[i, : len(learner)], TINY_MODEL)
    assert lr.train_step(batch([1.0, -1.0])).token_records == {}  # nothing asked, nothing sent
