"""The built-in toy task: "Write the letter X:" -> reward for writing X.

Learnable from random weights within a few dozen GRPO steps (the demo), yet prompt-conditioned, so a
policy that learns it is reading the prompt. The reward functions are ordinary TRL-style functions; the
config names them `letter_fraction`, `starts_with_letter` and `brevity`, or by import path.
"""

from __future__ import annotations

import random
from typing import Any

# Few letters so each one is seen often in a short run; distinct single-character BPE tokens in the tiny model.
LETTERS = "abcd"
PROMPT_TEMPLATE = "Write the letter {letter}:"
TOY_SIZE = 256  # prompts in the generated dataset (the demo cycles through it)


def toy_dataset(size: int = TOY_SIZE, seed: int = 0) -> list[dict[str, Any]]:
    """Rows with `prompt` (plain text) and `letter` (a column the reward functions receive)."""
    rng = random.Random(seed)
    letters = [rng.choice(LETTERS) for _ in range(size)]
    return [{"prompt": PROMPT_TEMPLATE.format(letter=c), "letter": c} for c in letters]


def _text(completion: Any) -> str:
    # Conversational completions are [{"role": "assistant", "content": ...}] (TRL's format).
    return completion[0]["content"] if isinstance(completion, list) else completion


def letter_fraction(completions: list[Any], letter: list[str], **kwargs: Any) -> list[float]:
    """Fraction of the completion's non-space characters that are the requested letter (0 for empty)."""
    out = []
    for c, want in zip(completions, letter, strict=True):
        chars = [ch for ch in _text(c) if not ch.isspace()]
        out.append(sum(ch == want for ch in chars) / len(chars) if chars else 0.0)
    return out


def starts_with_letter(completions: list[Any], letter: list[str], **kwargs: Any) -> list[float]:
    """1.0 if the first non-space character is the requested letter."""
    return [1.0 if _text(c).strip()[:1] == want else 0.0 for c, want in zip(completions, letter, strict=True)]


def brevity(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """1 / (1 + tokens / 8): shorter answers score higher (a reward worth gating behind correctness)."""
    return [1.0 / (1.0 + len(ids) / 8) for ids in completion_ids]


BUILTIN_REWARDS = {
    "letter_fraction": "orchestrator.tasks.letters:letter_fraction",
    "starts_with_letter": "orchestrator.tasks.letters:starts_with_letter",
    "brevity": "orchestrator.tasks.letters:brevity",
    # TRL's own reward functions, usable by name.
    "think_format_reward": "trl.rewards:think_format_reward",
    "accuracy_reward": "trl.rewards:accuracy_reward",
}
