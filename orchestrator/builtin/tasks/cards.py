"""The built-in vision tool task: the colours task (orchestrator/builtin/tasks/colors.py) with the picture
behind a tool.

The user asks for the letter of a face-down card's colour (red a, green b, blue c, yellow d); the prompt's text is
the same on every row and holds no image. The card is seen only by calling `look`, whose result is TRL's
multimodal tool response: a list of content blocks, the card's picture and a line of text. Scored by
`card_letter`: 1.0 when the model's last answer starts with the card's letter. A policy that never sees the
picture can do no better than always writing one letter: CARDS_BLIND_BOUND (0.25) in expectation over the
balanced colours; a run past it reads the image a tool returned.

Written as a TRL environment (`GRPOTrainer(environment_factory=CardEnv)`): `reset(**row)` takes the row's
`letter` and `seed` (the picture is drawn from them, so a group's G sessions see the same card), the public method
`look` is the tool.
"""

from __future__ import annotations

import random
from typing import Any

from orchestrator.builtin.tasks.colors import color_image
from orchestrator.builtin.tasks.letters import LETTERS

PROMPT = "What colour is the card? Look at it, then write its letter."
CARDS_SIZE = 256
# The best expected reward of a policy that does not see the card (always one letter; balanced colours).
CARDS_BLIND_BOUND = 1 / len(LETTERS)
LOOK_TEXT = "The card."


class CardEnv:
    """A face-down card of one of four colours. Tool: `look`. Scored by the `card_letter` reward function."""

    def __init__(self) -> None:
        self.letter = ""
        self.picture: Any = None
        self.looks = 0

    def reset(self, letter: str, seed: int, **row: Any) -> None:
        """Draw the card of `letter`'s colour from `seed` (the same picture for every sample of a group)."""
        if letter not in LETTERS:
            raise ValueError(f"CardEnv.reset: letter {letter!r} is not one of {LETTERS}")
        self.letter = letter
        self.picture = color_image(letter, random.Random(seed))
        self.looks = 0

    def look(self) -> list[dict[str, Any]]:
        """Turn the card over and look at it.

        Returns:
            The card's picture.
        """
        self.looks += 1
        return [{"type": "image", "image": self.picture}, {"type": "text", "text": LOOK_TEXT}]


def cards_dataset(size: int = CARDS_SIZE, seed: int = 0) -> list[dict[str, Any]]:
    """Rows with `prompt` (one user message), `letter` (the card's, the reward's column) and `seed` (the
    picture's), colours balanced."""
    rng = random.Random(seed)
    letters = [LETTERS[i % len(LETTERS)] for i in range(size)]
    rng.shuffle(letters)
    return [{"prompt": [{"role": "user", "content": PROMPT}], "letter": c, "seed": rng.randrange(2**31)}
            for c in letters]


def final_answer(completion: Any) -> str:
    """The text of the conversation's last assistant message ('' if none)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion or []):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def card_letter(completions: list[Any], letter: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the last answer's first non-space character is the card's letter (TRL's reward signature)."""
    return [1.0 if final_answer(c).strip()[:1] == want else 0.0 for c, want in zip(completions, letter, strict=True)]
