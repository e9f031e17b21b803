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
    import shutil

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
    tiny = ensure_tiny_model()
    for f in tiny.iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, out / f.name)
    return out
