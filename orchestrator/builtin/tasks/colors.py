"""The built-in vision task: the letter task with the letter shown as a colour.

Each row's image is a square of one of four colours (red, green, blue, yellow: letters a, b, c, d) on a grey
field, at a random place and size; the prompt's text is the same for every row ("Write the letter of this
colour:"), so only the image tells which letter earns the reward. Scored by the letter task's own reward
(`letter_fraction`, the `letter` column). A policy that ignores the image can do no better than always writing
one letter: COLORS_BLIND_BOUND (0.25) in expectation over the balanced colours; a run past it reads the image.

Rows are conversational and carry their image in TRL's `image` column (GRPOTrainer's format for vision-language
models), images drawn with PIL at IMAGE_SIZE pixels (4 vision tokens for the tiny VLM's 28-pixel merged patch).
"""

from __future__ import annotations

import random
from typing import Any

from orchestrator.builtin.tasks.letters import LETTERS

COLORS = {"a": (220, 30, 30), "b": (30, 180, 30), "c": (30, 60, 220), "d": (230, 210, 20)}
PROMPT = "Write the letter of this colour:"
IMAGE_SIZE = 56
COLORS_SIZE = 256
# The best expected reward of a policy that does not see the image (always one letter; balanced colours).
COLORS_BLIND_BOUND = 1 / len(LETTERS)


def color_image(letter: str, rng: random.Random) -> Any:
    """A grey IMAGE_SIZE square with a square of the letter's colour, at a random place and size."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (128, 128, 128))
    side = rng.randint(IMAGE_SIZE // 2, IMAGE_SIZE - 4)
    x, y = rng.randint(0, IMAGE_SIZE - side), rng.randint(0, IMAGE_SIZE - side)
    ImageDraw.Draw(image).rectangle((x, y, x + side - 1, y + side - 1), fill=COLORS[letter])
    return image


def colors_dataset(size: int = COLORS_SIZE, seed: int = 0) -> list[dict[str, Any]]:
    """Rows with `prompt` (one user message), `image` (PIL) and `letter` (the reward's column), colours balanced."""
    rng = random.Random(seed)
    letters = [LETTERS[i % len(LETTERS)] for i in range(size)]
    rng.shuffle(letters)
    return [{"prompt": [{"role": "user", "content": PROMPT}], "image": color_image(c, rng), "letter": c}
            for c in letters]
