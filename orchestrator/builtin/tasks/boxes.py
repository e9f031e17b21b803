"""The built-in tool task: open the box the user names and submit the code inside.

Each episode has `NUM_BOXES` boxes, each holding a three-digit code drawn from the row's `seed`; the user asks
for the code of one box. The model can learn a code only by calling `open_box`, and answers by calling
`submit`; `get_reward()` is 1.0 when the first submitted code is the asked box's code, else 0.0.

Written as a TRL environment (`GRPOTrainer(environment_factory=BoxEnv)`): `reset(**row)` takes the dataset
row's columns, every public method is a tool (type hints + Google docstring -> JSON schema), `get_reward()`
owns the reward. The state depends on the row only (its `seed` and `box`), so the G samples of a GRPO group,
which share a row, start from the same boxes.

Bound without the tool: the asked box's code is uniform over `CODES` whatever the prompt shows, so a policy
that never calls `open_box` (and one that never calls a tool at all, which cannot even submit) scores at most
`NO_TOOL_BOUND` = 1/900 in expectation; only the first submission counts, so it cannot guess twice.
"""

from __future__ import annotations

import random
import time
from typing import Any

NUM_BOXES = 4  # a policy that opens a box at random but copies its code well succeeds 1 time in 4
CODES = range(100, 1000)  # three digits, no leading zero: `submit(code: int)` takes it as a JSON integer
NO_TOOL_BOUND = 1 / len(CODES)  # expected reward of the best policy that never opens a box
PROMPT_TEMPLATE = "Open box {box} and submit its code."
BOXES_SIZE = 256  # rows in the built-in dataset (a run cycles through it)


class BoxEnv:
    """Boxes with secret codes. Tools: `open_box`, `submit`. Reward: 1.0 for submitting the asked box's code.

    `tool_latency_s` (class attribute) makes every tool call sleep that long, to stand in for a remote tool
    in benchmarks; subclass to set it (see `SlowBoxEnv`)."""

    tool_latency_s: float = 0.0

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}
        self.box = 0
        self.opened: list[int] = []  # boxes opened, in order (for reward functions and reports)
        self.submitted: int | None = None

    def reset(self, seed: int, box: int, **row: Any) -> None:
        """Draw the boxes' codes from `seed` (the same for every sample of a group); `box` is the one asked for.
        Returns None: the row's prompt already asks the question."""
        rng = random.Random(seed)
        self.codes = dict(zip(range(1, NUM_BOXES + 1), rng.sample(CODES, NUM_BOXES), strict=True))
        if box not in self.codes:
            raise ValueError(f"BoxEnv.reset: box {box!r} is not one of 1..{NUM_BOXES}")
        self.box = box
        self.opened = []
        self.submitted = None

    def open_box(self, box: int) -> str:
        """Open a box and read the code inside.

        Args:
            box: The number of the box to open.
        """
        self._wait()
        if box not in self.codes:
            raise ValueError(f"There is no box {box}; the boxes are 1 to {NUM_BOXES}.")
        self.opened.append(box)
        return str(self.codes[box])

    def submit(self, code: int) -> str:
        """Submit the code. Only the first submission counts.

        Args:
            code: The code to submit.
        """
        self._wait()
        if self.submitted is not None:
            return "Already submitted."
        self.submitted = int(code)
        return "Submitted."

    def get_reward(self) -> float:
        """1.0 if the first submitted code is the code of the box the user asked for, else 0.0."""
        return float(self.submitted is not None and self.submitted == self.codes[self.box])

    def _wait(self) -> None:
        if self.tool_latency_s > 0:
            time.sleep(self.tool_latency_s)


class SlowBoxEnv(BoxEnv):
    """BoxEnv whose tools take 100 ms each, as a remote tool would (the tool-latency benchmark)."""

    tool_latency_s = 0.1


def boxes_prompt(box: int) -> list[dict[str, str]]:
    """The user turn asking for `box`'s code, as chat messages (the tools are rendered by the chat template)."""
    return [{"role": "user", "content": PROMPT_TEMPLATE.format(box=box)}]


def boxes_dataset(size: int = BOXES_SIZE, seed: int = 0) -> list[dict[str, Any]]:
    """Rows with `prompt` (chat messages), `box` (the box asked for) and `seed` (draws the boxes' codes in
    `BoxEnv.reset`); both extra columns are what `reset(**row)` needs."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        box = rng.randint(1, NUM_BOXES)
        rows.append({"prompt": boxes_prompt(box), "box": box, "seed": rng.randrange(2**31)})
    return rows
