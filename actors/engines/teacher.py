"""TeacherEngine: an on-policy distillation teacher on a vLLM engine of its own, scoring the student's tokens.

A plain class (no Ray import): actors/engines/pool.py makes it a Ray actor in a teacher pool. For each sample it
reads the student's sequence (prompt ids + completion ids, exactly as the student's engine saw and sampled them:
never re-tokenized) and returns the teacher's log-probability of every completion token: vLLM's prompt log-probs
of the whole sequence (`prompt_logprobs=0`: the actual token's only), one forward, one generated token thrown
away. These are the engine's raw log-probs (temperature 1: vLLM applies no sampling settings to prompt
log-probs), as TRL's server distillation gets them from `vllm serve`.

Requests of a call are added to the engine together and batched with whatever else it runs; each is bounded by
the teacher's `timeout_s` from its submission ("timeout" after it, aborted in the engine).
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

from actors.engines.base import EngineModel


@dataclass(frozen=True)
class TeacherSpec:
    """The run's teacher (a plain copy of the config's DistillationConfig, what the engine needs)."""

    model: str
    timeout_s: float = 120.0  # per request, from its submission
    seed: int = 0


@dataclass(frozen=True)
class TeacherRequest:
    """One sample to score: the student's ids, prompt then completion (multi-turn: the whole exchange)."""

    prompt_ids: list[int]
    completion_ids: list[int]


@dataclass(frozen=True)
class TeacherAnswer:
    """The teacher's log-prob of each completion token of one sample, or why there is none."""

    status: Literal["ok", "timeout", "error"]
    logprobs: list[float] | None = None  # [len(completion_ids)] (status "ok")
    error: str | None = None
    seconds: float = 0.0  # from submission to the answer


def completion_logprobs(prompt_logprobs: list[Any] | None, prompt_len: int, completion_ids: list[int]) -> list[float]:
    """The completion's log-probs out of vLLM's prompt log-probs of the whole sequence (per position: None at 0,
    then {token id: Logprob}); ValueError when a position lacks its token (a teacher that saw other ids)."""
    if prompt_logprobs is None or len(prompt_logprobs) != prompt_len + len(completion_ids):
        got = None if prompt_logprobs is None else len(prompt_logprobs)
        raise ValueError(f"the engine returned {got} prompt log-probs for {prompt_len} + {len(completion_ids)} tokens")
    out = []
    for k, tok in enumerate(completion_ids):
        entry = prompt_logprobs[prompt_len + k]
        lp = None if entry is None else entry.get(tok)
        if lp is None:
            raise ValueError(f"no log-prob for completion token {k} (id {tok})")
        out.append(float(lp.logprob))
    return out


class TeacherEngine(EngineModel):
    """A teacher model on one vLLM engine (or any object with LLMEngine's methods: `from_loop`)."""

    def __repr__(self) -> str:
        return f"TeacherEngine(model={self.spec.model!r})"

    def logprobs(self, requests: list[TeacherRequest]) -> list[TeacherAnswer]:
        """Score samples (one engine batch); answers in request order. A sequence longer than the teacher's
        max_model_len (its one generated token included) is answered "error" without reaching the engine."""
        from vllm import SamplingParams

        t0 = time.monotonic()
        answers: list[TeacherAnswer | None] = [None] * len(requests)
        ids: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            n = len(r.prompt_ids) + len(r.completion_ids)
            if not r.completion_ids:
                answers[i] = TeacherAnswer("ok", [])
            elif n + 1 > self.max_model_len:
                answers[i] = TeacherAnswer("error", error=f"the sequence is {n} tokens; with the one token the "
                                           f"engine generates it exceeds the teacher's max_model_len "
                                           f"{self.max_model_len}")
            else:
                ids[i] = list(r.prompt_ids) + list(r.completion_ids)
        # Greedy, one token: the forward over the sequence is the work; the generated token is not used.
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        futures = dict(zip(ids, self.loop.submit_batch(list(ids.values()), [params] * len(ids)), strict=True)) \
            if ids else {}
        done, _ = concurrent.futures.wait(list(futures.values()), timeout=self.spec.timeout_s)
        for i, fut in futures.items():
            seconds = time.monotonic() - t0
            if fut not in done:
                fut.cancel()
                answers[i] = TeacherAnswer("timeout", error=f"no answer within {self.spec.timeout_s:g} s",
                                           seconds=seconds)
                continue
            try:
                lps = completion_logprobs(fut.result().prompt_logprobs, len(requests[i].prompt_ids),
                                          requests[i].completion_ids)
            except Exception as err:  # noqa: BLE001 - the engine's failure is this request's answer
                answers[i] = TeacherAnswer("error", error=f"engine: {type(err).__name__}: {err}", seconds=seconds)
                continue
            if not all(math.isfinite(x) for x in lps):  # a -inf would make the sample's KL infinite
                answers[i] = TeacherAnswer("error", error="the teacher's log-probs are not finite", seconds=seconds)
                continue
            answers[i] = TeacherAnswer("ok", lps, seconds=seconds)
        return [a if a is not None else TeacherAnswer("error", error="not scored") for a in answers]


__all__ = ["TeacherAnswer", "TeacherEngine", "TeacherRequest", "TeacherSpec", "completion_logprobs"]
