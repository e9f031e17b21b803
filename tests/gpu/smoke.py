"""The GPU smoke kit: every learner path that needs CUDA and neither Ray nor vLLM, on a bare machine with one GPU
(torch, transformers, accelerate; peft and flash-attn where present), in a few minutes. Run it with
`bash scripts/gpu_smoke.sh` (docs/learner.md, "GPU smoke kit"); `--device cpu` runs the same code on the CPU (the
dry run the unit tier makes: tests/unit/actors/learner/test_gpu_smoke.py).

Each check is a function of the device that raises on a failure and returns a one-line detail, or raises `Skip`;
`main` runs them in order, prints each row as it ends (a hang leaves the rows before it on screen) and the whole
table at the end, and exits 1 when a check failed. Imports: torch, transformers, accelerate (peft for the LoRA row,
flash_attn for the flash row, torchvision and Pillow for the vision row) and rayward's learner modules, which import
nothing else on these paths.

Tolerances (tests/fixtures/tolerance.py): float32 as in the unit tier (the longest sum's rounding, relative to the
compared tensor's size). bfloat16 keeps 8 significant bits, and a deep stack of its roundings has no useful
closed-form bound, so a bfloat16 result is compared with float32 on the same (bfloat16-exact) weights: packed may be
at most twice as far from it as padded is (`within_bf16_rounding`).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from tests.fixtures.tolerance import TINY_MODEL, assert_close_at_scale, rounding, same_order

MAX_LEN = 9  # longest completion of `ragged_batch` (the dr_grpo normaliser)
# Each loss type with options that exercise its normaliser and the terms the layouts feed (the unit tier's
# test_learner_packing.py cases): the KL reference, the vLLM IS correction, sequence-level IS, num_iterations.
CASES: dict[str, dict[str, Any]] = {
    "grpo": dict(beta=0.1, is_mode="token_truncate"),
    "bnpo": dict(is_mode="sequence_mask"),
    "dr_grpo": dict(mask_truncated_completions=True, beta=0.1),
    "dapo": dict(is_mode="token_mask", num_iterations=2),
    "cispo": dict(epsilon_high=5.0, is_mode="sequence_truncate"),
    "sapo": dict(importance_sampling_level="sequence", beta=0.1),
    "luspo": dict(importance_sampling_level="sequence", is_mode="token_truncate"),
}
BF16_CASES = ("grpo", "dapo")  # the KL reference and IS terms, and num_iterations (frozen old log-probs)
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
BUCKET_MB = 0.05  # small buckets: the tiny model's tensors spread over several, some packed, some direct
GROUP_TIMEOUT_S = 120.0  # the one-rank weight group's ops (a first NCCL op builds its communicator)
BF16_EPS = torch.finfo(torch.bfloat16).eps
# The vision row's images, (width, height): two sizes, so its padded micro-batch holds two image grids (4 and 6
# vision tokens: the tiny VLM's merged patch is 28 pixels).
VLM_SIZES = ((56, 56), (84, 56))
# Qwen2.5-VL's chat template's rendering of a user turn of one image and a text, with the generation prompt: the
# tiny VLM's template is read from trl (orchestrator/builtin/models/vlm.py: chat_template), which a bare GPU host lacks,
# so the vision row writes its prompts itself, one placeholder per image (`Images.expand` expands it).
VLM_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
              "<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n")


class Skip(Exception):
    """A check that cannot run here (a package or a device missing): the row says why."""


@dataclass
class Row:
    check: str
    result: str  # "ok", "FAIL" or "skip"
    seconds: float
    detail: str


# --------------------------------------------------------------------------------------------- helpers
def tiny_model() -> str:
    from orchestrator.builtin.models.tiny import ensure_tiny_model

    return str(ensure_tiny_model())


def tiny_moe() -> str:
    from orchestrator.builtin.models.moe import ensure_tiny_moe

    return str(ensure_tiny_moe("qwen3_moe"))


def tiny_vlm() -> str:
    """The tiny Qwen2.5-VL (orchestrator/builtin/models/vlm.py) in the cache dir (the kit's scratch dir), not warmed up
    (the rows need no skill, and the warm-up takes a while on a CPU) and without a chat template (trl has it;
    VLM_PROMPT): under a name of its own, so it never stands in for the full tiny VLM in a cache that other tests
    share."""
    from unittest import mock

    from orchestrator.builtin.models import vlm as vlm
    from orchestrator.builtin.models.tiny import ensure_cached

    with mock.patch.object(vlm, "chat_template", lambda: None):
        return str(ensure_cached(f"{vlm.CACHE_NAME}-smoke", lambda d: vlm.build_tiny_vlm(d, warm=False)))


def make(device: str, model: str | None = None, **kw: Any) -> Any:
    """A learner of the tiny model (or `model`) on `device`: SGD at lr 0 and no clipping, so a step leaves its
    gradient on the parameters and the weights as they were."""
    from actors.learner.learner import Learner
    from tests.fixtures.learner import spec

    return Learner(spec(model or tiny_model(), **{"optim": "sgd", "learning_rate": 0.0, "max_grad_norm": None,
                                         "micro_batch_size": 3, "max_completion_length": MAX_LEN,
                                         "device": device, **kw}))


def ragged_batch(n: int = 8, seed: int = 0) -> Any:
    """Prompts of 2-6 and completions of 1-MAX_LEN tokens, sampling log-probs near the tiny model's, and a
    multi-turn completion mask (tool tokens inside every other completion)."""
    from actors.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 500, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    comps = [torch.randint(3, 500, (int(torch.randint(1, MAX_LEN + 1, (1,), generator=g)),), generator=g).tolist()
             for _ in range(n)]
    mask = [[0 if 1 <= j <= 2 and i % 2 == 0 else 1 for j in range(len(c))] for i, c in enumerate(comps)]
    logps = [[x if k else math.nan for x, k in zip((-6.2 + 0.3 * torch.randn(len(c), generator=g)).tolist(), m,
                                                   strict=True)] for c, m in zip(comps, mask, strict=True)]
    return TrainBatch(prompt_ids=prompts, completion_ids=comps, sampling_logprobs=logps,
                      advantages=torch.randn(n, generator=g).tolist(), truncated=[len(c) == MAX_LEN for c in comps],
                      completion_mask=mask)


def step(lr: Any, batch: Any) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One train_step: its metrics and every gradient (float32, on the CPU)."""
    metrics = lr.train_step(batch).metrics
    grads = {n: p.grad.detach().float().cpu() for n, p in lr.model.named_parameters() if p.grad is not None}
    if not grads or not all(torch.isfinite(g).all() for g in grads.values()):
        raise AssertionError(f"gradients missing or not finite ({len(grads)} tensors)")
    return metrics, grads


def fp32_tolerance(device: str) -> float:
    """float32's model rounding; TF32 matmuls (10 bits) where the process asked for them."""
    if torch.device(device).type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return TINY_MODEL / torch.finfo(torch.float32).eps * 2.0**-10
    return TINY_MODEL


def assert_same_step(a: tuple[dict, dict], b: tuple[dict, dict], tol: float, metrics: tuple[str, ...]) -> float:
    """Two steps' metrics and gradients within `tol` of their scale; returns the worst gap (relative to scale)."""
    (ma, ga), (mb, gb) = a, b
    for k in metrics:
        if k in ma or k in mb:
            assert close(mb[k], ma[k], tol), f"{k}: {mb[k]!r} against {ma[k]!r}"
    assert ga.keys() == gb.keys(), sorted(ga.keys() ^ gb.keys())
    worst = 0.0
    for k in ga:
        assert_close_at_scale(gb[k], ga[k], tol, msg=k)
        scale = ga[k].abs().max().item()
        worst = max(worst, (gb[k] - ga[k]).abs().max().item() / scale if scale else 0.0)
    return worst


def close(got: float, want: float, rel: float) -> bool:
    """got within rel of want, relatively and absolutely (NaN equals NaN): the metrics are sums of terms of order
    one (advantages, ratios, log-probs of a few nats), so one that cancels to near 0 keeps their rounding."""
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return abs(got - want) <= rel * max(abs(want), 1.0)


def within_bf16_rounding(triples: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]],
                         layouts: tuple[str, str] = ("padded", "packed")) -> tuple[float, float]:
    """Each (name, padded, packed, float32) triple: the bfloat16 packed value as far from float32 on the same weights
    as the padded layout's values are, twice over, norm-wise, relative to the float32 value's size. The padded
    layout's largest relative gap over every compared value (the loss, the entropy, each gradient tensor) is
    bfloat16's rounding on this device; two layouts of the same maths round differently but as much, and a layout
    that computes something else (samples that see each other, a wrong position) is nats away. Returns (the
    padded gap, the packed one), both relative. layouts: the two layouts' names, for the message."""
    def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
        size = ref.norm().item()
        return (x - ref).norm().item() / size if size else (x - ref).norm().item()

    rounding_here = max(rel(pad, ref) for _, pad, _, ref in triples)
    allowed = 2.0 * rounding_here + BF16_EPS  # + one rounding of the whole, for a device where padding is exact
    worst = 0.0
    for name, _, pack, ref in triples:
        gap = rel(pack, ref)
        if not gap <= allowed:
            raise AssertionError(f"{name}: {layouts[1]} bfloat16 is {gap:.3g} from float32 (relative), "
                                 f"{layouts[0]} at most {rounding_here:.3g}")
        worst = max(worst, gap)
    return rounding_here, worst


def _float32_twin(device: str, of: Any, **kw: Any) -> Any:
    """A float32 padded learner with `of`'s (bfloat16) weights, exactly: the bfloat16 learners' reference."""
    ref = make(device, model=of.spec.model.name_or_path, dtype="float32", padding_free=False, **kw)
    ref.model.load_state_dict({k: v.float() for k, v in of.model.state_dict().items()})
    if of.ref_model is not None:
        ref.ref_model.load_state_dict({k: v.float() for k, v in of.ref_model.state_dict().items()})
    return ref


def _compare_layouts_bf16(device: str, attn: str | None, cases: tuple[str, ...]) -> str:
    """bfloat16 learners, padded and packed, against their float32 twin on one ragged batch per case."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Skip("this GPU has no bfloat16")
    b, triples = ragged_batch(), []
    kw_attn = {} if attn is None else {"attn_implementation": attn}
    for lt in cases:
        kw = dict(loss_type=lt, **CASES[lt])
        pad = make(device, dtype="bfloat16", padding_free=False, **kw_attn, **kw)
        pack = make(device, dtype="bfloat16", **kw_attn, **kw)  # padding_free None: packed where the probe agrees
        if not pack.packed:
            raise AssertionError(f"{lt}: the learner's packing probe refused bfloat16 packed rows")
        ref = _float32_twin(device, pad, **kw)
        (m_pad, g_pad), (m_pack, g_pack), (m_ref, g_ref) = (step(x, b) for x in (pad, pack, ref))
        triples += [(f"{lt} {k}", *(torch.tensor(m[k]) for m in (m_pad, m_pack, m_ref))) for k in ("loss", "entropy")]
        triples += [(f"{lt} gradient {k}", g_pad[k], g_pack[k], g_ref[k]) for k in g_ref]
    padded, packed = within_bf16_rounding(triples)
    one_row = " in one row" if pack.one_row else ""
    return (f"{', '.join(cases)}: gap to fp32 on the same weights, packed{one_row} {packed:.2g}, padded "
            f"{padded:.2g} (relative; at most 2x padded's + bf16 eps)")


# --------------------------------------------------------------------------------------------- the checks
def check_loss(device: str) -> str:
    """The loss (every loss_type, token and sequence IS level, KL, vLLM IS weights) on `device` against the CPU:
    loss, gradient and metrics; float32, within the rounding of its longest sum (the micro-batch's B x T tokens)."""
    from actors.learner.loss import ImportanceSampling, LossConfig, LossInputs, loss_fn
    from actors.learner.loss import vllm_importance_weights as is_weights

    g = torch.Generator().manual_seed(0)
    b, t = 6, 7
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    mask[2] = 0.0  # a truncated row
    logp = -torch.rand(b, t, generator=g) * 3
    old = logp + 0.25 * torch.randn(b, t, generator=g)
    ref = logp + 0.2 * torch.randn(b, t, generator=g)
    sampling = old + 0.2 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    tol = rounding(b * t)
    n = 0
    for loss_type, level, beta, is_mode in itertools.product(
        ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"], ["token", "sequence"], [0.0, 0.04],
        [None, "token_truncate", "sequence_mask"],
    ):
        cfg = LossConfig(loss_type=loss_type, importance_sampling_level=level, beta=beta, max_completion_length=t,
                         epsilon_high=0.28)
        outs = []
        for dev in ("cpu", device):
            def on(x: torch.Tensor, dev: str = dev) -> torch.Tensor:
                return x.to(dev)

            is_w = None if is_mode is None else is_weights(on(old), on(sampling), on(mask), ImportanceSampling(is_mode))
            lp = on(logp).detach().clone().requires_grad_()  # a leaf on every device (.to("cpu") is a no-op)
            out = loss_fn(cfg)(LossInputs(lp, on(old), on(adv), on(mask), ref_logp=on(ref), is_weights=is_w,
                                          num_items_in_batch=on(mask).sum() * 2, grad_accum_steps=2))
            out.loss.backward()
            outs.append((out, lp.grad.cpu()))
        (cpu, g_cpu), (dev_out, g_dev) = outs
        where = f"{loss_type}/{level}/beta {beta}/IS {is_mode}"
        assert close(dev_out.loss.item(), cpu.loss.item(), tol), (
            f"{where}: loss {dev_out.loss.item()!r}, cpu {cpu.loss.item()!r}")
        assert_close_at_scale(g_dev, g_cpu, tol, msg=f"{where}: gradient")
        assert cpu.metrics.keys() == dev_out.metrics.keys(), where
        for k, v in cpu.metrics.items():
            assert close(dev_out.metrics[k].item(), v.item(), tol), f"{where}: {k}"
        n += 1
    return f"{n} configurations (7 loss types x IS level x KL x vLLM IS), fp32, within {tol:.1g} of scale"


def check_packing_fp32(device: str) -> str:
    """A train step packed against padded, every loss type, float32: the same loss, metrics and gradients within
    the model's rounding (as tests/unit/actors/learner/test_learner_packing.py on the CPU)."""
    tol, worst, b = fp32_tolerance(device), 0.0, ragged_batch()
    for lt, kw in CASES.items():
        runs = []
        for padding_free in (False, True):
            lr = make(device, loss_type=lt, padding_free=padding_free, **kw)
            assert lr.packed == padding_free, f"{lt}: packed {lr.packed}, asked {padding_free}"
            assert lr.device.type == torch.device(device).type, lr.device
            runs.append(step(lr, b))
        worst = max(worst, assert_same_step(*runs, tol, ("loss", "entropy", "kl", "clip_ratio/region_mean")))
    return f"7 loss types: worst gradient gap {worst:.2g} of scale (tolerance {tol:.2g})"


def check_packing_bf16(device: str) -> str:
    """bfloat16 (sdpa): the learner's packing probe accepts packed rows, and a train step packed is within
    bfloat16's rounding of padded (loss, entropy, every gradient)."""
    return _compare_layouts_bf16(device, None, BF16_CASES)


def check_flash_attention(device: str) -> str:
    """flash_attention_2 (varlen: a micro-batch packed into one row), bfloat16, against its padded layout."""
    if torch.device(device).type != "cuda":
        raise Skip("flash attention needs CUDA")
    if importlib.util.find_spec("flash_attn") is None:
        raise Skip("flash_attn is not installed (transformers' flash_attention_2 needs it)")
    return _compare_layouts_bf16(device, "flash_attention_2", ("grpo",))


def check_gradient_checkpointing(device: str) -> str:
    """A step with and without gradient checkpointing (the reference model too, beta 0.1): the same loss, KL and
    gradients (the recomputed forward is the same kernels on the same data)."""
    b, runs = ragged_batch(), []
    tol = same_order(device)
    for on in (False, True):
        lr = make(device, loss_type="grpo", beta=0.1, gradient_checkpointing=on)
        assert lr.model.is_gradient_checkpointing == on
        runs.append(step(lr, b))
    worst = assert_same_step(*runs, tol, ("loss", "kl", "entropy"))
    return f"loss, kl and {len(runs[0][1])} gradients: worst gap {worst:.2g} of scale (tolerance {tol:.2g})"


def check_lora(device: str) -> str:
    """LoRA (PEFT) on `device`: the adapters alone train, packed = padded (float32, gradient checkpointing on,
    KL to the base by disabled adapters), the merged weights the sender exports equal PEFT's merge, and a
    bfloat16 step moves log-probs along the advantages."""
    if importlib.util.find_spec("peft") is None:
        raise Skip("peft is not installed (scripts/gpu_smoke.sh --wheels DIR puts a peft wheel on the path)")
    from actors.learner.lora import hf_name
    from tests.fixtures.learner import assert_step_follows_advantages, batch

    b, runs = ragged_batch(), []
    for padding_free in (False, True):
        lr = make(device, loss_type="grpo", beta=0.1, lora=LORA, padding_free=padding_free)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # lora_B starts at 0: a non-trivial adapter, so the KL term is not 0
            for n, p in lr.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g).to(p.device) * 0.1)
        runs.append(step(lr, b))
    worst = assert_same_step(*runs, fp32_tolerance(device), ("loss", "kl"))
    assert runs[1][0]["kl"] > 0 and all("lora_" in k for k in runs[1][1]), sorted(runs[1][1])[:3]
    sent = lr.weights.full_state()  # the merged view, merged on the device, then moved to the CPU
    lr.model.merge_adapter()
    want = {hf_name(k): v.cpu() for k, v in lr.model.state_dict().items()
            if "lora_" not in k and hf_name(k) not in lr.tied}
    assert sent.keys() == want.keys(), sorted(sent.keys() ^ want.keys())[:3]
    for k in want:
        assert_close_at_scale(sent[k], want[k], same_order(device), msg=k)
    bf16 = make(device, loss_type="dapo", lora=LORA, dtype="bfloat16", optim="adamw_torch", learning_rate=1e-2,
                micro_batch_size=4)
    assert_step_follows_advantages(bf16, batch([1.0, -1.0, 1.0, -1.0]))  # the first step moves lora_B alone
    return (f"{len(runs[1][1])} adapter gradients packed = padded (worst {worst:.2g} of scale), merged export = "
            f"PEFT's merge, a bf16 step follows the advantages")


def check_fsdp(device: str) -> str:
    """One FSDP2 rank (its own process group: NCCL on CUDA, gloo on the CPU): a float32 step updates as the
    single-device learner does, and bfloat16 mixed precision keeps float32 masters, learns and exports bfloat16."""
    import torch.distributed as dist

    from actors.learner.checkpoint import full_state_dict
    from tests.fixtures.learner import SCENARIOS, assert_step_follows_advantages, make_batch, scenario_spec

    path = tiny_model()
    try:
        n, kw = SCENARIOS["grpo"]  # a sharded reference model too (beta 0.1), num_iterations 2
        from actors.learner.learner import Learner

        single = Learner(scenario_spec(path, **kw, device=device))
        before = {k: v.detach().float().cpu().clone() for k, v in single.model.state_dict().items()}
        m1 = single.train_step(make_batch(n)).metrics
        fsdp = Learner(scenario_spec(path, **kw, device=device), strategy="fsdp")
        assert fsdp.device.type == torch.device(device).type and fsdp.sharded
        m2 = fsdp.train_step(make_batch(n)).metrics
        got = full_state_dict(fsdp.train_state())
        want = {k: v for k, v in single.model.state_dict().items() if k not in single.tied}
        assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())[:3]
        moved = 0.0
        for k, v in want.items():  # the update is lr x the gradient: compared at the update's own scale
            update = v.detach().float().cpu() - before[k]
            assert_close_at_scale(got[k].float().cpu() - before[k], update, fp32_tolerance(device), msg=k)
            moved = max(moved, update.abs().max().item())
        assert moved > 0, "the step did not move the weights"
        for k in ("loss", "grad_norm", "entropy", "kl"):
            assert close(m2[k], m1[k], fp32_tolerance(device)), f"{k}: {m2[k]} against {m1[k]}"
        mixed = Learner(scenario_spec(path, loss_type="dapo", micro_batch_size=4, optim="adamw_torch",
                                      learning_rate=1e-2, device=device, dtype="bfloat16"), strategy="fsdp")
        assert all(p.dtype == torch.float32 for p in mixed.model.parameters()), "FSDP masters are not float32"
        b = make_batch(8)
        b.advantages = [1.0, -1.0] * 4
        assert_step_follows_advantages(mixed, b)
        from safetensors.torch import load as safetensors_load

        exported = {t.dtype for t in safetensors_load(mixed.export_weights()).values()}
        assert exported == {torch.bfloat16}, exported
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return "fp32 update = single device's (at the update's scale); bf16 mixed precision: fp32 masters, learns"


def check_weight_buckets(device: str) -> str:
    """The weight sender's buckets on the device: the learner's tensors (float32 and bfloat16), and mixed dtypes
    (int64 too), packed into wire buffers and viewed back, bit for bit."""
    from actors.weights.collective import DIRECT, bucket_tensors, plan_buckets, wire_tensors
    from tests.fixtures.collective import tensors

    n_buckets = n_direct = 0
    for dtype in ("float32", "bfloat16"):
        lr = make(device, loss_type="dapo", dtype=dtype)
        sender, state = lr.weights, lr.model.state_dict()
        sender.plan(BUCKET_MB)
        for bucket in sender.buckets:
            full = [sender._full(state, sender.view[m.name]) for m in bucket.tensors]
            bufs = wire_tensors(bucket, full, sender.device)
            assert all(x.device.type == torch.device(device).type for x in bufs)
            out = bucket_tensors(bucket, bufs)
            for (name, got), want, meta in zip(out, full, bucket.tensors, strict=True):
                assert name == meta.name and got.dtype == want.dtype and torch.equal(got, want), name
            n_buckets += 1
            n_direct += sum(m.offset == DIRECT for m in bucket.tensors)
    mixed = {k: v.to(device) for k, v in tensors().items()}
    plan = plan_buckets([(k, v.dtype, tuple(v.shape)) for k, v in mixed.items()], 300, 100)
    for bucket in plan:
        out = dict(bucket_tensors(bucket, wire_tensors(bucket, [mixed[m.name] for m in bucket.tensors],
                                                       torch.device(device))))
        assert all(torch.equal(out[m.name], mixed[m.name]) for m in bucket.tensors)
    return f"{n_buckets} buckets of the model ({n_direct} tensors direct), fp32 and bf16; mixed dtypes: exact"


def check_weight_group(device: str) -> str:
    """The weight-transfer group with one member (rank 0, the sender; NCCL on CUDA, gloo on the CPU): it forms,
    broadcasts a buffer intact, and the learner's sender sends every bucket, directly and overlapped."""
    from actors.weights.collective import WeightGroup

    lr = make(device, loss_type="dapo", dtype="bfloat16")
    sender = lr.weights
    wire = sender.plan(BUCKET_MB)
    sender.open(1, GROUP_TIMEOUT_S)
    sender.join(0)
    try:
        group = sender.group
        assert isinstance(group, WeightGroup) and group.world_size == 1
        buf = torch.arange(1000, dtype=torch.float32, device=sender.device)
        group.wait(group.broadcast([buf]), "a test buffer")
        assert torch.equal(buf.cpu(), torch.arange(1000, dtype=torch.float32))
        stats = sender.send()
        expect = sum(b.wire_bytes for b in sender.buckets)
        assert stats["bytes"] == expect, (stats, expect)
        sender.start(1)  # overlapped: a thread sends while this one waits for its result
        overlapped = sender.result(1, timeout_s=GROUP_TIMEOUT_S)
        assert overlapped["bytes"] == expect, overlapped
    finally:
        sender.settle()
        if sender.group is not None:
            sender.group.close()
    backend = "NCCL" if torch.device(device).type == "cuda" else "gloo"
    return f"{backend}, 1 rank: {len(wire)} buckets, {expect / 2**20:.2f} MiB sent twice (direct, overlapped)"


def _own_routes(lr: Any, b: Any) -> list[Any]:
    """Each sample's routes as `lr` routes it alone: [prompt + completion, layers, top_k] int16."""
    out = []
    for p, c in zip(b.prompt_ids, b.completion_ids, strict=True):
        with torch.no_grad(), lr.replay.recording() as rec:
            lr.model(input_ids=torch.tensor([p + c], device=lr.device))
        out.append(lr.replay.stack(rec).numpy())
    return out


def check_moe_bf16(device: str) -> str:
    """A mixture of experts (the tiny Qwen3-MoE) in bfloat16 with rollout routing replay (R3) and the
    load-balancing loss: packed and padded steps within bfloat16's rounding of float32 on the same weights, all
    three replaying the same routes (bfloat16 alone could route a near tie elsewhere: what replay is for)."""
    import dataclasses

    if torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Skip("this GPU has no bfloat16")
    kw = dict(loss_type="grpo", beta=0.1, is_mode="token_truncate", router_replay="R3", router_aux_loss_coef=0.01)
    pad = make(device, model=tiny_moe(), dtype="bfloat16", padding_free=False, **kw)
    pack = make(device, model=tiny_moe(), dtype="bfloat16", **kw)
    ref = _float32_twin(device, pad, **kw)
    b = ragged_batch()
    b = dataclasses.replace(b, routes=_own_routes(ref, b))
    (m_pad, g_pad), (m_pack, g_pack), (m_ref, g_ref) = (step(x, b) for x in (pad, pack, ref))
    for m in (m_pad, m_pack, m_ref):
        assert m["routing/agreement"] > 0.5 and m["aux_loss"] > 0, m
    triples = [(k, *(torch.tensor(m[k]) for m in (m_pad, m_pack, m_ref))) for k in ("loss", "entropy", "aux_loss")]
    triples += [(f"gradient {k}", g_pad[k], g_pack[k], g_ref[k]) for k in g_ref]
    padded, packed = within_bf16_rounding(triples)
    return (f"R3 + aux loss, {len(g_ref)} gradients: gap to fp32 packed {packed:.2g}, padded {padded:.2g}; "
            f"bf16 routing agreement with fp32 {m_pad['routing/agreement']:.3f}")


def check_routing_replay(device: str) -> str:
    """Routing replay on `device` (float32): replaying the learner's own routes changes no log-prob, other routes
    change them by nats and still train the router, the learner's recorded choice under replay is the replayed one;
    the sender cuts the fused experts into the checkpoint's per-expert tensors on the device."""
    import numpy as np
    from transformers.core_model_loading import revert_weight_conversion

    from actors.learner.routing import agreement, layout_routes

    lr = make(device, model=tiny_moe(), loss_type="grpo", router_replay="R3")
    b = ragged_batch()
    rows = lr.layout(b.prompt_ids, b.completion_ids)
    lengths = [len(p) + len(c) for p, c in zip(b.prompt_ids, b.completion_ids, strict=True)]
    own = _own_routes(lr, b)
    other = [((r.astype(np.int64) + 3) % 8).astype(np.int16) for r in own]
    n, k = lr.replay.num_layers, lr.replay.top_k
    with torch.no_grad():
        plain, _ = lr._forward_logps(lr.model, rows, with_entropy=False)
        with lr.replay.replaying(layout_routes(rows.source, own, lengths, n, k)):
            same, _ = lr._forward_logps(lr.model, rows, with_entropy=False)
    assert_close_at_scale(same.cpu(), plain.cpu(), fp32_tolerance(device) * 10)
    moved = layout_routes(rows.source, other, lengths, n, k)
    with lr.replay.replaying(moved), lr.replay.recording() as rec:
        logp, _ = lr._forward_logps(lr.model, rows, with_entropy=False)
        logp.sum().backward()
    shift = (logp.detach() - plain).abs().max().item()
    assert shift > 0.1, shift
    assert agreement(lr.replay.stack(rec), moved, torch.ones(len(moved), dtype=torch.bool))[0] == 1.0
    router = next(iter(lr.replay.routers.values()))
    assert router.weight.grad is not None and router.weight.grad.abs().sum().item() > 0
    state = {kk: v for kk, v in lr.model.state_dict().items() if kk not in lr.tied}
    want = revert_weight_conversion(lr.model, state)
    sent = lr.weights.full_state()
    assert sent.keys() == want.keys() and all(torch.equal(sent[kk], want[kk].cpu()) for kk in want)
    return (f"own routes: log-probs unchanged; other routes: moved by {shift:.2g} nats, router gradient; "
            f"{len(sent)} tensors sent in the checkpoint layout")


def check_vlm_bf16(device: str) -> str:
    """The vision-language learner (the tiny Qwen2.5-VL: its vision tower, expanded image placeholders, multimodal
    rotary positions) in bfloat16: a train step on one padded micro-batch of images of two sizes (two image grids),
    half the samples with a second image inside the completion (a tool's, out of the loss), is finite and trains the
    vision tower, and each sample's log-probs in that padded layout are its own forward's
    (`sequence_logprobs`) within bfloat16's rounding (`within_bf16_rounding`: float32 on the same weights)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Skip("this GPU has no bfloat16")
    for module, why in (("PIL", "Pillow is not installed (the images, and transformers' image processor)"),
                        ("torchvision", "torchvision is not installed (transformers' Qwen2.5-VL processor loads its "
                                        "video processor, which needs it)")):
        try:
            importlib.import_module(module)
        except ImportError:
            raise Skip(why) from None
    from actors.learner.model import eval_mode as _eval
    from actors.types import TrainBatch
    from orchestrator.builtin.tasks.colors import PROMPT, colors_dataset

    n, kw = 8, dict(loss_type="grpo", beta=0.1, micro_batch_size=8)  # one micro-batch: both image sizes in it
    lr = make(device, model=tiny_vlm(), dtype="bfloat16", optim="adamw_torch", learning_rate=1e-2, **kw)
    assert lr.vision is not None, "the learner loaded no image processor for a vision-language model"
    text = lr.vision.processor.tokenizer.encode(VLM_PROMPT.format(PROMPT), add_special_tokens=False)
    g = torch.Generator().manual_seed(0)
    images = [(row["image"].resize(VLM_SIZES[i % 2]),) for i, row in enumerate(colors_dataset(n))]
    prompts = [lr.vision.expand(text, im) for im in images]
    comps = [torch.randint(3, 500, (int(torch.randint(1, MAX_LEN + 1, (1,), generator=g)),), generator=g).tolist()
             for _ in range(n)]
    # Every other sample is a tool round (TRL's multimodal tool responses): the model's turn, then a tool's image
    # inside the completion (its placeholders expanded, out of the loss: mask 0), then the model's next turn.
    masks = [[1] * len(c) for c in comps]
    for i in range(1, n, 2):
        tool_image = images[i - 1][0]
        placeholders = lr.vision.expand([lr.vision.image_token_id], [tool_image])
        turn, next_turn = comps[i], comps[i][:2]
        comps[i] = turn + placeholders + next_turn
        masks[i] = [1] * len(turn) + [0] * len(placeholders) + [1] * len(next_turn)
        images[i] = (*images[i], tool_image)
    b = TrainBatch(prompt_ids=prompts, completion_ids=comps, sampling_logprobs=[[math.nan] * len(c) for c in comps],
                   advantages=torch.randn(n, generator=g).tolist(), truncated=[False] * n, images=images,
                   completion_mask=masks)
    vision = {k: p.detach().clone() for k, p in lr.model.named_parameters() if ".visual." in f".{k}"}
    m = lr.train_step(b).metrics
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0, m
    params = dict(lr.model.named_parameters())
    still = [k for k, was in vision.items() if params[k].grad is None or not torch.isfinite(params[k].grad).all()
             or torch.equal(params[k].detach(), was)]
    assert vision and not still, f"{len(still)} of {len(vision)} vision tower tensors did not train: {still[:3]}"
    # Each sample's log-probs in the step's padded layout (left-padded prompts of 4 and 6 vision tokens, every
    # image's patches in one pixel_values) against its forward alone, both bfloat16. The tolerance is packing's:
    # bfloat16's rounding has no useful bound, so each is measured against float32 on the same weights, and the
    # padded one may be twice as far as the worst sample alone, plus one bfloat16 eps (about 0.02 to 0.05 relative
    # here). Another image of the same size moves a sample's log-probs on this cold model by 1% to 33% (most over 9%).
    twin = _float32_twin(device, lr, **kw)
    rows = lr.layout(prompts, comps, list(images))
    with torch.no_grad(), _eval(lr.model):
        padded, _ = lr._forward_logps(lr.model, rows, False, sampled=False)
    triples = []
    for i, (p, c, im) in enumerate(zip(prompts, comps, images, strict=True)):
        alone, ref = (torch.tensor(x.sequence_logprobs(p + c, None, im)[-len(c):]) for x in (lr, twin))
        triples.append((f"sample {i} ({im[0].width}x{im[0].height})", alone, padded[i, : len(c)].float().cpu(), ref))
    one, batched = within_bf16_rounding(triples, ("one sample alone", "in the padded batch"))
    nats = max((pad - alone).abs().max().item() for _, alone, pad, _ in triples)
    tokens = sorted({p.count(lr.vision.image_token_id) for p in prompts})
    return (f"loss {m['loss']:.3g}, grad norm {m['grad_norm']:.3g}, {len(vision)} vision tensors trained; "
            f"{n} samples ({' and '.join(map(str, tokens))} vision tokens, {n // 2} with a tool's image in the "
            f"completion) padded vs alone: at most {nats:.2g} nats "
            f"apart; gap to fp32 {batched:.2g}, alone {one:.2g} (relative; at most 2x alone's + bf16 eps)")


def check_distillation(device: str) -> str:
    """On-policy distillation on `device` against the CPU, float32: the teacher's forward (the log-probs of a
    student's completion tokens, what a teacher engine serves: here transformers, no vLLM on the kit's machine), and
    a train step with those log-probs in both forms (advantage, loss), packed, with tool tokens and a sample the
    teacher missed: loss, distill metrics and every gradient within the model's rounding."""
    from transformers import AutoModelForCausalLM

    tol, b = fp32_tolerance(device), ragged_batch()
    teacher = []
    for dev in ("cpu", device):
        model = AutoModelForCausalLM.from_pretrained(tiny_model(), dtype=torch.float32).to(dev).eval()
        rows = []
        with torch.no_grad():
            for p, c in zip(b.prompt_ids, b.completion_ids, strict=True):
                lp = model(input_ids=torch.tensor([p + c], device=dev)).logits[0, :-1].float().log_softmax(-1)
                rows.append(lp[torch.arange(len(p) - 1, len(p) + len(c) - 1), torch.tensor(c, device=dev)].cpu())
        teacher.append(rows)
    gap = max((a - c).abs().max().item() for a, c in zip(*teacher, strict=True))
    assert gap <= tol * 10, f"teacher log-probs {device} vs cpu: {gap:.2g}"
    # the student is the tiny model shifted: a teacher it disagrees with (the same weights would give zero)
    logprobs = [(t - 0.5).tolist() for t in teacher[0]]
    logprobs[3] = []  # the teacher missed this sample
    batch = replace(b, teacher_logprobs=logprobs)
    worst = 0.0
    for mode in ("advantage", "loss"):
        runs = [step(make(dev, distill_coef=0.5, distill_mode=mode), batch) for dev in ("cpu", device)]
        worst = max(worst, assert_same_step(*runs, tol, ("loss", "distill/reverse_kl")))
        assert abs(runs[1][0]["distill/reverse_kl"] - 0.5) < 0.05, runs[1][0]["distill/reverse_kl"]
    return f"teacher forward within {gap:.1g}; 2 forms, worst gradient gap {worst:.2g} of scale (tolerance {tol:.2g})"


CHECKS: list[tuple[str, Callable[[str], str]]] = [
    ("loss", check_loss),
    ("packing fp32", check_packing_fp32),
    ("packing bf16", check_packing_bf16),
    ("packing flash-attn", check_flash_attention),
    ("gradient checkpointing", check_gradient_checkpointing),
    ("lora", check_lora),
    ("fsdp2 1 rank", check_fsdp),
    ("weight buckets", check_weight_buckets),
    ("weight group 1 rank", check_weight_group),
    ("moe bf16 + replay", check_moe_bf16),
    ("moe routing replay", check_routing_replay),
    ("vlm bf16 step", check_vlm_bf16),
    ("distillation", check_distillation),
]


# --------------------------------------------------------------------------------------------- the runner
def run_check(name: str, fn: Callable[[str], str], device: str) -> Row:
    t0 = time.perf_counter()
    try:
        detail, result = fn(device), "ok"
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()  # an asynchronous CUDA error surfaces here, as this check's
    except Skip as why:
        detail, result = str(why), "skip"
    except Exception as err:  # noqa: BLE001 - every failure is a row, the next check still runs
        detail, result = _failure(err), "FAIL"
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return Row(name, result, time.perf_counter() - t0, detail)


def _failure(err: BaseException) -> str:
    """The error's type and first line, and where in rayward (or in this kit) it was raised."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "/actors/" in f.filename or "/tests/" in f.filename]
    where = f" at {frames[-1].filename.rsplit('/', 2)[-2]}/{frames[-1].filename.rsplit('/', 1)[-1]}:" \
        f"{frames[-1].lineno}" if frames else ""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}{where}: {text[0] if text else ''}"[:300]


def environment(device: str) -> str:
    """One line: the device and the versions the kit ran with (missing optional packages named)."""
    parts = [f"torch {torch.__version__}"]
    for pkg in ("transformers", "accelerate", "peft", "flash_attn"):
        try:
            from importlib.metadata import version

            parts.append(f"{pkg} {version(pkg.replace('_', '-'))}")
        except Exception:  # noqa: BLE001 - PackageNotFoundError
            parts.append(f"{pkg} missing")
    if torch.device(device).type == "cuda":
        parts.insert(0, f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, "
                        f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}, "
                        f"fp32 matmul {torch.get_float32_matmul_precision()})")
    else:
        parts.insert(0, "CPU (dry run)")
    return ", ".join(parts)


def table(rows: list[Row]) -> str:
    widths = [max(len(x) for x in col) for col in zip(("check", "result", "time"),
                                                        *[(r.check, r.result, f"{r.seconds:.1f}s") for r in rows],
                                                        strict=True)]
    lines = [f"{'check':<{widths[0]}}  {'result':<{widths[1]}}  {'time':>{widths[2]}}  detail"]
    lines += [f"{r.check:<{widths[0]}}  {r.result:<{widths[1]}}  {f'{r.seconds:.1f}s':>{widths[2]}}  {r.detail}"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a dry run of the same checks on the CPU (gloo for NCCL)")
    parser.add_argument("--only", default="", help="run the checks whose name contains this")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="checks that would start after this many seconds are skipped")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_smoke: skipped, no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda})")
        return 0
    print(f"gpu_smoke: {environment(args.device)}", flush=True)
    t0, rows = time.perf_counter(), []
    for name, fn in CHECKS:
        if args.only not in name:
            continue
        if time.perf_counter() - t0 > args.budget_s:
            row = Row(name, "skip", 0.0, f"out of time (--budget-s {args.budget_s:g})")
        else:
            row = run_check(name, fn, args.device)
        rows.append(row)
        print(f"gpu_smoke: {row.check}: {row.result} ({row.seconds:.1f}s) {row.detail}", flush=True)
    failed = [r.check for r in rows if r.result == "FAIL"]
    print("\n" + table(rows))
    print(f"\ngpu_smoke: {len(rows) - len(failed)} of {len(rows)} checks passed or skipped in "
          f"{time.perf_counter() - t0:.0f}s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
