"""JudgeEngine: an LLM judge on a vLLM engine of its own, scoring samples from a prompt template.

A plain class (no Ray import): actors/engines/pool.py makes it a Ray actor in a judge pool. A judge reward
(config `rewards[].judge`) names a model, a template over the sample (`{prompt}`, `{completion}`,
`{conversation}` and dataset columns, Python's str.format), sampling settings, and how the judge's text becomes
a score: a regular expression (its first group, else the whole match, read as a number), labels (the text's
start, longest label first), or a user function `module:function` from text to a float or None.

Requests are rendered here (the template, then the judge's chat template when its tokenizer has one) and sent
to the engine together, so the engine batches them with whatever else it is judging (its EngineLoop adds
requests between two steps). Each request is bounded by the judge's `timeout_s` from the moment it was
submitted: one that has not finished by then is aborted in the engine and answered "timeout".
"""

from __future__ import annotations

import concurrent.futures
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from actors import user_code
from actors.engines.base import EngineModel

# Template fields every sample has; any other `{name}` must be a dataset column.
SAMPLE_FIELDS = ("prompt", "completion", "conversation")
# The fields that carry the completion being judged: a template must name one, or its judge scores what it never saw.
ANSWER_FIELDS = ("completion", "conversation")


@dataclass(frozen=True)
class JudgeSpec:
    """One judge reward's judge (a plain copy of the config's JudgeConfig)."""

    reward: str  # the reward's name, for messages
    model: str
    template: str
    system: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    regex: str | None = None
    labels: dict[str, float] | None = None
    parser: str | None = None  # `module:function`, text -> float | None
    timeout_s: float = 60.0
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # the judge's chat template's arguments


@dataclass(frozen=True)
class JudgeRequest:
    """One sample to judge: the values of the fields its judge's template names."""

    fields: dict[str, Any]


@dataclass(frozen=True)
class JudgeAnswer:
    """A judge's verdict on one sample: its text and the score parsed from it (None: no opinion), or why
    there is none."""

    status: Literal["ok", "timeout", "error"]
    value: float | None = None
    text: str | None = None
    error: str | None = None  # what went wrong (status "error"), naming the judge's text where there was one
    seconds: float = 0.0  # from submission to the answer


@dataclass
class Parser:
    """A judge's text -> score rule (exactly one of regex, labels, parser)."""

    spec: JudgeSpec
    fn: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        given = [k for k in ("regex", "labels", "parser") if getattr(self.spec, k)]
        if len(given) != 1:
            raise ValueError(f"judge of reward {self.spec.reward!r}: give exactly one of regex, labels, parser "
                             f"(got {given or 'none'})")
        if self.spec.regex:
            self._re = re.compile(self.spec.regex)
        if self.spec.labels:
            self._labels = sorted(self.spec.labels.items(), key=lambda kv: -len(kv[0]))
        if self.spec.parser:
            self.fn = user_code.import_object(self.spec.parser, f"judge of reward {self.spec.reward!r}: parser")

    def __call__(self, text: str) -> float | None:
        """The score of a judge's text; ValueError (naming the text) when it has none of the expected form."""
        if self.spec.regex:
            m = self._re.search(text)
            if m is None:
                raise ValueError(f"regex {self.spec.regex!r} does not match the judge's answer {text[:80]!r}")
            got = m.group(1) if m.groups() else m.group(0)
            try:
                return _finite(float(got))
            except ValueError:
                raise ValueError(f"regex {self.spec.regex!r} matched {got!r} in the judge's answer, "
                                 "not a number") from None
        if self.spec.labels:
            head = text.strip()
            for label, value in self._labels:
                if head.startswith(label):
                    return float(value)
            raise ValueError(f"the judge's answer {text[:80]!r} starts with none of the labels "
                             f"{sorted(self.spec.labels)}")
        out = self.fn(text)
        return None if out is None else _finite(float(out))


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"score {v} is not finite")
    return v


def template_fields(template: str) -> list[str]:
    """The field names of a str.format template (`{completion}`, `{letter}`), first use order; ValueError for a
    positional or malformed one."""
    import string

    names: list[str] = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        base = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not base or base.isdigit():
            raise ValueError(f"template field {{{name}}}: fields are named ({', '.join(SAMPLE_FIELDS)} or a column)")
        if base not in names:
            names.append(base)
    return names


def missing_answer(fields: list[str]) -> str | None:
    """Why a template with these fields cannot judge a completion (it names none of ANSWER_FIELDS), or None."""
    if any(f in ANSWER_FIELDS for f in fields):
        return None
    return (f"names neither {{{ANSWER_FIELDS[0]}}} nor {{{ANSWER_FIELDS[1]}}}, so the judge never reads the completion "
            f"it scores (its fields: {fields or 'none'})")


def render_text(x: Any) -> str:
    """A prompt or completion as the judge reads it: plain text as is, a conversation as `role: content` lines."""
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        return "\n".join(f"{m.get('role', '?')}: {_content(m.get('content'))}" for m in x if isinstance(m, dict))
    return str(x)


def _content(c: Any) -> str:
    if isinstance(c, list):  # content blocks: their text (an image is named, not shown)
        return " ".join(b.get("text", "") if b.get("type") == "text" else f"<{b.get('type')}>" for b in c
                        if isinstance(b, dict))
    return "" if c is None else str(c)


def request_fields(names: list[str], prompt: Any, completion: Any, columns: dict[str, Any]) -> dict[str, Any]:
    """The values of `names` for one sample: prompt, completion, conversation (both), or a dataset column."""
    out: dict[str, Any] = {}
    for n in names:
        if n == "prompt":
            out[n] = render_text(prompt)
        elif n == "completion":
            out[n] = render_text(completion)
        elif n == "conversation":
            both = (prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]) + (
                completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}])
            out[n] = render_text(both)
        else:
            out[n] = columns[n]
    return out


class JudgeEngine(EngineModel):
    """A judge model on one vLLM engine (or any object with LLMEngine's methods: `from_loop`)."""

    def _setup(self, spec: JudgeSpec, loop: Any, max_model_len: int, tokenizer: Any) -> None:
        super()._setup(spec, loop, max_model_len, tokenizer)
        self.parse = Parser(spec)
        self.chat = getattr(tokenizer, "chat_template", None) is not None

    def __repr__(self) -> str:
        return f"JudgeEngine(reward={self.spec.reward!r}, model={self.spec.model!r})"

    def render(self, request: JudgeRequest) -> list[int]:
        """The token ids the judge reads for one request: its template filled in, as the user's message of a chat
        (after `system`) when the judge's tokenizer has a chat template, as plain text otherwise."""
        text = self.spec.template.format(**request.fields)
        if not self.chat:
            return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        messages = ([{"role": "system", "content": self.spec.system}] if self.spec.system else []) + [
            {"role": "user", "content": text}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 **self.spec.chat_template_kwargs)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def judge(self, requests: list[JudgeRequest]) -> list[JudgeAnswer]:
        """Judge samples (one engine batch: they are added together and run with any other in flight); answers
        in request order. A request that cannot be rendered, or whose prompt is longer than the judge's
        max_model_len, is answered "error" without reaching the engine."""
        from vllm import SamplingParams

        t0 = time.monotonic()
        answers: list[JudgeAnswer | None] = [None] * len(requests)
        ids: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            try:
                got = self.render(r)
            except (KeyError, IndexError, ValueError, TypeError) as err:
                answers[i] = JudgeAnswer("error",
                                         error=f"cannot fill the judge's template: {type(err).__name__}: {err}")
                continue
            if len(got) + self.spec.max_tokens > self.max_model_len:
                answers[i] = JudgeAnswer("error", error=f"the judge's prompt is {len(got)} tokens; with max_tokens "
                                         f"{self.spec.max_tokens} it exceeds the judge's max_model_len "
                                         f"{self.max_model_len}")
                continue
            ids[i] = got
        s = self.spec
        params = [SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else -1,
                                 max_tokens=s.max_tokens, stop=list(s.stop) or None,
                                 seed=None if s.temperature == 0 else s.seed + i) for i in ids]
        futures = dict(zip(ids, self.loop.submit_batch(list(ids.values()), params), strict=True)) if ids else {}
        done, _ = concurrent.futures.wait(list(futures.values()), timeout=s.timeout_s)
        for i, fut in futures.items():
            seconds = time.monotonic() - t0
            if fut not in done:
                fut.cancel()  # aborted in the engine: its slot goes to the next request
                answers[i] = JudgeAnswer("timeout", error=f"no answer within {s.timeout_s:g} s", seconds=seconds)
                continue
            try:
                text = self.tokenizer.decode(list(fut.result().outputs[0].token_ids), skip_special_tokens=True)
            except Exception as err:  # noqa: BLE001 - the engine's failure is this request's answer
                answers[i] = JudgeAnswer("error", error=f"engine: {type(err).__name__}: {err}", seconds=seconds)
                continue
            try:
                answers[i] = JudgeAnswer("ok", self.parse(text), text, seconds=seconds)
            except Exception as err:  # noqa: BLE001 - an unparseable answer, or the user's parser raising
                answers[i] = JudgeAnswer("error", text=text, error=f"{type(err).__name__}: {err}", seconds=seconds)
        return [a if a is not None else JudgeAnswer("error", error="not judged") for a in answers]


__all__ = ["JudgeAnswer", "JudgeEngine", "JudgeRequest", "JudgeSpec", "Parser", "render_text", "request_fields",
           "template_fields"]
