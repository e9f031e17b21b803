"""LoRA on the Learner (PEFT) on the tiny model: targets, what trains, the reference, what the generators receive,
checkpoints in PEFT's format, the merged model, and the loss and gradients against TRL's GRPOTrainer with the same
peft_config."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load as safetensors_load

from actors.learner.learner import Learner
from actors.learner.lora import LoraError, apply_lora, hf_name
from actors.learner.model import meta_model
from actors.types import TrainBatch
from tests.fixtures.learner import batch, spec
from tests.fixtures.tolerance import TINY_MODEL, assert_close_at_scale, same_order

LORA = dict(r=4, lora_alpha=8, target_modules="all-linear")
LINEARS = 7 * 2  # q, k, v, o, gate, up, down in each of the tiny model's 2 layers


def make(path, lora=LORA, **kw):
    return Learner(spec(path, **{"loss_type": "dapo", "learning_rate": 1e-2, "micro_batch_size": 4, "lora": lora,
                                 **kw}))


def randomize_adapters(model, seed=1, scale=0.1):
    """lora_B starts at zero (the adapter starts as a no-op); random B makes the policy differ from the base."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def test_targets_that_match_nothing_or_cannot_merge_are_refused(tiny_model_path):
    model = meta_model(tiny_model_path)  # no weights: the same check runs before Ray starts
    with pytest.raises(LoraError,
                       match=r"target_modules \['nope'\]: match no layer of Qwen2ForCausalLM .*'q_proj'.*all-linear"):
        apply_lora(model, {"target_modules": ["nope"]})
    with pytest.raises(LoraError, match=r"adapt \['lm_head \(Linear\)'\], but .*other than the output head"):
        apply_lora(meta_model(tiny_model_path), {"target_modules": ["q_proj", "lm_head"]})
    with pytest.raises(LoraError, match=r"model.embed_tokens \(Embedding\)"):
        apply_lora(meta_model(tiny_model_path), {"target_modules": ["embed_tokens"]})
    with pytest.raises(LoraError, match="DoRA"):
        apply_lora(meta_model(tiny_model_path), {"target_modules": ["q_proj"], "use_dora": True})
    peft_model = apply_lora(meta_model(tiny_model_path), LORA)
    assert sum("lora_A" in n for n, _ in peft_model.named_parameters()) == LINEARS


def test_optimizer_holds_the_adapters_only_and_the_base_stays_frozen(tiny_model_path):
    lr = make(tiny_model_path)
    trainable = {n for n, p in lr.model.named_parameters() if p.requires_grad}
    assert len(trainable) == 2 * LINEARS and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = [p for g in lr.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in in_optimizer} == {id(p) for n, p in lr.model.named_parameters() if n in trainable}
    base = {k: v.clone() for k, v in lr.model.state_dict().items() if "lora_" not in k}
    stats = lr.train_step(batch([1.0, 1.0, -1.0, -1.0])).metrics
    assert stats["grad_norm"] > 0
    assert all(torch.equal(base[k], v) for k, v in lr.model.state_dict().items() if "lora_" not in k)
    assert "lora r=4" in repr(lr)


def test_update_moves_logprobs_along_advantages(tiny_model_path):
    lr = make(tiny_model_path, learning_rate=5e-2)
    b = batch([1.0, 1.0, -1.0, -1.0])
    with torch.no_grad():
        before, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    for _ in range(2):  # the first step moves lora_B only (A's gradient goes through B, which starts at 0)
        lr.train_step(b)
    with torch.no_grad():
        after, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    delta = (after - before).sum(-1)
    assert delta[:2].min() > 0 and delta[2:].max() < 0, delta


def test_reference_is_the_base_with_adapters_disabled_not_a_copy(tiny_model_path):
    lr = make(tiny_model_path, beta=0.1, loss_type="grpo")
    assert lr.ref_model is None  # no second copy of the model
    randomize_adapters(lr.model)
    b = batch([1.0, -1.0, 1.0, -1.0])
    ref = lr._ref_logps(lr.layout(b.prompt_ids, b.completion_ids))
    base = Learner(spec(tiny_model_path))
    with torch.no_grad():
        want, _ = base._forward_logps(base.model, base.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
        policy, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    assert_close_at_scale(ref, want, same_order(lr.device))  # disabled adapters run the base layers alone: equal
    assert (policy - ref).abs().max() > 1e-2  # the adapters do change the policy: the check is not vacuous
    assert lr.model.training and all(m.training for m in lr.model.modules())  # back in train mode
    stats = lr.train_step(b).metrics
    assert stats["kl"] > 0


def test_generators_receive_the_merged_weights_under_hf_names(tiny_model_path):
    """What the sender exports equals what TRL sends (PEFT's merge_adapter, names mapped TRL's way, lora_* and
    tied aliases dropped), and sending leaves every weight of the learner bit-exact (no merge in place)."""
    lr = make(tiny_model_path)
    randomize_adapters(lr.model)
    lr.train_step(batch([1.0, -1.0, 1.0, -1.0]))
    before = {k: v.clone() for k, v in lr.model.state_dict().items()}
    sent = safetensors_load(lr.export_weights())
    lr.weights.plan(0.05)
    plan = [m for b in lr.weights.buckets for m in b.tensors]
    assert [m.name for m in plan] == list(lr.weights.view)  # the plan walks the same view as every send
    assert all(k in sent and tuple(sent[k].shape) == m.shape for k, m in zip(lr.weights.view, plan, strict=True))
    assert all(torch.equal(before[k], v) for k, v in lr.model.state_dict().items())
    lr.model.merge_adapter()  # TRL's way, for reference only
    want = {hf_name(k): v for k, v in lr.model.state_dict().items() if "lora_" not in k and hf_name(k) not in lr.tied}
    assert sent.keys() == want.keys() and "lm_head.weight" not in sent
    for k in want:  # W + scaling * (B @ A), PEFT's own formula and order: equal
        assert_close_at_scale(sent[k], want[k], same_order(lr.device), msg=k)
    changed = {k for k, src in lr.weights.view.items() if not torch.equal(sent[k], before[src.key])}
    assert changed == {k for k, src in lr.weights.view.items() if src.lora_a} and len(changed) == LINEARS


def test_checkpoint_is_peft_format_and_resumes(tiny_model_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lr = make(tiny_model_path)
    randomize_adapters(lr.model)
    lr.train_step(batch([1.0, -1.0, 1.0, -1.0]))
    path = lr.save_checkpoint(str(tmp_path / "checkpoint-1"), extra={"note": "x"})
    files = {p.name for p in (tmp_path / "checkpoint-1").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "rayward_state.json"} <= files
    assert "model.safetensors" not in files  # the adapter only, not the frozen base

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_path), path).eval()
    ids = torch.tensor([[10, 11, 12, 40, 50, 60]])
    lr.model.eval()
    with torch.no_grad():
        # the same weights through the same code, on the same device: equal
        torch.testing.assert_close(peft_model(input_ids=ids).logits, lr.model(input_ids=ids).logits, rtol=0, atol=0)
    lr.model.train()

    other = make(tiny_model_path)
    assert other.load_checkpoint(path)["note"] == "x" and other.global_step == 1
    for (k, a), (_, b) in zip(lr.model.state_dict().items(), other.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert other.optimizer.state_dict()["state"]  # AdamW moments of the adapters restored
    b = batch([0.5, -1.0, 1.0, -0.5], seed=2)
    tol = same_order(other.device)  # equal weights, moments and batch through the same code
    assert other.train_step(b).metrics["loss"] == pytest.approx(lr.train_step(b).metrics["loss"], rel=tol, abs=tol)

    full = Learner(spec(tiny_model_path)).save_checkpoint(str(tmp_path / "full"))
    with pytest.raises(FileNotFoundError, match="not written by a LoRA learner"):
        make(tiny_model_path).load_checkpoint(full)
    with pytest.raises(ValueError, match="does not fit this learner's LoRA layers"):
        make(tiny_model_path, lora=dict(LORA, target_modules=["q_proj"])).load_checkpoint(path)


def test_merged_model_is_a_plain_hf_model(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lr = make(tiny_model_path)
    randomize_adapters(lr.model)
    out = lr.save_merged(str(tmp_path / "merged"))
    model = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).eos_token == AutoTokenizer.from_pretrained(tiny_model_path).eos_token
    b = batch([0.0, 0.0])
    with torch.no_grad():
        want, _ = lr._forward_logps(lr.model, lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
        got, _ = lr._forward_logps(model.train(), lr.layout(b.prompt_ids, b.completion_ids), with_entropy=False)
    # merged, x (W + s B A) against x W + s (x A) B: the same maths added in another order, the model's rounding
    assert_close_at_scale(got, want, TINY_MODEL)
    with pytest.raises(ValueError, match="needs a LoRA learner"):
        Learner(spec(tiny_model_path)).save_merged(str(tmp_path / "x"))


# --------------------------------------------------------------------------------------------- TRL cross-check
N, G, T = 8, 4, 7  # completions, group size, longest completion
# TRL's forward (left-padded rows, its own log-softmax at the temperature) against the learner's (packed, the head on
# completion positions only): the same maths added in another order, the tiny model's rounding relative to each
# compared tensor's size; TOL absolute too for the loss, a sum of terms of order one that may cancel.
TOL = TINY_MODEL


@pytest.mark.slow  # builds TRL's GRPOTrainer
@pytest.mark.parametrize("loss_type,beta", [("dapo", 0.04), ("grpo", 0.0), ("dr_grpo", 0.1)])
def test_loss_and_gradients_match_trl_grpo_trainer_with_the_same_peft_config(tiny_model_path, tmp_path, loss_type,
                                                                            beta):
    """TRL's own GRPOTrainer, built with `peft_config=LoraConfig(...)` (its get_peft_model, reference by disabled
    adapters, fused LM head at the temperature), gradient checkpointing on as its Trainer.train() enables it.
    Its `_generate_and_score_completions` runs on fixed completions and rewards (the generation and reward calls
    stubbed, as tests/fixtures/trl_grpo.py does) and gives the padded batch, the advantages and the
    reference logprobs; `_compute_loss` + backward give the loss and the adapters' gradients. The Learner trains on
    the same completions and advantages in one micro-batch (SGD at lr 0: the gradients stay on the parameters)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    temperature = 0.9
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=N, num_generations=G, max_completion_length=T,
        beta=beta, loss_type=loss_type, temperature=temperature, use_cpu=True, bf16=False, report_to=[],
    )
    trainer = GRPOTrainer(
        model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
        train_dataset=Dataset.from_list([{"prompt": "p"}] * N), peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA),
    )
    lr = make(
        tiny_model_path, loss_type=loss_type, beta=beta, max_completion_length=T, temperature=temperature,
        optim="sgd", learning_rate=0.0, max_grad_norm=None, micro_batch_size=N,
    )
    randomize_adapters(lr.model)
    ours = dict(lr.model.named_parameters())
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_" in n:
                p.copy_(ours[n])
    assert sum(p.requires_grad for p in trainer.model.parameters()) == 2 * LINEARS

    g = torch.Generator().manual_seed(0)
    prompts = [[10 + i % 3, 11, 12][: 2 + i % 2] for i in range(N)]  # ragged: TRL left-pads, as the learner does
    comps = [torch.randint(3, 500, (int(torch.randint(2, T + 1, (1,), generator=g)),), generator=g).tolist()
             for _ in range(N)]
    rewards = torch.randn(N, 1, generator=g)
    trainer.model.train()  # what Trainer.train() does before the first step
    trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
    trainer.current_gradient_accumulation_steps = 1
    trainer._generate = lambda _: (prompts, comps, None, ["c"] * N, None, {}, None, None)
    trainer._calculate_rewards = lambda *a: rewards.clone()
    inputs = trainer._generate_and_score_completions([{"prompt": f"p{i // G}"} for i in range(N)])
    assert (inputs.get("ref_per_token_logps") is not None) == (beta != 0)
    loss_trl = trainer._compute_loss(trainer.model, inputs)
    loss_trl.backward()
    grads_trl = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}

    stats = lr.train_step(TrainBatch(
        prompt_ids=prompts, completion_ids=comps, sampling_logprobs=[[math.nan] * len(c) for c in comps],
        advantages=inputs["advantages"].tolist(), truncated=[False] * N,
    )).metrics
    grads = {n: p.grad for n, p in lr.model.named_parameters() if p.grad is not None}
    assert stats["loss"] == pytest.approx(loss_trl.item(), rel=TOL, abs=TOL)
    if beta:
        assert stats["kl"] == pytest.approx(trainer._metrics["train"]["kl"][-1], rel=TOL, abs=TOL) and stats["kl"] > 0
    assert grads.keys() == grads_trl.keys() and len(grads) == 2 * LINEARS
    for n in grads:
        assert_close_at_scale(grads[n], grads_trl[n], TOL, msg=n)
    assert max(v.abs().max().item() for v in grads.values()) > 1e-2  # gradients are not all tiny
