"""The built-in toy task: "Write the letter X:" -> reward for writing X.

Learnable from random weights within a few dozen GRPO steps (the demo), yet prompt-conditioned, so a
policy that learns it is reading the prompt. Its reward functions (`letter_fraction`, `starts_with_letter`,
`brevity`) are built-ins of the reward workers: `actors/rewards/builtin.py`.
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


# The mixed task's share of rows whose reference is missing (no completion can score: as a real RLVR set's
# mislabeled or unanswerable items), and its size (small, so each row is drawn often within a short run).
BROKEN_SHARE = 5 / 8
MIXED_SIZE = 64


def mixed_dataset(size: int = MIXED_SIZE, seed: int = 0) -> list[dict[str, Any]]:
    """The letter task with broken references (`data.path: toy-mixed`): every prompt asks for a letter, but in
    BROKEN_SHARE of the rows the `letter` column is empty, so letter_fraction scores 0 whatever is written: groups
    with no spread, which a uniform sampler keeps drawing and a difficulty sampler learns to rest. `answerable`
    says which rows are which (for reports; no reward reads it)."""
    rng = random.Random(seed)
    broken = set(rng.sample(range(size), round(size * BROKEN_SHARE)))
    rows = []
    for i in range(size):
        c = rng.choice(LETTERS)
        rows.append({"prompt": PROMPT_TEMPLATE.format(letter=c), "letter": "" if i in broken else c,
                     "answerable": i not in broken})
    return rows
