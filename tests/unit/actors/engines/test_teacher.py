"""TeacherEngine on a real EngineLoop over the scripted engine (tests/fixtures/engines.py): the teacher reads the
student's ids (prompt + completion, never re-tokenized) and answers the log-probs of the completion's tokens out of
the engine's prompt log-probs, one engine batch, one forward each; what a request gets when it cannot be answered
(a sequence too long for the teacher, no answer in time). The same on a real vLLM engine
with the tiny teacher, against transformers: tests/integration/actors/engines/test_teacher_engine.py."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from actors.engines.teacher import TeacherEngine, TeacherRequest, TeacherSpec, completion_logprobs
from tests.fixtures.engines import PROMPT_LOGPROB, scripted_loop


def teacher(timeout_s: float = 30.0, max_model_len: int = 64) -> tuple[TeacherEngine, object]:
    loop, engine = scripted_loop(lambda prompt, params: [0])
    return TeacherEngine.from_loop(TeacherSpec(model="scripted", timeout_s=timeout_s), loop,
                                  max_model_len=max_model_len), engine


def test_the_completion_tokens_log_probs_in_one_engine_batch():
    t, engine = teacher()
    requests = [TeacherRequest([5, 6, 7], [8, 9]), TeacherRequest([5, 6], [40, 41, 42]), TeacherRequest([3], [])]
    out = t.logprobs(requests)
    assert [a.status for a in out] == ["ok"] * 3
    for r, a in zip(requests, out, strict=True):
        ids = r.prompt_ids + r.completion_ids
        assert a.logprobs == [PROMPT_LOGPROB(ids, len(r.prompt_ids) + k) for k in range(len(r.completion_ids))]
    assert out[2].logprobs == []  # nothing sampled, nothing to score: the engine is not asked
    assert [ids for _, ids, _, _ in engine.added] == [[5, 6, 7, 8, 9], [5, 6, 40, 41, 42]]
    assert len({steps for *_, steps in engine.added}) == 1  # added together: one batch
    params = engine.added[0][2]
    assert (params.max_tokens, params.prompt_logprobs, params.temperature) == (1, 0, 0.0)


def test_a_sequence_the_teacher_cannot_hold_is_an_error_without_reaching_the_engine():
    t, engine = teacher(max_model_len=8)
    long, fits = TeacherRequest(list(range(1, 6)), [7, 8, 9]), TeacherRequest([1, 2, 3], [4, 5, 6])
    out = t.logprobs([long, fits])
    assert out[0].status == "error" and "max_model_len 8" in out[0].error and out[0].logprobs is None
    assert out[1].status == "ok" and len(engine.added) == 1


def test_no_answer_in_time_is_a_timeout():
    t, engine = teacher(timeout_s=0.2)
    engine.hold_next()  # the engine never steps while the teacher waits
    t0 = time.monotonic()
    (a,) = t.logprobs([TeacherRequest([1, 2], [3])])
    assert a.status == "timeout" and "0.2 s" in a.error and a.logprobs is None and time.monotonic() - t0 >= 0.2
    engine.release()


def test_completion_logprobs_refuses_what_does_not_line_up():
    lp = lambda x: {7: SimpleNamespace(logprob=x)}  # noqa: E731
    assert completion_logprobs([None, lp(-1.0), lp(-2.0)], 1, [7, 7]) == [-1.0, -2.0]
    with pytest.raises(ValueError, match="3 prompt log-probs for 1 \\+ 1 tokens"):
        completion_logprobs([None, lp(-1.0), lp(-2.0)], 1, [7])
    with pytest.raises(ValueError, match="no log-prob for completion token 1"):
        completion_logprobs([None, lp(-1.0), {8: SimpleNamespace(logprob=-1.0)}], 1, [7, 7])
