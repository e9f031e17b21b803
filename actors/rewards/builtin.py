"""Built-in reward functions, usable in a config by name (`function: letter_fraction`; `rayward rewards` lists
them): the letter task's rewards, the code rewards, and TRL's own. Ordinary TRL-style functions, importable by
path too. A built-in configured with `kwargs` stands for its factory (BUILTIN_FACTORIES), which builds the
reward from them; the reward itself only ever takes samples.
"""

from __future__ import annotations

from typing import Any


def completion_text(completion: Any) -> str:
    """The text of a completion, plain or conversational."""
    # Conversational completions are [{"role": "assistant", "content": ...}] (TRL's format).
    return completion[0]["content"] if isinstance(completion, list) else completion


def letter_fraction(completions: list[Any], letter: list[str], **kwargs: Any) -> list[float]:
    """Fraction of the completion's non-space characters that are the requested letter (0 for empty)."""
    out = []
    for c, want in zip(completions, letter, strict=True):
        chars = [ch for ch in completion_text(c) if not ch.isspace()]
        out.append(sum(ch == want for ch in chars) / len(chars) if chars else 0.0)
    return out


def starts_with_letter(completions: list[Any], letter: list[str], **kwargs: Any) -> list[float]:
    """1.0 if the first non-space character is the requested letter."""
    return [1.0 if completion_text(c).strip()[:1] == want else 0.0 for c, want in zip(completions, letter, strict=True)]


def brevity(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """1 / (1 + tokens / 8): shorter answers score higher (a reward worth gating behind correctness)."""
    return [1.0 / (1.0 + len(ids) / 8) for ids in completion_ids]


BUILTIN_REWARDS = {
    "letter_fraction": "actors.rewards.builtin:letter_fraction",
    "starts_with_letter": "actors.rewards.builtin:starts_with_letter",
    "brevity": "actors.rewards.builtin:brevity",
    # Run the completion's program against the sample's tests in a local sandbox (actors/rewards/sandbox/).
    "code_tests": "actors.rewards.code_tests:code_tests",
    "fenced_python_format": "actors.rewards.code_tests:fenced_python_format",
    # TRL's own reward functions, usable by name.
    "think_format_reward": "trl.rewards:think_format_reward",
    "accuracy_reward": "trl.rewards:accuracy_reward",
}

# Built-ins that need a package rayward does not depend on: name -> (module, its PyPI name).
BUILTIN_PACKAGES = {"accuracy_reward": ("math_verify", "math-verify")}

# Built-ins that take `kwargs` in a run config, and the factory those build the reward with.
BUILTIN_FACTORIES = {
    "code_tests": "actors.rewards.code_tests:make_code_tests",  # sandbox limits and max_concurrency
}


def builtin_target(name: str, configured: bool) -> str:
    """The `module:callable` a built-in name stands for: its factory when the config gives it kwargs
    (`configured`), else the reward. KeyError for a name that is not a built-in."""
    return BUILTIN_FACTORIES.get(name, BUILTIN_REWARDS[name]) if configured else BUILTIN_REWARDS[name]
