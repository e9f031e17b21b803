"""A tiny random Qwen2-style checkpoint, built locally (no downloads), for tests and CPU smoke runs.

The model is random (it produces noise), but it has the same architecture, file layout, tokenizer
files and chat template as a real Qwen2 checkpoint, so transformers, vLLM and the weight-sync path
all exercise their real code.
"""

from __future__ import annotations

import os
import random
import shutil
import string
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.builtin.models.warmup import Gate, Passed, gated, portable_normal_, record, sft

# Bump when anything below changes the files written, so stale caches are not reused.
CACHE_NAME = "tiny-model-v2"  # v2: the portable init (warmup.portable_normal_)

# vLLM's CPU attention kernels reject head_dim 16 but accept 64: hidden / heads must be 64.
HIDDEN_SIZE = 128
NUM_HEADS = 2
NUM_KV_HEADS = 1  # GQA (2 query heads share 1 kv head) like real Qwen2, exercising the k/v split.
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 256
# Small vocab keeps the embedding tiny and lets tests ask vLLM for full-vocab logprobs cheaply.
VOCAB_SIZE = 512
MAX_POSITIONS = 1024
# Tied like Qwen2.5-0.5B/1.5B, so the tied lm_head path of vLLM's in-place reload is exercised.
TIE_WORD_EMBEDDINGS = True
# The random tiny model's init: HF's default (std 0.02) gives near-uniform next-token distributions; a wider one
# makes logprobs (and any weight-sync bug) visible in tests.
WIDE_INIT_STD = 0.2

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of an assistant turn: the eos the generator stops on
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]  # ids 0, 1, 2

# ChatML, as in Qwen2, without the default system prompt (keeps toy prompts short).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = (
    "the a an of to and in is it you that he was for on are with as his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how said "
    "each she which do their time if will way about many then them write would like so these her "
    "long make thing see him two has look more day could go come did number sound no most people "
    "my over know water than call first who may down side been now find any new work part take get "
    "place made live where after back little only round man year came show every good me give our "
    "letter answer sum count reverse repeat add times equals question user assistant system"
).split()


def _corpus() -> list[str]:
    """Deterministic training text: English-ish words, letters, digits and toy-task prompts."""
    lines = [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 12)]
    for ch in string.ascii_lowercase + string.ascii_uppercase:
        lines.append(f"Write the letter {ch}: {ch}")
        lines.append(f"Repeat {ch} three times: {ch}{ch}{ch}")
    for a in range(0, 100, 7):
        for b in range(0, 100, 13):
            lines.append(f"What is {a} + {b}? Answer: {a + b}")
    lines.append(string.digits + " " + string.punctuation)
    for role in ("system", "user", "assistant"):
        lines.append(f"{IM_START}{role}\nhello there{IM_END}\n")
    return lines


def _build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Byte level like Qwen2: any string is encodable, so tests never hit unknown tokens. GPT-2's split, not
    # Qwen2's: `AutoTokenizer` (Qwen2Tokenizer, as vLLM and the learner load it) rebuilds Qwen's split and NFC,
    # so it tokenizes some text (digits) unlike this tokenizer.json does. Kept: every rayward process loads it
    # through AutoTokenizer, and the letter task's learning tests (demo, LoRA, eval) are tuned on this vocab.
    # The tool model (orchestrator/builtin/models/tools.py), whose text is re-tokenized across turns,
    # uses Qwen2's rules.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(out)


def qwen2_config(num_layers: int = NUM_LAYERS) -> Any:
    """The tiny model's transformers Qwen2Config (float32; eos = <|im_end|>, pad = <|endoftext|>); num_layers: a
    deeper model of the same width (the tiny judge)."""
    from transformers import Qwen2Config

    pad_id, eos_id = SPECIAL_TOKENS.index(PAD_TOKEN), SPECIAL_TOKENS.index(IM_END)
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        num_hidden_layers=num_layers,
        intermediate_size=INTERMEDIATE_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=TIE_WORD_EMBEDDINGS,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def fresh_qwen2(config: Any, seed: int, std: float | None = None) -> Any:
    """A new Qwen2ForCausalLM of `config` (float32) whose weight matrices are N(0, std) from `seed`, the same on
    every CPU (warmup.portable_normal_); std default: the config's initializer_range, as transformers inits."""
    import torch
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM(config).to(torch.float32)
    portable_normal_(model, seed, config.initializer_range if std is None else std)
    return model


def save_model(model: Any, out: Path) -> None:
    """The model's weights and a generation config that stops on the end of turn and pads with <|endoftext|>."""
    from transformers import GenerationConfig

    c = model.config
    model.generation_config = GenerationConfig(eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    model.save_pretrained(out)


def build_tiny_model(path: str | Path, seed: int = 0) -> Path:
    """Write a random tiny Qwen2ForCausalLM (float32) plus tokenizer to `path`; returns the path. The same bits on
    every CPU (a test builds it under another CPU capability and compares)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out)
    save_model(fresh_qwen2(qwen2_config(), seed, std=WIDE_INIT_STD), out)
    return out


def sft_tiny(
    out: Path, config: Any, batch: Callable[[random.Random], tuple[Any, Any]], *, steps: int, lr: float, warmup: int,
    seed: int, score: Callable[[Any], dict[str, float]], gates: dict[str, Gate], what: str, threads: int = 1,
) -> Passed:
    """A fresh tiny Qwen2 of `config` trained on `batch(rng)` ((input ids, labels) tensors; warmup.sft: `steps` Adam
    steps at `lr`, warm-up then cosine, on `threads` torch threads), scored by `score(model)` against `gates`,
    retrained from the next seed while it misses one (warmup.gated: RuntimeError naming `what` and the scores when
    no build passes); the passing model saved to `out` with its build record. Returns it (the warmed-up tiny judge
    and teacher are built this way)."""

    def build(s: int) -> tuple[Any, dict[str, float]]:
        model = sft(fresh_qwen2(config, s), batch, steps=steps, lr=lr, warmup=warmup, seed=s, threads=threads)
        return model, score(model)

    passed = gated(build, gates, seed=seed, what=what)
    save_model(passed.model, out)
    record(out, passed)
    return passed


def ensure_tiny_model(cache_dir: str | Path | None = None) -> Path:
    """Build the tiny model once into a cache dir (default ~/.cache/rayward, or $RAYWARD_CACHE)."""
    return ensure_cached(CACHE_NAME, build_tiny_model, cache_dir)


def ensure_cached(name: str, build: Callable[[Path], Path], cache_dir: str | Path | None = None) -> Path:
    """`<cache root>/<name>`, built by `build(dir)` unless already there (a checkpoint dir with config.json)."""
    root = Path(cache_dir or os.environ.get("RAYWARD_CACHE") or Path.home() / ".cache" / "rayward")
    final = root / name
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename: concurrent builders (e.g. Ray workers) never see a
    # half-written checkpoint, and the loser of the rename race just discards its copy.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
