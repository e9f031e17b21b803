"""Random Qwen2-shaped models of a given size for the benchmarks (no downloads): float32, tied embeddings, the
tiny model's tokenizer."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "rayward" / "bench-models"

# (hidden, layers, intermediate, heads, kv heads, vocab): Qwen2-shaped, tied embeddings, about the named size.
SHAPES = {
    "25m": (512, 6, 1536, 8, 2, 16384),
    "100m": (768, 12, 2048, 12, 4, 32000),
    "400m": (1024, 28, 3584, 16, 4, 32000),
}


def build_model(size: str, cache: Path = DEFAULT_CACHE) -> Path:
    """A random Qwen2-shaped model with the tiny model's tokenizer (vocab ids above its 512 are never sampled
    from the tokenizer, but the weights are the size asked for)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from orchestrator.builtin.models.tiny import ensure_tiny_model

    out = cache / f"qwen2-random-{size}"
    if (out / "config.json").exists():
        return out
    h, layers, inter, heads, kv, vocab = SHAPES[size]
    cfg = Qwen2Config(hidden_size=h, num_hidden_layers=layers, intermediate_size=inter, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=True,
                      max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    copy_tokenizer(ensure_tiny_model(), out)
    return out


# Mixtures of experts (issue 33), Qwen3-MoE-shaped: (hidden, layers, experts, top-k, expert intermediate, heads,
# kv heads, vocab). "moe100m": ~114M parameters in all, ~26M active per token (2 of 16 experts).
MOE_SHAPES = {
    "moe100m": (512, 8, 16, 2, 512, 8, 2, 16384),
}


def build_moe_model(size: str, cache: Path = DEFAULT_CACHE) -> Path:
    """A random Qwen3-MoE of MOE_SHAPES[size] with the tiny model's tokenizer (what build_model is for dense)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from orchestrator.builtin.models.tiny import ensure_tiny_model

    out = cache / f"qwen3-moe-random-{size}"
    if (out / "config.json").exists():
        return out
    h, layers, experts, top_k, inter, heads, kv, vocab = MOE_SHAPES[size]
    cfg = Qwen3MoeConfig(hidden_size=h, num_hidden_layers=layers, num_experts=experts, num_experts_per_tok=top_k,
                         moe_intermediate_size=inter, intermediate_size=inter * top_k, num_attention_heads=heads,
                         num_key_value_heads=kv, head_dim=h // heads, vocab_size=vocab, tie_word_embeddings=True,
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         decoder_sparse_step=1, norm_topk_prob=True)
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(cfg).save_pretrained(out)
    copy_tokenizer(ensure_tiny_model(), out)
    return out


def build_active_twin(size: str, cache: Path = DEFAULT_CACHE) -> Path:
    """The dense Qwen3 of the MoE's active size: the same attention, embeddings and layers, one MLP as wide as the
    top-k experts together."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from orchestrator.builtin.models.tiny import ensure_tiny_model

    out = cache / f"qwen3-dense-active-{size}"
    if (out / "config.json").exists():
        return out
    h, layers, _, top_k, inter, heads, kv, vocab = MOE_SHAPES[size]
    cfg = Qwen3Config(hidden_size=h, num_hidden_layers=layers, intermediate_size=inter * top_k,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=h // heads, vocab_size=vocab,
                      tie_word_embeddings=True, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    copy_tokenizer(ensure_tiny_model(), out)
    return out


def copy_tokenizer(src: Path, out: Path) -> None:
    """The tokenizer files (and chat template) of the model at `src`, into the model directory `out`."""
    import shutil

    for f in src.iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, out / f.name)


# The variable-length model (build_varlen_model): the token embeddings' scale against the random layers' output
# (per-dimension std ~0.3 each, ~1.5 summed over 24 sublayers of the 100m shape), large enough that the final
# hidden state points along the current token's embedding; and the share of a trigger token's embedding that lies
# along the EOS direction (1.0: as long as the random part), which gives EOS a logit of ~19 after a trigger token
# against ~N(0, 1) after any other (the other logits ~N(0, 0.55): near-uniform sampling over the vocabulary).
VARLEN_EMBED_STD = 5.0
VARLEN_TRIGGER_SHARE = 1.0
# Trigger tokens are drawn from ids at or above this: above the tiny tokenizer's 512, so a prompt never holds one.
VARLEN_FIRST_TRIGGER = 1024


def build_varlen_model(size: str, mean_length: int, cache: Path = DEFAULT_CACHE) -> Path:
    """A random Qwen2-shaped model whose sampled completions have variable lengths: EOS follows one of
    `vocab / mean_length` trigger tokens (ids above the tokenizer's, never in a prompt), so at temperature 1 a
    completion ends after a geometric number of tokens with mean ~`mean_length` (most short, a few at
    max_completion_length), from vLLM and from transformers' `generate` alike. The weights are a random model's
    of the size asked for (same FLOPs per token), with untied, scaled-up embeddings (VARLEN_EMBED_STD)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = cache / f"qwen2-varlen-{size}-m{mean_length}"
    if (out / "config.json").exists():
        return out
    src = build_model(size, cache)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    g = torch.Generator().manual_seed(1)
    embed = torch.randn(vocab, hidden, generator=g) * VARLEN_EMBED_STD
    direction = torch.randn(hidden, generator=g)
    direction /= direction.norm()
    first = VARLEN_FIRST_TRIGGER
    triggers = first + torch.randperm(vocab - first, generator=g)[: max(1, vocab // mean_length)]
    embed[triggers] += direction * VARLEN_EMBED_STD * hidden**0.5 * VARLEN_TRIGGER_SHARE
    head = model.get_output_embeddings().weight.detach().clone()  # the random model's, std 0.02
    head[model.config.eos_token_id] = direction
    model.model.embed_tokens.weight = torch.nn.Parameter(embed)
    model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(out)
    copy_tokenizer(src, out)
    return out
