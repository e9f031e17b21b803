"""The built-in code task: enough distinct problems, prompts that ask for a fenced answer, and tests that
are neither broken (each reference solution passes them, through the real code_tests reward) nor vacuous
(a stub that returns None fails them)."""

from __future__ import annotations

import builtins
import keyword

import pytest

from actors.rewards.code_tests import make_code_tests
from actors.rewards.sandbox import SandboxError
from orchestrator.builtin.tasks.code import PROBLEMS, code_dataset, reference_solutions

MIN_PROBLEMS = 40


@pytest.fixture(scope="module")
def reward():
    try:
        return make_code_tests(timeout_s=5.0, memory_mb=256, max_concurrency=2)
    except SandboxError as err:
        pytest.skip(f"sandbox unusable on this machine: {err}")


def fenced(code: str) -> str:
    return f"```python\n{code}```\n"


def test_dataset_shape():
    rows = code_dataset()
    assert len(rows) >= MIN_PROBLEMS
    assert all(set(r) == {"prompt", "tests"} for r in rows)  # no solution leaks into the rows
    names = [p.name for p in PROBLEMS]
    assert len(set(names)) == len(names)
    assert len({r["prompt"] for r in rows}) == len(rows)
    for p, r in zip(PROBLEMS, rows, strict=True):
        assert p.name.isidentifier() and not keyword.iskeyword(p.name)
        assert not hasattr(builtins, p.name)  # code_tests hides program names that shadow builtins
        assert f"`{p.name}(" in r["prompt"] and "```python" in r["prompt"]
        assert 3 <= len(r["tests"]) <= 5
        assert all(p.name in t for t in r["tests"])
        assert p.solution.strip() not in r["prompt"]


def test_seeded_shuffle_is_deterministic():
    assert code_dataset(seed=1) == code_dataset(seed=1)
    assert sorted(r["prompt"] for r in code_dataset(seed=1)) == sorted(r["prompt"] for r in code_dataset())


@pytest.mark.slow  # every solution and stub runs in a real sandbox
def test_reference_solutions_pass_and_stubs_fail(reward):
    rows = code_dataset()
    sols = reference_solutions()
    completions = [fenced(sols[p.name]) for p in PROBLEMS]
    stubs = [fenced(f"def {p.name}(*args, **kwargs):\n    return None\n") for p in PROBLEMS]
    scores = reward(prompts=[r["prompt"] for r in rows] * 2, completions=completions + stubs,
                    tests=[r["tests"] for r in rows] * 2)
    passed, stubbed = scores[: len(rows)], scores[len(rows):]
    assert [p.name for p, s in zip(PROBLEMS, passed, strict=True) if s != 1.0] == []
    assert [p.name for p, s in zip(PROBLEMS, stubbed, strict=True) if s == 1.0] == []
