"""A tiny distillation teacher of the letter task, built locally (no downloads): a model that differs from the
student and knows the task.

It has the tiny model's tokenizer (orchestrator/builtin/models/tiny.py: the same vocabulary, so the run's tokenizer
check passes) and architecture, its own random initialisation, and a short deterministic SFT on the toy task's prompts
(plain text, as the demo encodes them): write the letter asked for at every position, whatever came before (`_batch`).
The student (the tiny model, random) writes noise; distilling from the teacher (configs/distill.yaml) moves it
towards the teacher's answer, the letter repeated, which `letter_fraction` scores 1.

Its gates (orchestrator/builtin/models/warmup.py: a build that misses one is retrained from the next seed): its
greedy first token is the letter on every letter's prompt (the task has one prompt per letter), and what
distillation needs of it, the letter as its most likely next token after the prompt and a student's noise, on at
least MIN_NOISY of NOISY_PROBES fresh noisy answers.

`ensure_tiny_teacher()` builds it once into rayward's cache (as orchestrator/builtin/models/tiny.py does
the tiny model).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from orchestrator.builtin.models.tiny import (
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    _build_tokenizer,
    ensure_cached,
    qwen2_config,
    sft_tiny,
)
from orchestrator.builtin.models.warmup import Gate
from orchestrator.builtin.tasks.letters import LETTERS, PROMPT_TEMPLATE

# Bump when anything below changes the files written, so stale caches are not reused.
CACHE_NAME = "tiny-teacher-v5"  # v5: the portable init, the settling schedule, the noisy gate

ANSWER_TOKENS = 16  # the demo's max_completion_length
MAX_NOISE = 0.6  # the most noisy SFT rows have this share of random tokens among the letters (see _batch)
INIT_SEED = 1  # not the student's (the tiny model's seed 0): a teacher that differs from the student
SFT_BATCH = 32
SFT_LR = 3e-3
SFT_WARMUP = 30
SFT_STEPS = 400
SFT_THREADS = 1  # a model this small trains as fast on one thread
MIN_ACCURACY = 0.99
NOISY_PROBES = 200  # prompts followed by 0 to ANSWER_TOKENS - 1 random tokens, from their own seed
MIN_NOISY = 0.98


def letter_id(tokenizer: Any, letter: str) -> int:
    """The letter's own token (the toy task's letters are single BPE tokens in the tiny vocabulary)."""
    ids = tokenizer(letter, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"letter {letter!r} is {len(ids)} tokens in the tiny vocabulary")
    return ids[0]


def prompt_ids(tokenizer: Any, letter: str) -> list[int]:
    """The toy prompt as the demo's data encodes it (plain text, the tokenizer's special tokens)."""
    return list(tokenizer(PROMPT_TEMPLATE.format(letter=letter), add_special_tokens=True)["input_ids"])


def _batch(tokenizer: Any, rng: random.Random) -> tuple[Any, Any]:
    """[SFT_BATCH, T] input ids and labels (-100 on the prompt, the noise and the padding): the prompt, then
    ANSWER_TOKENS positions each the letter (labelled) or, with chance NOISE, a random token (not labelled). The
    teacher learns to write the letter asked for whatever came before it, on a student's noise too: distilled
    on-policy, a random student is pulled towards the letter at every position. (A first teacher, taught the
    clean answers only, favoured arbitrary tokens on noise, and a student distilled from it collapsed onto
    repeating one of them whatever the prompt; one taught to end the answer after noise could not teach a
    student that never samples the end of turn.)"""
    import torch

    rows, labels = [], []
    for _ in range(SFT_BATCH):
        letter = rng.choice(LETTERS)
        p, want = prompt_ids(tokenizer, letter), letter_id(tokenizer, letter)
        noise = rng.random() * MAX_NOISE  # rows from clean to noisy
        answer, lab = [], []
        for _ in range(ANSWER_TOKENS):
            if rng.random() < noise:
                answer.append(rng.randrange(len(SPECIAL_TOKENS), VOCAB_SIZE))
                lab.append(-100)
            else:
                answer.append(want)
                lab.append(want)
        rows.append(p + answer)
        labels.append([-100] * len(p) + lab)
    ids = torch.tensor(rows)  # the task's prompts are all the same length
    return ids, torch.tensor(labels)


def accuracy(model: Any, tokenizer: Any) -> float:
    """The fraction of the letters whose prompt's greedy first answer token is the letter."""
    import torch

    right = 0
    with torch.inference_mode():
        for letter in LETTERS:
            logits = model(input_ids=torch.tensor([prompt_ids(tokenizer, letter)])).logits[0, -1]
            right += int(logits.argmax()) == letter_id(tokenizer, letter)
    return right / len(LETTERS)


def noisy_accuracy(model: Any, tokenizer: Any, n: int = NOISY_PROBES, seed: int = 5) -> float:
    """The fraction of `n` prompts followed by a student's noise (0 to ANSWER_TOKENS - 1 random tokens) after which
    the teacher's most likely token is the letter asked for: where distillation pulls a random student."""
    import torch

    rng, right = random.Random(seed), 0
    with torch.inference_mode():
        for _ in range(n):
            letter = rng.choice(LETTERS)
            noise = [rng.randrange(len(SPECIAL_TOKENS), VOCAB_SIZE) for _ in range(rng.randrange(ANSWER_TOKENS))]
            logits = model(input_ids=torch.tensor([prompt_ids(tokenizer, letter) + noise])).logits[0, -1]
            right += int(logits.argmax()) == letter_id(tokenizer, letter)
    return right / n


def build_tiny_teacher(path: str | Path, seed: int = INIT_SEED) -> Path:
    """Write the tiny teacher (float32) plus tokenizer to `path`; returns the path. RuntimeError when no build
    passes its gates (the module docstring)."""
    from transformers import AutoTokenizer

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)  # as the engine and the run's tokenizer check load it
    sft_tiny(out, qwen2_config(), lambda rng: _batch(tokenizer, rng), steps=SFT_STEPS, lr=SFT_LR, warmup=SFT_WARMUP,
             seed=seed, threads=SFT_THREADS,
             score=lambda model: {"accuracy": accuracy(model, tokenizer), "noisy": noisy_accuracy(model, tokenizer)},
             gates={"accuracy": Gate(MIN_ACCURACY), "noisy": Gate(MIN_NOISY)},
             what="tiny teacher (the letter asked for after the prompt, and after a student's noise)")
    return out


def ensure_tiny_teacher(cache_dir: str | Path | None = None) -> Path:
    """Build the tiny teacher once into the cache dir (as orchestrator/builtin/models/tiny.py: ensure_tiny_model)."""
    return ensure_cached(CACHE_NAME, build_tiny_teacher, cache_dir)
