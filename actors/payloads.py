"""The data plane: token data travels by reference, never through the driver.

A generator keeps each finished group's token data (`GroupPayload`: prompt ids, completion ids, sampling log-probs,
per-token versions, text, trajectories, routes, images) in Ray's object store and answers the driver with a small
`GroupOut`: the group's place in the call, one `SampleInfo` per sample (lengths, finish reason, oldest policy
version, what an agentic trajectory did) and the payload's ObjectRef. The driver holds headers, rewards,
advantages and metrics, a few hundred bytes per sample whatever the sequences' length; what reads tokens fetches
them from where they were made: the reward workers (text, ids where a reward asks), the judge and teacher stages,
the learner (its micro-batches), the completions log's writer.

Ownership (Ray's): a payload lives while the generator process that put it does and its node holds the copy; one
lost with either is those samples lost (`PayloadLost`), regenerated or dropped as a lost generator's groups are,
never a crash. The driver's references keep a payload alive until its step is trained and logged; then Ray frees
it (or spills it when the object store fills).

Token arrays are numpy (int32 ids and versions, float32 log-probs, int16 routes): a consumer's fetch maps them
without a Python object per token.
"""

from __future__ import annotations

import ast
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from actors.types import (
    GroupOut,
    GroupPayload,
    RewardBatch,
    Sample,
    SampleInfo,
    Scores,
    TrainBatch,
    Trajectory,
    group_rows,
)


class PayloadLost(RuntimeError):
    """Payloads that cannot be fetched any more (their node or the generator that put them is gone): `lost` holds
    their indices in the list asked for."""

    def __init__(self, lost: list[int], why: str):
        super().__init__(f"{len(lost)} payload(s) lost ({why})")
        self.lost, self.why = lost, why


def _arrays(s: Sample) -> Sample:
    """The sample with its per-token lists as numpy arrays (ids and versions int32, log-probs float32)."""
    return Sample(
        np.asarray(s.completion_ids, dtype=np.int32), np.asarray(s.logprobs, dtype=np.float32), s.text,
        s.finish_reason, None if s.versions is None else np.asarray(s.versions, dtype=np.int32),
        s.trajectory, s.routes,
    )


def info_of(s: Sample) -> SampleInfo:
    t = s.trajectory
    versions = [v for v in (s.versions if s.versions is not None else ()) if v >= 0]
    version = int(min(versions)) if len(versions) else None
    if t is None:
        return SampleInfo(len(s.completion_ids), len(s.completion_ids), s.finish_reason, version)
    return SampleInfo(
        len(s.completion_ids), sum(1 for x in t.turn_ids if x >= 0), s.finish_reason, version, turns=t.turns,
        tool_calls=t.tool_calls, tool_failures=t.tool_failures, tool_tokens=t.tool_tokens,
        truncated_tool_results=t.truncated_tool_results, env_s=t.env_s, env=t.env, env_reward=t.env_reward,
        template_match=t.template_match, requests=t.requests, branches=t.branches,
        untrained_turns=t.untrained_turns, endpoint_s=t.endpoint_s, tool_errors=tool_errors(t),
    )


# A failed call's message kept in a SampleInfo, at most this long: enough to name the error on the terminal.
ERROR_CHARS = 200


def error_message(content: str) -> str | None:
    """The message of a failed call's tool message (`str({'error': message})`, as the environment workers write
    it), or None for an answer."""
    if not content.startswith("{'error':"):
        return None
    try:
        parsed = ast.literal_eval(content)
    except (ValueError, SyntaxError):  # cut to the tool-token budget: the message as far as it goes
        return content.removeprefix("{'error':").strip(" '\"")
    return str(parsed["error"]) if isinstance(parsed, dict) and set(parsed) == {"error"} else None


def tool_errors(t: Trajectory) -> tuple[str, ...]:
    """The messages of a trajectory's failed tool calls, as the model read them (each cut to ERROR_CHARS)."""
    out = []
    for m in t.messages:
        if m.get("role") == "tool" and isinstance(m.get("content"), str):
            message = error_message(m["content"])
            if message is not None:
                out.append(message[:ERROR_CHARS])
    return tuple(out)


def group_out(index: int, samples: list[Sample], put: Callable[[GroupPayload], Any], *,
              prompt_ids: Sequence[int] | None = None, images: tuple[Any, ...] = ()) -> GroupOut:
    """A finished group as a generator answers it: its SampleInfos, and its payload put with `put` (ray.put in a
    generator actor; the identity in-process)."""
    payload = GroupPayload([_arrays(s) for s in samples],
                           None if prompt_ids is None else np.asarray(prompt_ids, dtype=np.int32), tuple(images))
    return GroupOut(index, [info_of(s) for s in samples], put(payload))


def keep(payload: GroupPayload) -> GroupPayload:
    """`group_out`'s put where there is no object store (a generator in-process, the tests' fakes)."""
    return payload


# Weight loads a generator keeps its own reference to a payload for (HeldStore), beyond loop.max_staleness: a
# sample is trained before the (max_staleness + 1)-th load after the one it was generated under; one load more
# covers the completions log, which reads the step's payloads after its sync is submitted.
HOLD_LOADS = 1


class HeldStore:
    """`ray.put`, and the putter's own reference to each payload kept until `hold` weight loads later (`loaded()`
    counts them). Ray can count an object nested in a streamed item to zero before the driver's borrow reaches
    its owner (ray-project/ray PR 58082: a generator yields objects that wrap its ray.put refs, the driver passes
    them on, the reader gets ReferenceCountingAssertionError, seen here on 4,096-sample steps); the owner's own
    reference keeps every payload until no batch can train it any more, bounding the store by the same window the
    loop already holds. Thread-safe: a generator's calls run in threads of their own."""

    def __init__(self, hold: int = HOLD_LOADS):
        import threading

        self.hold, self.loads = hold, 0
        self._held: deque[tuple[int, Any]] = deque()
        self._lock = threading.Lock()

    def __call__(self, payload: GroupPayload) -> Any:
        import ray

        ref = ray.put(payload)
        with self._lock:
            self._held.append((self.loads, ref))
        return ref

    def loaded(self) -> None:
        """A weight load: payloads put `hold` loads ago are released (the batches that may train them are done)."""
        with self._lock:
            self.loads += 1
            while self._held and self._held[0][0] <= self.loads - self.hold - 1:
                self._held.popleft()

    def __len__(self) -> int:
        return len(self._held)


class Kept:
    """HeldStore's in-process stand-in: the payloads as they are (`keep`), nothing to release."""

    def __call__(self, payload: GroupPayload) -> GroupPayload:
        return payload

    def loaded(self) -> None:
        pass


def payload_store(hold: int = HOLD_LOADS) -> HeldStore | Kept:
    """How a generator keeps its payloads: in the object store (`ray.put`, each held `hold` weight loads) when it
    runs in Ray (an actor), as they are in-process."""
    import ray

    return HeldStore(hold) if ray.is_initialized() else Kept()


def fetch(payloads: Sequence[Any]) -> list[GroupPayload]:
    """The payloads themselves, in order: ObjectRefs fetched in one call, GroupPayloads as they are. PayloadLost
    naming every one that is gone."""
    refs = [(i, p) for i, p in enumerate(payloads) if not isinstance(p, GroupPayload)]
    out: list[Any] = list(payloads)
    if not refs:
        return out
    import ray
    from ray.exceptions import ObjectLostError, OwnerDiedError

    try:
        for (i, _), value in zip(refs, ray.get([p for _, p in refs]), strict=True):
            out[i] = value
        return out
    except (ObjectLostError, OwnerDiedError) as first:
        lost = []
        for i, p in refs:  # which: each on its own
            try:
                out[i] = ray.get(p)
            except (ObjectLostError, OwnerDiedError):
                lost.append(i)
        raise PayloadLost(lost, type(first).__name__) from None


def is_conversational(prompt: Any) -> bool:
    """A prompt given as chat messages (TRL's conversational format)."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def completion_of(prompt: Any, s: Sample) -> Any:
    """What reward functions see as the completion (TRL's forms): a conversation's messages (agentic), one
    assistant message for a conversational prompt, else the text."""
    if s.trajectory is not None:
        return s.trajectory.messages
    return [{"role": "assistant", "content": s.text}] if is_conversational(prompt) else s.text


def resolve_rewards(batch: RewardBatch) -> RewardBatch:
    """A reward batch with its token data fetched and laid out per completion (the batch itself when it came
    resolved). PayloadLost names the groups whose payload is gone."""
    if batch.payloads is None:
        return batch
    samples = [(p, j) for p in fetch(batch.payloads) for j in range(len(p.samples))]
    prompts = [s.trajectory.prompt if (s := p.samples[j]).trajectory is not None else q
               for (p, j), q in zip(samples, batch.prompts, strict=True)]
    return replace(
        batch, prompts=prompts,
        completions=[completion_of(q, p.samples[j]) for (p, j), q in zip(samples, batch.prompts, strict=True)],
        completion_ids=[p.samples[j].completion_ids.tolist() for p, j in samples],
        environments=[p.samples[j].trajectory.env_state for p, j in samples] if batch.keep_state else None,
        prompt_ids=[np.asarray(p.sample_prompt_ids(j)).tolist() for p, j in samples] if batch.with_prompt_ids
        else None,
        payloads=None,
    )


def reward_groups(batch: RewardBatch, groups: list[int]) -> RewardBatch:
    """The given groups of a batch by reference (its per-completion fields and its payloads), in that order."""
    idx = group_rows(groups, batch.group_size)

    def pick(xs: list[Any] | None) -> list[Any] | None:
        return None if xs is None else [xs[i] for i in idx]

    assert batch.payloads is not None
    return replace(batch, prompts=pick(batch.prompts), columns={c: pick(v) for c, v in batch.columns.items()},
                   env_rewards=pick(batch.env_rewards), env_classes=pick(batch.env_classes),
                   payloads=[batch.payloads[g] for g in groups])


def resolve_available(batch: RewardBatch) -> tuple[RewardBatch, list[bool]]:
    """`resolve_rewards` for a stage beside the workers (a judge, the teacher): what can be fetched, and per
    completion whether its group's payload is lost (its completion None, its ids empty)."""
    if batch.payloads is None:
        return batch, [False] * len(batch)
    g, groups = batch.group_size, len(batch) // batch.group_size
    kept = list(range(groups))
    while True:
        try:
            part = resolve_rewards(reward_groups(batch, kept))
            break
        except PayloadLost as err:
            kept = [x for k, x in enumerate(kept) if k not in set(err.lost)]
    where = {x: k for k, x in enumerate(kept)}

    def spread(xs: list[Any] | None, lost: Callable[[int], Any]) -> list[Any] | None:
        """Per completion i: the resolved part's value, or lost(i) where its group is lost."""
        if xs is None:
            return None
        return [xs[where[i // g] * g + i % g] if i // g in where else lost(i) for i in range(len(batch))]

    resolved = replace(batch, prompts=spread(part.prompts, batch.prompts.__getitem__),
                       completions=spread(part.completions, lambda i: None),
                       completion_ids=spread(part.completion_ids, lambda i: []),
                       prompt_ids=spread(part.prompt_ids, lambda i: []),
                       environments=spread(part.environments, lambda i: None), payloads=None)
    return resolved, [i // g not in where for i in range(len(batch))]


def with_lost(scores: Scores | None, names: list[str], kept: list[int], num_groups: int, group_size: int,
              global_step: int, worker: int) -> Scores:
    """A chunk's scores over all its `num_groups` groups, from those of its `kept` groups (`scores`; None: none
    kept): a lost group's samples NaN under every reward, None in every logged column, flagged in `lost`."""
    where = {g: k for k, g in enumerate(kept)}
    n = num_groups * group_size

    def spread(column: list[Any], empty: Any) -> list[Any]:
        return [column[where[i // group_size] * group_size + i % group_size] if i // group_size in where else empty
                for i in range(n)]

    lost = [i // group_size not in where for i in range(n)]
    if scores is None:
        return Scores(names=names, scores=[[math.nan] * n for _ in names], timeouts=dict.fromkeys(names, 0),
                      errors=dict.fromkeys(names, 0), latency_s=dict.fromkeys(names, 0.0), metrics={}, extra={},
                      global_step=global_step, workers=[worker], lost=lost)
    return replace(scores, scores=[spread(c, math.nan) for c in scores.scores],
                   extra={c: spread(v, None) for c, v in scores.extra.items()},
                   skipped={r: spread(v, False) for r, v in scores.skipped.items()}, lost=lost)


def resolve_training(batch: TrainBatch) -> TrainBatch:
    """A train batch with its token data fetched (and the teacher's log-probs), laid out per completion as the
    learner reads it (the batch itself when it came resolved). PayloadLost names the groups whose payload is gone."""
    if batch.payloads is None:
        return batch
    groups = fetch(batch.payloads)
    samples = [(p, j) for p in groups for j in range(len(p.samples))]
    agentic = samples[0][0].samples[0].trajectory is not None
    teacher = None
    if batch.teacher is not None:
        teacher = [[] if lp is None else np.asarray(lp).tolist() for g in fetch_values(batch.teacher) for lp in g]
    routes = [p.samples[j].routes for p, j in samples]
    versions = [p.samples[j].versions for p, j in samples]
    images = [p.sample_images(j) for p, j in samples]
    return replace(
        batch,
        prompt_ids=[np.asarray(p.sample_prompt_ids(j)).tolist() for p, j in samples],
        completion_ids=[p.samples[j].completion_ids.tolist() for p, j in samples],
        sampling_logprobs=[p.samples[j].logprobs.tolist() for p, j in samples],
        completion_mask=[p.samples[j].trajectory.mask for p, j in samples] if agentic else None,
        routes=routes if any(r is not None for r in routes) else None,
        images=images if any(images) else None,
        teacher_logprobs=teacher, payloads=None, teacher=None,
        versions=([None if v is None else v.tolist() for v in versions] if any(v is not None for v in versions)
                  else None),
    )


def fetch_values(refs: Sequence[Any]) -> list[Any]:
    """Values by reference that are not payloads (the teacher's log-probs), fetched in one call; as they are where
    they are not ObjectRefs. PayloadLost naming the ones that are gone."""
    import ray

    if not any(isinstance(r, ray.ObjectRef) for r in refs):
        return list(refs)
    from ray.exceptions import ObjectLostError, OwnerDiedError

    try:
        return [v for v in ray.get(list(refs))]
    except (ObjectLostError, OwnerDiedError) as err:
        raise PayloadLost(list(range(len(refs))), type(err).__name__) from None


def token_record(batch: TrainBatch, i: int, learner_logprobs: list[float]) -> dict[str, Any]:
    """Row i of a resolved batch token by token, with the learner's log-probs (TrainResult.token_records): ids,
    sampling log-probs, learner log-probs, loss mask (None: every token), policy versions (None: not recorded)."""
    return {"ids": list(batch.completion_ids[i]), "logprobs": list(batch.sampling_logprobs[i]),
            "learner_logprobs": learner_logprobs,
            "mask": None if batch.completion_mask is None else list(batch.completion_mask[i]),
            "versions": None if batch.versions is None or batch.versions[i] is None else list(batch.versions[i])}


__all__ = [
    "PayloadLost", "completion_of", "error_message", "fetch", "fetch_values", "group_out", "info_of",
    "is_conversational", "keep", "payload_store", "resolve_available", "resolve_rewards", "resolve_training",
    "reward_groups", "token_record", "tool_errors", "with_lost",
]
