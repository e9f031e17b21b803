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

    from orchestrator.tiny import ensure_tiny_model

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
