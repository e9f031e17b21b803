"""JudgeEngine on a real vLLM engine (CPU) with the tiny model as the judge: the engine is built with the CPU
settings the generators use, requests are answered greedily, the same verdict alone as in a batch, and the text
the parser reads is the one vLLM sampled. (Whether the tiny model judges well is not the point here: its text is
parsed by a function that makes any text a checkable score.)"""

from __future__ import annotations

import pytest

from actors.engines.judge import JudgeEngine, JudgeRequest, JudgeSpec

TEMPLATE = "Letter: {letter}\nAnswer: {completion}\nCorrect?"


def text_length(text: str) -> float:
    return float(len(text))


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    spec = JudgeSpec(reward="judged", model=str(tiny_model_path), template=TEMPLATE, max_tokens=6,
                     parser=f"{__name__}:text_length", timeout_s=120.0)
    judge = JudgeEngine(spec, max_model_len=256, kv_cache_gib=1.0)
    yield judge
    judge.close(120)


def request(completion: str, letter: str) -> JudgeRequest:
    return JudgeRequest({"completion": completion, "letter": letter})


def test_greedy_verdicts_are_the_same_alone_and_in_a_batch(engine):
    batch = [request(c, letter) for c, letter in [("a a a", "a"), ("b", "a"), ("c c", "c"), ("the box", "b")]]
    together = engine.judge(batch)
    alone = [engine.judge([r])[0] for r in batch]
    assert [a.status for a in together] == ["ok"] * 4
    assert [a.text for a in together] == [a.text for a in alone] and all(a.text is not None for a in together)
    assert [a.value for a in together] == [float(len(a.text)) for a in together]
    out = engine.judge([request("x" * 400, "a")])[0]  # longer than the judge's max_model_len
    assert out.status == "error" and "max_model_len 256" in out.error
