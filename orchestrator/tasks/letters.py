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
