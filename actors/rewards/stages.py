"""The reward pool's stages beside its workers, chosen when the pool is built (RewardPool.__init__): the judge
stage (judge rewards, answered by their judge pools: actors/engines/pool.py) and the distillation teacher's
stage (the teacher pool's log-probs of every sample's completion).

A stage's `begin(batch)` starts its pools' batch with the pool's (their autoscalers' cycles are steps, not
chunks) and returns the stage's run over that batch (None: the batch is none of its business), which the pool
calls as the batch goes:

    arrived(chunks)        the batch's chunks are cut: what needs no reward's result starts now (the teacher)
    scored(chunk, scores)  a chunk's worker rewards are in: what reads them starts (the judges, their gates)
    wait()                 every chunk is scored: what must end before the merge (the judges' columns)
    cancel()               the batch failed (or a judge raised, on_error: raise): what still runs is not
                           awaited
    merge(merged)          the batch's scores, merged: the stage's answers and its pools' stats into them
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Protocol

import numpy as np

from actors.engines.judge import JudgeAnswer, JudgeRequest, request_fields, template_fields
from actors.engines.teacher import TeacherAnswer, TeacherRequest
from actors.payloads import payload_store, resolve_available
from actors.rewards.worker import RewardFunctionError, RewardSpec, preview
from actors.types import RewardBatch, Scores


class StageRun(Protocol):
    """One stage over one batch (the module docstring)."""

    def arrived(self, chunks: list[RewardBatch]) -> None: ...

    def scored(self, chunk: RewardBatch, scores: Scores) -> None: ...

    async def wait(self) -> None: ...

    def cancel(self) -> None: ...

    async def merge(self, merged: Scores) -> None: ...


class Stage(Protocol):
    """A stage beside the pool's workers, for the pool's life (the module docstring)."""

    async def begin(self, batch: RewardBatch) -> StageRun | None: ...


# --- judges -----------------------------------------------------------------------------------------------


class JudgeStage:
    """Judge rewards: each scored chunk's judge columns filled in place, wave after wave."""

    def __init__(self, specs: list[RewardSpec], judges: dict[str, Any]) -> None:
        """judges: per judge reward (a spec with `judge`), the handle of its judge pool."""
        self.judges = judges
        judged = [s for s in specs if s.judge is not None]
        # The order: a judge lazily gated on another judge waits for that one (gating rewards are ungated, so
        # two waves cover every chain).
        names = {s.name for s in judged}
        later = [s for s in judged if s.lazy_gate is not None and s.lazy_gate.reward in names]
        self.waves = [w for w in ([s for s in judged if s not in later], later) if w]
        self.fields = {s.name: template_fields(s.judge.template) for s in judged if s.judge is not None}

    async def begin(self, batch: RewardBatch) -> _JudgeRun:
        await asyncio.gather(*(h.begin_batch.remote() for h in self.judges.values()))
        return _JudgeRun(self)

    async def judge_chunk(self, chunk: RewardBatch, scores: Scores) -> None:
        """A scored chunk's judge stage: each judge reward's column filled in place, wave after wave. A chunk by
        reference is fetched here (the judges read its text); a lost group's samples are not judged."""
        chunk, lost = await asyncio.to_thread(resolve_available, chunk)
        for wave in self.waves:
            await asyncio.gather(*(self._judge_reward(spec, chunk, scores, lost) for spec in wave))

    async def _judge_reward(self, spec: RewardSpec, chunk: RewardBatch, scores: Scores, lost: list[bool]) -> None:
        """One judge reward on one chunk: its judge pool answers the chunk's samples (a lazily gated judge's
        open samples only: the gate reads the chunk's gating column as the driver will); an answer's score, or
        by the reward's policy for a timeout (fallback) or an error (on_error). The judge's text goes to the
        completions log as `judge/<reward>`."""
        n, name = len(chunk), spec.name
        gate = spec.lazy_gate
        closed = [False] * n if gate is None else gate.closed(scores.scores[scores.names.index(gate.reward)])
        rows = [j for j in range(n) if not closed[j] and not lost[j]]
        fields = self.fields[name]
        requests = [JudgeRequest(request_fields(fields, chunk.prompts[j], chunk.completions[j],
                                                {c: v[j] for c, v in chunk.columns.items() if c in fields}))
                    for j in rows]
        answers: list[JudgeAnswer] = []
        if requests:
            answers = await self.judges[name].judge.remote(requests, part=True)
        fallback = math.nan if spec.fallback is None else float(spec.fallback)
        column, texts = [math.nan] * n, [None] * n
        for j, a in zip(rows, answers, strict=True):
            texts[j] = a.text
            if a.status == "ok":
                column[j] = math.nan if a.value is None else a.value
            elif a.status == "timeout":
                column[j] = fallback
                scores.timeouts[name] += 1
            elif spec.on_error == "fallback":
                column[j] = fallback
                scores.errors[name] += 1
            else:
                raise _judge_error(spec, chunk, j, a)
        scores.scores[scores.names.index(name)] = column
        scores.latency_s[name] = max((a.seconds for a in answers), default=0.0)
        scores.extra[f"judge/{name}"] = texts
        if gate is not None:
            scores.skipped[name] = closed


def _judge_error(spec: RewardSpec, chunk: RewardBatch, j: int, answer: JudgeAnswer) -> RewardFunctionError:
    """A judge's error answer under on_error "raise", naming the reward and the sample."""
    sample = chunk.offset + j
    err = RewardFunctionError(f"reward {spec.name!r} (judge {spec.judge.model if spec.judge else '?'}) on "
                              f"sample {sample}: {answer.error}", reward=spec.name, sample=sample,
                              error=answer.error)
    err.prompt, err.completion = preview(chunk.prompts[j]), preview(chunk.completions[j])
    return err


class _JudgeRun:
    """The judge stage over one batch: a task per scored chunk, judged while the batch's other chunks are
    still being scored."""

    def __init__(self, stage: JudgeStage) -> None:
        self.stage = stage
        self.tasks: list[asyncio.Task[None]] = []

    def arrived(self, chunks: list[RewardBatch]) -> None:
        """Judges read the rewards: nothing starts before a chunk is scored."""

    def scored(self, chunk: RewardBatch, scores: Scores) -> None:
        if self.stage.waves:
            self.tasks.append(asyncio.ensure_future(self.stage.judge_chunk(chunk, scores)))

    async def wait(self) -> None:
        await asyncio.gather(*self.tasks)

    def cancel(self) -> None:
        """A judge that raised (on_error: raise), or the batch failed: the others' answers are not awaited."""
        for t in self.tasks:
            t.cancel()

    async def merge(self, merged: Scores) -> None:
        stats = await asyncio.gather(*(h.stats.remote() for h in self.stage.judges.values()))
        merged.judge_pools = dict(zip(self.stage.judges, stats, strict=True))


# --- the distillation teacher ---------------------------------------------------------------------------


class TeacherStage:
    """The distillation teacher: a training batch's samples scored by its pool (its log-probs of their
    completion tokens), each chunk from its arrival, while the rewards run."""

    def __init__(self, teacher: Any) -> None:
        """teacher: the teacher pool's handle (a TeacherPool's)."""
        self.teacher = teacher

    async def begin(self, batch: RewardBatch) -> _TeacherRun | None:
        if batch.prompt_ids is None and not batch.with_prompt_ids:  # an eval's batch (no ids): not the teacher's
            return None
        await self.teacher.begin_batch.remote()
        return _TeacherRun(self.teacher, batch.group_size)


class _TeacherRun:
    def __init__(self, teacher: Any, group_size: int) -> None:
        self.teacher, self.group_size = teacher, group_size
        self.tasks: list[asyncio.Task[list[TeacherAnswer]]] = []

    def arrived(self, chunks: list[RewardBatch]) -> None:
        self.tasks = [asyncio.ensure_future(self._teach(c)) for c in chunks]

    async def _teach(self, chunk: RewardBatch) -> list[TeacherAnswer]:
        """A chunk's samples scored by the teacher: it needs no reward's result. A chunk by reference is fetched
        here (the teacher reads its ids); a lost group's samples get no answer (the driver replaces them)."""
        chunk, lost = await asyncio.to_thread(resolve_available, chunk)
        assert chunk.prompt_ids is not None
        rows = [j for j in range(len(chunk)) if not lost[j]]
        requests = [TeacherRequest(chunk.prompt_ids[j], chunk.completion_ids[j]) for j in rows]
        answers = await self.teacher.logprobs.remote(requests, part=True) if requests else []
        out = [TeacherAnswer("error", error="payload lost")] * len(chunk)
        for j, a in zip(rows, answers, strict=True):
            out[j] = a
        return out

    def scored(self, chunk: RewardBatch, scores: Scores) -> None:
        """The teacher reads no reward."""

    async def wait(self) -> None:
        """Its answers are awaited at the merge: the rewards need none of them."""

    def cancel(self) -> None:
        for t in self.tasks:
            t.cancel()

    async def merge(self, merged: Scores) -> None:
        """The teacher's answers into the batch's scores: its log-probs by reference, one object per group (a list
        of its samples' float32 arrays, None where it gave none, counted), which the learner fetches; and its
        pool's state. Owned by the pool: they live while the run does, freed once the step is trained."""
        answers = [a for chunk in await asyncio.gather(*self.tasks) for a in chunk]
        g, put = self.group_size, payload_store()
        merged.teacher = [
            put([np.asarray(a.logprobs, dtype=np.float32) if a.status == "ok" else None for a in answers[lo:lo + g]])
            for lo in range(0, len(answers), g)
        ]
        merged.teacher_failures = sum(a.status != "ok" for a in answers)
        merged.teacher_pool = await self.teacher.stats.remote()


def reward_stages(specs: list[RewardSpec], judges: dict[str, Any] | None, teacher: Any) -> list[Stage]:
    """The pool's stages, in the order their results merge: the judges' (judges: per judge reward, its judge
    pool's handle), the teacher's (teacher: its pool's handle, or None)."""
    judges = dict(judges or {})
    missing = [s.name for s in specs if s.judge is not None and s.name not in judges]
    if missing:
        raise ValueError(f"judge rewards {missing} have no judge pool")
    stages: list[Stage] = [JudgeStage(specs, judges)] if judges else []
    return stages + ([TeacherStage(teacher)] if teacher is not None else [])


__all__ = ["JudgeStage", "Stage", "StageRun", "TeacherStage", "reward_stages"]
