"""JudgeEngine on a real vLLM engine (CPU) with the tiny judge (orchestrator/builtin/models/judge.py): the engine is
built with the CPU settings the generators use, the template's format spec reaches the judge as written, requests are
answered greedily, the same verdict alone as in a batch, and the verdicts are the rubric's (the judge was trained
to it; its build checked it on a held-out set, this checks it through vLLM and the labels)."""

from __future__ import annotations

import random

import pytest

from actors.engines.judge import JudgeEngine, JudgeRequest, JudgeSpec
from orchestrator.builtin.models.judge import TEMPLATE, ensure_tiny_judge, verdict
from orchestrator.builtin.tasks.letters import LETTERS


@pytest.fixture(scope="module")
def engine():
    spec = JudgeSpec(reward="judged", model=str(ensure_tiny_judge()), template=TEMPLATE, max_tokens=3,
                     labels={"yes": 1.0, "no": 0.0}, timeout_s=120.0)
    judge = JudgeEngine(spec, max_model_len=128, kv_cache_gib=0.5)
    yield judge
    judge.close(120)


def request(completion: str, letter: str) -> JudgeRequest:
    return JudgeRequest({"completion": completion, "letter": letter})


def answers(n: int, seed: int = 7) -> list[tuple[str, str]]:
    """What a letter-task policy writes, right and wrong: repeated letters, letters and spaces, words."""
    rng = random.Random(seed)
    words = ["the box", "answer", "dad", "cab", " a a", "\nb", "aaaa", "bbbb", "cc", "d d d", "x", "?"]
    return [(rng.choice(words) if rng.random() < 0.5 else rng.choice(LETTERS) * rng.randint(1, 8), rng.choice(LETTERS))
            for _ in range(n)]


def test_verdicts_are_the_rubrics_and_the_same_alone_and_in_a_batch(engine):
    cases = answers(48)
    together = engine.judge([request(c, letter) for c, letter in cases])
    assert [a.status for a in together] == ["ok"] * len(cases)
    assert [a.value for a in together] == [float(verdict(c, letter)) for c, letter in cases]
    assert {a.text.strip() for a in together} == {"yes", "no"}
    alone = [engine.judge([request(c, letter)])[0] for c, letter in cases[:8]]
    assert [a.text for a in alone] == [a.text for a in together[:8]]
