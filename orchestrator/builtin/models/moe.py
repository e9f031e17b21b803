"""Tiny random mixture-of-experts checkpoints (Qwen3-MoE and Qwen2-MoE), built locally like the tiny dense model.

They share the tiny dense model's tokenizer, chat template, attention shape and init
(orchestrator/builtin/models/tiny.py), so a config that trains `tiny` trains `tiny-moe` by changing the model name. Each
decoder layer's MLP is a sparse MoE block: NUM_EXPERTS experts, TOP_K chosen per token by a softmax router (Qwen2-MoE
adds its shared expert and that expert's sigmoid gate). The active parameters per token are about the dense model's.

`near_ties` builds routers whose experts come in groups of three with the same router row up to a relative
NEAR_TIE_NOISE: whenever a group leads, which two of its three experts a token goes to is decided by rounding,
so the learner's and the engine's kernels, which add in different orders, choose differently for some tokens.
The experts themselves stay independent, so a flipped choice changes the token's output. That is the model on
which routing replay has something to fix (tests/integration/generation/test_router_replay.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.builtin.models.tiny import (
    HIDDEN_SIZE,
    IM_END,
    MAX_POSITIONS,
    NUM_HEADS,
    NUM_KV_HEADS,
    NUM_LAYERS,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TIE_WORD_EMBEDDINGS,
    VOCAB_SIZE,
    WIDE_INIT_STD,
    _build_tokenizer,
    ensure_cached,
)
from orchestrator.builtin.models.warmup import portable_normal_

# Bump when anything below changes the files written, so stale caches are not reused.
CACHE_VERSION = "v2"  # v2: the portable init (warmup.portable_normal_)
FAMILIES = ("qwen3_moe", "qwen2_moe")

NUM_EXPERTS = 8
TOP_K = 2
# TOP_K experts of this width: the dense model's MLP width (256) per token.
MOE_INTERMEDIATE_SIZE = 128
# Qwen2-MoE's always-on shared expert.
SHARED_EXPERT_INTERMEDIATE_SIZE = 128
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS  # 64: vLLM's CPU attention kernels take 64, not 16
# near_ties: experts grouped in threes (the last group two) sharing a router row, perturbed by this much per
# weight: router logits then differ by about a float32 rounding of a HIDDEN_SIZE-long dot product.
TIE_GROUP = 3
NEAR_TIE_NOISE = 1e-7
# The near-tie model's draw: whether the parity sequence (actors/weights/parity.py) meets a near tie that the two
# kernels break differently depends on the draw; with this one it does, by nats (seed 0's never did:
# tests/integration/actors/generation/test_moe_engine.py holds it to that).
NEAR_TIES_SEED = 1


def moe_config(family: str = "qwen3_moe") -> Any:
    """The tiny MoE's transformers config (float32; eos = <|im_end|>, pad = <|endoftext|>)."""
    from transformers import Qwen2MoeConfig, Qwen3MoeConfig

    pad_id, eos_id = SPECIAL_TOKENS.index(PAD_TOKEN), SPECIAL_TOKENS.index(IM_END)
    common: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS, num_hidden_layers=NUM_LAYERS, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=TIE_WORD_EMBEDDINGS, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
        num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_INTERMEDIATE_SIZE,
        decoder_sparse_step=1, norm_topk_prob=True, dtype="float32",
    )
    if family == "qwen3_moe":
        return Qwen3MoeConfig(head_dim=HEAD_DIM, intermediate_size=MOE_INTERMEDIATE_SIZE * TOP_K, **common)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(
            intermediate_size=MOE_INTERMEDIATE_SIZE * TOP_K,
            shared_expert_intermediate_size=SHARED_EXPERT_INTERMEDIATE_SIZE, **common,
        )
    raise ValueError(f"tiny MoE family {family!r}: one of {', '.join(FAMILIES)}")


def build_tiny_moe(path: str | Path, family: str = "qwen3_moe", seed: int = 0, near_ties: bool = False) -> Path:
    """Write a random tiny MoE (float32) plus the tiny tokenizer to `path`; returns the path."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out)
    config = moe_config(family)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    portable_normal_(model, seed, WIDE_INIT_STD)  # the tiny model's wide init, the same bits on every CPU
    if near_ties:
        import numpy as np

        noise = np.random.Generator(np.random.PCG64(seed + 1))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight"):  # [experts, hidden]
                    for first in range(0, p.shape[0], TIE_GROUP):
                        group = p[first : first + TIE_GROUP]
                        jitter = torch.from_numpy(noise.standard_normal(tuple(group.shape), dtype=np.float32))
                        group.copy_(group[:1].expand_as(group) + NEAR_TIE_NOISE * jitter)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
    model.save_pretrained(out)
    return out


def ensure_tiny_moe(family: str = "qwen3_moe", near_ties: bool = False, cache_dir: str | Path | None = None) -> Path:
    """Build a tiny MoE once into rayward's cache (as orchestrator/builtin/models/tiny.py: ensure_tiny_model)."""
    name = f"tiny-{family.replace('_', '-')}{'-ties' if near_ties else ''}-{CACHE_VERSION}"
    seed = NEAR_TIES_SEED if near_ties else 0
    return ensure_cached(name, lambda d: build_tiny_moe(d, family, seed=seed, near_ties=near_ties), cache_dir)
