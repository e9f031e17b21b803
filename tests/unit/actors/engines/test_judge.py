"""JudgeEngine on a real EngineLoop over the scripted engine (tests/fixtures/engines.py) and the tiny model's
tokenizer: the template filled from a sample, the judge's chat template, the three ways text becomes a score,
and what a request gets when it cannot be answered (a template field missing, a prompt too long, no answer in
time: aborted in the engine)."""

from __future__ import annotations

import time

import pytest
from transformers import AutoTokenizer

from actors.engines.judge import JudgeEngine, JudgeRequest, JudgeSpec, request_fields, template_fields
from tests.fixtures.engines import scripted_loop

TEMPLATE = "Letter: {letter}\nAnswer: {completion}\nCorrect?"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def judge(tokenizer, reply_text, **kw) -> tuple[JudgeEngine, object]:
    """A judge whose engine answers every request with `reply_text(decoded prompt)`."""
    def reply(prompt, params):
        return tokenizer(reply_text(tokenizer.decode(prompt)), add_special_tokens=False)["input_ids"]

    loop, engine = scripted_loop(reply)
    spec = JudgeSpec(**{"reward": "judged", "model": "tiny", "template": TEMPLATE, "labels": {"yes": 1.0, "no": 0.0},
                        **kw})
    return JudgeEngine.from_loop(spec, loop, tokenizer), engine


def sample(completion: str, letter: str = "a") -> JudgeRequest:
    return JudgeRequest(request_fields(template_fields(TEMPLATE), "Write the letter a:", completion,
                                       {"letter": letter}))


def test_template_fields_and_sample_rendering():
    assert template_fields("{prompt} {completion} {letter} {prompt}") == ["prompt", "completion", "letter"]
    with pytest.raises(ValueError, match="named"):
        template_fields("{} {completion}")
    conv = [{"role": "user", "content": "hi"}]
    got = request_fields(["prompt", "completion", "conversation"], conv, [{"role": "assistant", "content": "yo"}], {})
    assert got == {"prompt": "user: hi", "completion": "assistant: yo", "conversation": "user: hi\nassistant: yo"}


def test_labels_score_each_request_from_its_own_prompt(tokenizer):
    # The scripted judge says yes iff the answer starts with the letter: checkable per request.
    def verdict(prompt: str) -> str:
        letter = prompt.split("Letter: ")[1][0]
        answer = prompt.split("Answer: ")[1]
        return " yes" if answer.strip().startswith(letter) else " no"

    j, engine = judge(tokenizer, verdict)
    out = j.judge([sample("aaa"), sample("bab"), sample("abc", "b"), sample("b b", "b")])
    assert [a.status for a in out] == ["ok"] * 4
    assert [a.value for a in out] == [1.0, 0.0, 0.0, 1.0]
    assert [a.text.strip() for a in out] == ["yes", "no", "no", "yes"]
    # One engine batch, each prompt the judge's chat template around the filled-in template.
    assert len(engine.added) == 4 and len({steps for *_, steps in engine.added}) == 1
    first = tokenizer.decode(engine.added[0][1])
    assert first.startswith("<|im_start|>user\nLetter: a\nAnswer: aaa\nCorrect?") and first.endswith(
        "<|im_start|>assistant\n")


def test_regex_and_parser_and_unparseable_answers(tokenizer):
    j, _ = judge(tokenizer, lambda p: "score 7 of 10", labels=None, regex=r"score (\d+)")
    assert j.judge([sample("a")])[0].value == 7.0
    j, _ = judge(tokenizer, lambda p: "maybe", labels=None, regex=r"score (\d+)")
    (a,) = j.judge([sample("a")])
    assert a.status == "error" and a.value is None and a.text == "maybe" and "does not match" in a.error
    j, _ = judge(tokenizer, lambda p: "maybe")
    (a,) = j.judge([sample("a")])
    assert a.status == "error" and "none of the labels" in a.error
    j, _ = judge(tokenizer, lambda p: "a b c", labels=None, parser="tests.unit.actors.engines.test_judge:count_words")
    assert j.judge([sample("a")])[0].value == 3.0
    with pytest.raises(ValueError, match="exactly one of regex, labels, parser"):
        judge(tokenizer, lambda p: "", regex="x")


def count_words(text: str) -> float | None:
    return float(len(text.split())) if text else None


def test_requests_that_cannot_be_answered_get_a_reason_and_the_rest_are_judged(tokenizer):
    j, engine = judge(tokenizer, lambda p: " yes")
    bad = JudgeRequest({"completion": "a"})  # no `letter`
    long = sample("a" * 2000)
    out = j.judge([bad, sample("a"), long])
    assert out[0].status == "error" and "template" in out[0].error and "letter" in out[0].error
    assert out[1].status == "ok" and out[1].value == 1.0
    assert out[2].status == "error" and "max_model_len" in out[2].error
    assert len(engine.added) == 1  # only the answerable one reached the engine


def test_a_request_past_the_timeout_is_aborted_in_the_engine(tokenizer):
    j, engine = judge(tokenizer, lambda p: " yes", timeout_s=0.3)
    engine.hold_next()  # the engine never steps: no answer in time
    out = j.judge([sample("a"), sample("b")])
    assert [a.status for a in out] == ["timeout", "timeout"] and all(a.value is None for a in out)
    assert all(a.seconds >= 0.3 for a in out) and "0.3 s" in out[0].error
    engine.release()
    deadline = time.monotonic() + 5
    while len(engine.aborted) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(engine.aborted) == 2


@pytest.mark.parametrize(("family", "user_marker", "generation_prompt"), [
    ("llama3_1", "<|start_header_id|>user<|end_header_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("gemma3", "<start_of_turn>user\n", "<start_of_turn>model\n"),
    ("deepseekv3", "<｜User｜>", "<｜Assistant｜><think>\n"),  # its generation prompt opens a thought
])
def test_a_judge_with_a_trl_shipped_chat_template_reads_system_and_template(tokenizer, family, user_marker,
                                                                             generation_prompt):
    """Judges are other model families than the policy: the prompt goes through the judge's own chat template
    (TRL's shipped ones here, set on a copy of the tiny tokenizer), system message included, ending in that
    family's generation prompt."""
    from copy import deepcopy
    from importlib import resources

    tok = deepcopy(tokenizer)
    tok.chat_template = resources.files("trl").joinpath(f"chat_templates/{family}.jinja").read_text()
    j, engine = judge(tok, lambda p: " yes", system="You grade answers.")
    (a,) = j.judge([sample("aaa")])
    assert a.status == "ok" and a.value == 1.0
    text = tok.decode(engine.added[0][1])
    assert "You grade answers." in text and user_marker in text
    assert text.index("You grade answers.") < text.index("Letter: a\nAnswer: aaa\nCorrect?")
    assert text.endswith(generation_prompt)
