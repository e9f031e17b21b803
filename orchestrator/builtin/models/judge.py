"""A tiny LLM judge of the letter task, built locally (no downloads): a model whose verdicts can be checked.

It reads TEMPLATE, a plain-text prompt (its tokenizer has no chat template, as a base model's), and answers
`yes` when the policy's answer begins with the letter asked for, `no` otherwise. The template shows it the
answer's first character only (`{completion:.1}`, str.format's precision): a model this small learns to read
one character in seconds, but not to find the first of sixteen random tokens in a budget CI can pay. So its
rubric is `verdict`: the answer's first character is the letter (the built-in `starts_with_letter` also skips
leading spaces), and every verdict of a run can be checked against it (tests and configs/judge.yaml do).

It has the tiny model's tokenizer (orchestrator/builtin/models/tiny.py) and width, and a short SFT on synthetic
answers, a third starting with the letter, a third with another of the task's letters (the hard case: a letter, the
wrong one) and a third with anything else. Its gate: its greedy verdicts on fresh answers (half of them starting
with the letter, as the policy's would) agree with the rubric at least MIN_AGREEMENT of the time
(orchestrator/builtin/models/warmup.py: a build that misses it is retrained from the next seed).

`ensure_tiny_judge()` builds it once into rayward's cache (as orchestrator/builtin/models/tiny.py does the tiny model).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from orchestrator.builtin.models.tiny import (
    SPECIAL_TOKENS,
    _build_tokenizer,
    ensure_cached,
    qwen2_config,
    sft_tiny,
)
from orchestrator.builtin.models.warmup import Gate
from orchestrator.builtin.tasks.letters import LETTERS

# Bump when anything below changes the files written, so stale caches are not reused.
CACHE_NAME = "tiny-judge-v2"  # v2: the hard third of the answers, the settling schedule, the gate

# The judge's prompt, as a judge reward's `template` (configs/judge.yaml uses it verbatim).
TEMPLATE = "{completion:.1}\nLetter: {letter}\nCorrect?"
YES, NO = "yes", "no"
MAX_ANSWER_TOKENS = 16  # the demo's max_completion_length: the longest answer the judge is trained on

# The policy's two layers: one attention layer brings the letter to the last position, one the character.
NUM_LAYERS = 2
SFT_SEED = 0
SFT_BATCH = 32
SFT_LR = 1e-3
SFT_WARMUP = 100
SFT_STEPS = 1000
SFT_THREADS = 1  # a model this small trains as fast on one thread
# The answers it is taught on: (starting with the letter, with another of the task's letters); the rest start with
# anything else. Taught on the checked mix (a quarter of the hard case), a judge this small learns "starts with a
# task letter" and stalls there (a tenth of its verdicts wrong); a third of hard cases teaches the comparison.
TRAIN_SHARES = (1 / 3, 1 / 3)
CHECK_SHARES = (0.5, 0.25)  # the policy's answers: half right
CHECK_SAMPLES = 1000
MIN_AGREEMENT = 0.99


def verdict(completion: str, letter: str) -> bool:
    """The rubric: the answer's first character is the letter (TEMPLATE shows the judge that character alone)."""
    return completion[:1] == letter


def first_chars(tokenizer: Any) -> dict[str, list[int]]:
    """The non-special tokens by the first character of their text."""
    out: dict[str, list[int]] = {}
    for i in range(len(SPECIAL_TOKENS), tokenizer.vocab_size):
        out.setdefault(tokenizer.decode([i])[:1], []).append(i)
    return out


def synthetic_answer(rng: random.Random, tokenizer: Any, letter: str, by_first: dict[str, list[int]],
                     shares: tuple[float, float] = CHECK_SHARES) -> str:
    """One answer the policy could write: its first token drawn from the tokens that start with `letter` (share
    shares[0]), with another of the task's letters (shares[1]) or with anything else, then up to MAX_ANSWER_TOKENS
    random tokens."""
    draw = rng.random()
    if draw < shares[0]:
        first = by_first[letter]
    elif draw < shares[0] + shares[1]:
        first = by_first[rng.choice([c for c in LETTERS if c != letter])]
    else:
        first = by_first[rng.choice([c for c in by_first if c != letter])]
    rest = [rng.randrange(len(SPECIAL_TOKENS), tokenizer.vocab_size)
            for _ in range(rng.randint(0, MAX_ANSWER_TOKENS - 1))]
    return tokenizer.decode([rng.choice(first), *rest])


def judge_ids(tokenizer: Any, letter: str, completion: str) -> list[int]:
    """The judge's prompt as a judge reward renders it (actors/engines/judge.py: a tokenizer without a chat
    template reads the filled template as plain text)."""
    return list(tokenizer(TEMPLATE.format(letter=letter, completion=completion), add_special_tokens=True)["input_ids"])


def _batch(tokenizer: Any, rng: random.Random) -> tuple[Any, Any]:
    """SFT_BATCH (prompt, verdict) pairs padded right: (input_ids, labels), labels -100 off the verdict."""
    import torch

    eos = tokenizer.eos_token_id
    by_first = first_chars(tokenizer)
    seqs = []
    for _ in range(SFT_BATCH):
        letter = rng.choice(LETTERS)
        answer = synthetic_answer(rng, tokenizer, letter, by_first, TRAIN_SHARES)
        prompt = judge_ids(tokenizer, letter, answer)
        target = tokenizer(YES if verdict(answer, letter) else NO, add_special_tokens=False)["input_ids"] + [eos]
        seqs.append((prompt + target, len(prompt)))
    width = max(len(ids) for ids, _ in seqs)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in seqs])
    labels = torch.tensor([[-100] * n + ids[n:] + [-100] * (width - len(ids)) for ids, n in seqs])
    return input_ids, labels


def agreement(model: Any, tokenizer: Any, n: int = CHECK_SAMPLES, seed: int = SFT_SEED + 1) -> float:
    """The fraction of `n` fresh synthetic answers whose greedy verdict (the first answer token) is the rubric's."""
    import torch

    rng = random.Random(seed)
    by_first = first_chars(tokenizer)
    yes, no = (tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in (YES, NO))
    right = 0
    with torch.inference_mode():
        for _ in range(n):
            letter = rng.choice(LETTERS)
            answer = synthetic_answer(rng, tokenizer, letter, by_first)
            logits = model(input_ids=torch.tensor([judge_ids(tokenizer, letter, answer)])).logits[0, -1]
            said_yes = bool(logits[yes] > logits[no])
            right += said_yes == verdict(answer, letter)
    return right / n


def build_tiny_judge(path: str | Path, seed: int = SFT_SEED) -> Path:
    """Write the tiny judge (float32) plus tokenizer to `path`; returns the path. RuntimeError when no build's
    verdicts agree with the rubric on MIN_AGREEMENT of fresh answers."""
    from transformers import AutoTokenizer

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = None  # a plain-text judge, as a base model is
    (out / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)  # as the engine loads it
    sft_tiny(out, qwen2_config(NUM_LAYERS), lambda rng: _batch(tokenizer, rng), steps=SFT_STEPS, lr=SFT_LR,
             warmup=SFT_WARMUP, seed=seed, threads=SFT_THREADS,
             score=lambda model: {"agreement": agreement(model, tokenizer)}, gates={"agreement": Gate(MIN_AGREEMENT)},
             what="tiny judge (its verdicts against starts_with_letter on fresh answers)")
    return out


def ensure_tiny_judge(cache_dir: str | Path | None = None) -> Path:
    """Build the tiny judge once into the cache dir (as orchestrator/builtin/models/tiny.py: ensure_tiny_model)."""
    return ensure_cached(CACHE_NAME, build_tiny_judge, cache_dir)
