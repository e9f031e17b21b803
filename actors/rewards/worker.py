"""RewardWorker: calls a run's reward functions on chunks of completions, exactly as TRL's GRPOTrainer does.

A plain class (no Ray import): `actors.rewards.pool.RewardPool` makes it a Ray actor. Each reward function
keeps TRL 1.16's signature:

    fn(prompts=[...], completions=[...], completion_ids=[[...]], <dataset columns>=[...],
       trainer_state=TrainerState, log_extra=fn, log_metric=fn, **kwargs) -> list[float | None]

sync or `async def`. Unlike TRL, every call has a time bound and an error policy, and by default each
completion is scored by its own call so a slow or failing sample cannot take its neighbours with it. The calls
run where actors/user_code.py runs the user's code: sync ones in a thread pool, async ones on one event loop.

Agentic runs (actors/envs): a function that declares an `environments` parameter also receives its samples'
environment instances (TRL's `environments=`), unpickled from RewardBatch.environments here; and an
environment's get_reward() is a reward of its own (`RewardSpec.env_reward`), named after the class, whose
values the environments computed at close and the batch carries (RewardBatch.env_rewards).
"""

from __future__ import annotations

import inspect
import math
import os
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors import user_code
from actors.engines.judge import JudgeSpec
from actors.payloads import PayloadLost, resolve_rewards, reward_groups, with_lost
from actors.types import RewardBatch, Scores, TrainerState
from actors.user_code import Outcome, Pending, Raised, TimedOut, UserCalls

# Threads for sync reward calls of one chunk: enough that every per-sample call of a chunk starts at once
# (so its timeout is measured from its own start), small enough to stay cheap when idle.
SYNC_CALL_THREADS = 64


# Characters of a sample's prompt and completion an error keeps (the driver shortens them further to show).
PREVIEW_CHARS = 200
# The user's frames an error keeps, innermost last (a deep recursion would otherwise fill the screen).
MAX_USER_FRAMES = 8


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something unusable; the message names the reward and sample.

    Besides the one-line message it carries what the driver shows the user, as plain data (it crosses Ray
    pickled, where tracebacks do not survive): `reward`, `sample` (index in the step's batch, or the first of a
    batched call's samples), `prompt` / `completion` (their start), `error` ("ValueError: verifier exploded",
    or what was wrong with the return value), `frames` (the reward's own frames: (file, line, function, source)),
    `defined_at` (file:line of the function, for a bad return value) and `traceback` (all of it, for --debug).
    """

    def __init__(
        self,
        message: str,
        *,
        reward: str | None = None,
        sample: int | None = None,
        error: str | None = None,
        frames: list[tuple[str, int, str, str]] | None = None,
        traceback: str | None = None,
    ):
        super().__init__(message)  # args == (message,): pickles and unpickles through Ray unchanged
        self.reward, self.sample, self.error = reward, sample, error
        self.frames = list(frames or [])
        self.traceback = traceback
        self.prompt: str | None = None
        self.completion: str | None = None
        self.defined_at: str | None = None


@dataclass(frozen=True)
class RewardSpec:
    """What a worker needs to know about one reward (a plain copy of the config's RewardConfig)."""

    name: str
    function: str | None = None
    model: str | None = None
    timeout_s: float = 60.0
    on_error: str = "raise"
    fallback: float | None = 0.0
    batched: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)
    env_reward: bool = False  # the get_reward() of the environment class named `name` (no function, no model): its
    # samples' RewardBatch.env_rewards, NaN for other environments' samples; one that is missing (get_reward
    # failed, the session was lost) scores `fallback` and counts as an error (give on_error "fallback")
    takes_environments: bool = False  # the function declares `environments` (set by the driver, which imports it:
    # the generators then keep each environment's state at close); the worker reads the signature itself
    columns: tuple[str, ...] = ()  # the dataset columns the function needs (required_columns; set by the driver,
    # which checks the data has them before anything starts)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # a reward model's chat template's
    # (generation.chat_template_kwargs: the template renders prompt + completion as the policy's rendered them)
    lazy_gate: LazyGate | None = None  # gate.lazy: called only on the samples whose gate is open
    judge: JudgeSpec | None = None  # an LLM judge (rewards[].judge): scored by the reward pool's judge stage on
    # the judge's engines, never by a worker (its column is NaN in a worker's Scores)


@dataclass(frozen=True)
class LazyGate:
    """A lazily gated reward's gate (gate.lazy): closed where the gating reward is below the threshold, compared
    as the driver's gates compare (orchestrator/algo/aggregation.py apply_gates: float32, NaN leaves it open)."""

    reward: str  # the gating reward (not itself gated)
    threshold: float

    def closed(self, gating: list[float]) -> list[bool]:
        import torch

        return (torch.tensor(gating, dtype=torch.float32) < self.threshold).tolist()


@dataclass
class RewardResult:
    """One reward's outcome on one chunk."""

    scores: list[float]  # [n]: NaN where the reward had no opinion (None) or timed out without a fallback
    timeouts: int  # calls cut at the reward's timeout
    errors: int  # calls that raised (under on_error: fallback)
    latency_s: float  # from the first call's start to the last one's end


def load_reward_function(spec: RewardSpec) -> Callable[..., Any]:
    """Import `module:callable` or `path/to/file.py:callable` (and call it with spec.kwargs if given)."""
    try:
        fn = user_code.import_object(spec.function or "", f"reward {spec.name!r}: function")
    except user_code.UserCodeError as err:
        raise RewardFunctionError(str(err)) from None
    if spec.kwargs:
        fn = fn(**spec.kwargs)
    if not callable(fn):
        raise RewardFunctionError(f"reward {spec.name!r}: {user_code.describe(spec.function or '')} is not callable")
    return fn


# What TRL passes every reward function besides the dataset's columns (a parameter of another name is a column).
TRL_ARGUMENTS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                           "environments"})


def required_columns(fn: Any) -> list[str]:
    """The dataset columns a reward function cannot run without: its parameters without a default that TRL does not
    pass itself (TRL's `accuracy_reward(completions, solution, **kwargs)` needs `solution`). [] for a callable
    whose signature cannot be read."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is p.empty and p.name not in TRL_ARGUMENTS
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def declares_environments(fn: Any) -> bool:
    """Whether a reward function (or callable object) names an `environments` parameter: it then receives its
    samples' environment instances, as TRL passes them."""
    try:
        return "environments" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class _EnvReward:
    """An environment's get_reward() as a reward function: the values the environment workers computed at close,
    for the samples of the environment class `name`; None (NaN) for other environments' samples."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, env_rewards: list[float | None], env_classes: list[str | None] | None, **_: Any) -> list[Any]:
        classes = env_classes or [None] * len(env_rewards)
        out: list[float | None] = []
        for reward, cls in zip(env_rewards, classes, strict=True):
            if cls != self.name:
                out.append(None)
            elif reward is None:
                raise RuntimeError(f"no get_reward() value: {self.name}.get_reward() failed, or its session was lost")
            else:
                out.append(reward)
        return out


class _RewardModel:
    """A sequence-classification reward model scored on prompt + completion, as TRL does (logits[:, 0])."""

    def __init__(self, path: str, chat_template_kwargs: dict[str, Any] | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self._torch = torch
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # the RM reads the last non-pad token

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        if prompts and isinstance(prompts[0], list):  # conversational: chat template over prompt + completion
            texts = [
                self.tokenizer.apply_chat_template(p + c, tokenize=False, **self.template_kwargs)
                for p, c in zip(prompts, completions, strict=True)
            ]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        enc = self.tokenizer(
            texts, padding=True, padding_side="right", add_special_tokens=False, return_tensors="pt"
        )
        with self._torch.inference_mode():
            return self.model(**enc).logits[:, 0].float().tolist()


def _validate(name: str, out: Any, n: int, offset: int) -> list[float]:
    """TRL's return contract: a list of n numbers or None (None and NaN both mean "no opinion" -> NaN)."""

    def bad(message: str, error: str, sample: int = offset) -> RewardFunctionError:
        return RewardFunctionError(message, reward=name, sample=sample, error=error)

    if inspect.isawaitable(out):
        raise bad(f"reward {name!r} returned an un-awaited coroutine", "returned an un-awaited coroutine")
    if not isinstance(out, (list, tuple)) and not hasattr(out, "tolist"):
        what = f"returned {type(out).__name__}, expected a list of {n} numbers"
        raise bad(f"reward {name!r} {what}", what)
    values = out.tolist() if hasattr(out, "tolist") else list(out)
    if len(values) != n:
        what = f"returned {len(values)} values for {n} completions"
        raise bad(f"reward {name!r} {what} (samples {offset}..{offset + n - 1})", what)
    clean = []
    for j, v in enumerate(values):
        if v is None:
            clean.append(math.nan)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise bad(
                f"reward {name!r} returned {v!r} ({type(v).__name__}) for sample {offset + j}, "
                "expected a number or None",
                f"returned {v!r} ({type(v).__name__}), expected a number or None", offset + j,
            ) from None
        if math.isinf(f):
            raise bad(f"reward {name!r} returned {f} for sample {offset + j}; rewards must be finite",
                      f"returned {f}; rewards must be finite", offset + j)
        clean.append(f)
    return clean


class RewardWorker:
    """Scores chunks of completions with every reward of the run. Thread-safe: the pool may send it several
    chunks at once (Ray max_concurrency > 1)."""

    def __init__(
        self,
        specs: list[RewardSpec],
        *,
        index: int = 0,
        trainer_state: TrainerState | None = None,
        sys_path: list[str] | None = None,
    ):
        user_code.add_to_sys_path(sys_path)  # the user's run directory: `my_rewards:fn` imports as with python -m
        self.index = index
        self.specs = list(specs)
        self.functions = [
            None if s.judge else _EnvReward(s.name) if s.env_reward
            else _RewardModel(s.model, s.chat_template_kwargs) if s.model else load_reward_function(s)
            for s in self.specs
        ]
        # What each function gets beyond TRL's arguments: environment instances, or environment rewards.
        self.extras = [
            ("env_rewards",) if s.env_reward else ("environments",) if declares_environments(f) else ()
            for s, f in zip(self.specs, self.functions, strict=True)
        ]
        self.state = trainer_state or TrainerState()
        self.state.to_transformers()  # import transformers now (seconds), while the engines start, not at step 1
        self.calls = UserCalls("reward-call", SYNC_CALL_THREADS)

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        return f"RewardWorker(index={self.index}, rewards={[s.name for s in self.specs]})"

    def pid(self) -> int:
        return os.getpid()

    def set_state(self, state: TrainerState) -> int:
        """The learner's push after each optimizer step (via the pool)."""
        self.state = state
        return state.global_step

    def score(self, chunk: RewardBatch, state: TrainerState | None = None) -> Scores:
        """Score one chunk (its `offset` names samples in error messages). Returns per-reward scores (NaN =
        None), counts of timeouts/errors, user metrics and log_extra columns, latency per reward. A chunk by
        reference is fetched first (its groups' text and ids from the object store); a group whose payload is
        gone is scored NaN and flagged (Scores.lost), the others as usual."""
        if state is not None:
            self.state = state
        try:
            chunk = resolve_rewards(chunk)
        except PayloadLost as err:  # its generator or node is gone: the rest scored, those flagged for the driver
            kept = [g for g in range(len(chunk) // chunk.group_size) if g not in set(err.lost)]
            scored = self.score(reward_groups(chunk, kept)) if kept else None
            return with_lost(scored, [s.name for s in self.specs], kept, len(chunk) // chunk.group_size,
                             chunk.group_size, self.state.global_step, self.index)
        ctx = _Chunk(chunk, self.state.to_transformers())
        self._check_env_inputs(ctx)
        ks = range(len(self.specs))
        names = [s.name for s in self.specs]
        judged = [k for k in ks if self.specs[k].judge is not None]  # the pool's judge stage scores them
        eager = [k for k in ks if self.specs[k].lazy_gate is None and k not in judged]
        started = {k: self._start(k, ctx) for k in eager}  # every call of every eager reward at once
        per_reward = {k: self._collect(k, started[k], ctx) for k in eager}
        per_reward.update({k: RewardResult([math.nan] * ctx.n, 0, 0, 0.0) for k in judged})
        # Lazily gated rewards after their gating rewards (ungated, so eager): on the open samples only.
        skipped: dict[str, list[bool]] = {}
        lazy = [k for k in ks if self.specs[k].lazy_gate is not None and k not in judged]
        for k in lazy:
            gate = self.specs[k].lazy_gate
            assert gate is not None
            skipped[names[k]] = gate.closed(per_reward[names.index(gate.reward)].scores)
        started = {k: self._start(k, ctx, skip=skipped[names[k]]) for k in lazy}
        per_reward.update({k: self._collect(k, started[k], ctx) for k in lazy})
        return Scores(
            names=names,
            scores=[per_reward[k].scores for k in ks],  # [K][n]
            timeouts={names[k]: per_reward[k].timeouts for k in ks},
            errors={names[k]: per_reward[k].errors for k in ks},
            latency_s={names[k]: per_reward[k].latency_s for k in ks},
            metrics=dict(ctx.metrics),
            extra=dict(ctx.extra),
            global_step=self.state.global_step,
            workers=[self.index],
            skipped=skipped,
        )

    def _check_env_inputs(self, ctx: _Chunk) -> None:
        """Environment rewards need the batch's values; `environments` functions get the instances unpickled once
        per chunk (a class that cannot be imported here fails naming the reward)."""
        for spec, extras in zip(self.specs, self.extras, strict=True):
            if "env_rewards" in extras and ctx.chunk.env_rewards is None:
                raise RewardFunctionError(
                    f"reward {spec.name!r} is the get_reward() of environment {spec.name}, but the batch carries no "
                    "environment rewards (RewardBatch.env_rewards)", reward=spec.name, sample=ctx.offset,
                )
        wanting = [s.name for s, e in zip(self.specs, self.extras, strict=True) if "environments" in e]
        if wanting and ctx.chunk.environments is not None:
            ctx.unpickle_environments(wanting[0])

    def score_chunks(self, chunks: list[RewardBatch], state: TrainerState | None = None) -> list[Scores]:
        """Score several chunks one after another in one call (the pool batches chunks to save Ray calls)."""
        return [self.score(c, state) for c in chunks]

    def _start(self, k: int, ctx: _Chunk, skip: list[bool] | None = None) -> list[tuple[int, int, Pending]]:
        """Start every call of reward k on the chunk: (lo, hi, the call) per span of samples; skip: per sample,
        not called (a lazily gated reward's closed samples; its spans are single samples)."""
        fn, spec, extras = self.functions[k], self.specs[k], self.extras[k]
        return [(lo, hi, self.calls.start(fn, ctx.kwargs(lo, hi, extras), spec.timeout_s))
                for lo, hi in ctx.spans(spec) if skip is None or not skip[lo]]

    def _collect(self, k: int, calls: list[tuple[int, int, Pending]], ctx: _Chunk) -> RewardResult:
        """Wait for each call up to its own deadline (its start + the reward's timeout); samples no call covers
        (skipped) score NaN."""
        scores = [math.nan] * ctx.n
        timeouts = errors = 0
        t0, t_end = calls[0][2].started if calls else time.monotonic(), 0.0
        for lo, hi, pending in calls:
            outcome = self.calls.outcome(pending)
            vals, status = self._values(k, outcome, ctx, lo, hi)
            scores[lo:hi] = vals
            timeouts += status == "timeout"
            errors += status == "error"
            t_end = max(t_end, outcome.ended)
        return RewardResult(scores, timeouts, errors, max(t_end - t0, 0.0))

    def _values(self, k: int, outcome: Outcome, ctx: _Chunk, lo: int, hi: int) -> tuple[list[float], str]:
        """One call's scores and status ("ok", "timeout", "error"); RewardFunctionError under on_error: raise."""
        spec, fn = self.specs[k], self.functions[k]
        if isinstance(outcome, TimedOut):
            return _fallback(spec, hi - lo), "timeout"
        if isinstance(outcome, Raised):
            return _on_error(spec, fn, outcome.error, ctx, lo, hi), "error"
        try:
            return _validate(spec.name, outcome.value, hi - lo, ctx.offset + lo), "ok"
        except RewardFunctionError as err:  # a bad return value, under the same on_error policy
            return _on_error(spec, fn, err, ctx, lo, hi), "error"


def _fallback(spec: RewardSpec, n: int) -> list[float]:
    return [math.nan if spec.fallback is None else float(spec.fallback)] * n


def _on_error(spec: RewardSpec, fn: Any, err: Exception, ctx: _Chunk, lo: int, hi: int) -> list[float]:
    """The fallback values under `on_error: fallback`; otherwise the error, naming reward and samples."""
    if spec.on_error == "fallback":
        return _fallback(spec, hi - lo)
    raise _explained(spec, fn, err, ctx, lo, hi)


def _explained(spec: RewardSpec, fn: Any, err: Exception, ctx: _Chunk, lo: int, hi: int) -> RewardFunctionError:
    """The RewardFunctionError the user sees: reward, sample, the start of its prompt and completion, and the
    reward's own frames (where it raised) or where it is defined (when its return value was wrong)."""
    n, offset = hi - lo, ctx.offset + lo
    if isinstance(err, RewardFunctionError):  # a bad return value (_validate): nothing of the user's raised
        out = err
        out.defined_at = _defined_at(fn)
    else:
        where = f"sample {offset}" if n == 1 else f"samples {offset}..{offset + n - 1}"
        error = f"{type(err).__name__}: {err}"
        out = RewardFunctionError(
            f"reward {spec.name!r} raised on {where}: {error}", reward=spec.name, sample=offset, error=error,
            frames=_reward_frames(err), traceback="".join(traceback.format_exception(err)),
        )
    i = (out.sample if out.sample is not None else offset) - ctx.offset
    if 0 <= i < ctx.n:
        out.prompt = preview(ctx.chunk.prompts[i])
        out.completion = preview(ctx.chunk.completions[i])
    return out


def preview(x: Any) -> str:
    """The start of a prompt or completion: plain text, or the last message's content of a conversation."""
    if isinstance(x, list) and x and isinstance(x[-1], dict):
        x = x[-1].get("content", "")
    text = x if isinstance(x, str) else repr(x)
    return text[:PREVIEW_CHARS]


def _defined_at(fn: Any) -> str | None:
    """file:line of a reward function (or of a callable object's __call__), for errors in its return value."""
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    code = getattr(inspect.unwrap(target), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


_THIS_FILE = os.path.abspath(__file__)


def _reward_frames(err: Exception) -> list[tuple[str, int, str, str]]:
    """The reward's own frames (user_code.user_frames), without this file's (an environment's reward is called
    through _EnvReward here): (file, line, function, source), innermost last."""
    own = [f for f in user_code.user_frames(err) if os.path.abspath(f.filename) != _THIS_FILE]
    return [(f.filename, f.lineno or 0, f.name, (f.line or "").strip()) for f in own[-MAX_USER_FRAMES:]]


class _Chunk:
    """One chunk's inputs and the log_metric / log_extra sinks its reward calls share."""

    def __init__(self, chunk: RewardBatch, trainer_state: Any):
        self.chunk = chunk
        self.n, self.offset = len(chunk), chunk.offset
        self.trainer_state = trainer_state
        self.metrics: dict[str, list[float]] = defaultdict(list)
        # log_extra columns, one value per sample of the chunk (None where no call logged one)
        self.extra: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        self.environments: list[Any] | None = None  # unpickled RewardBatch.environments (unpickle_environments)

    def unpickle_environments(self, reward: str) -> None:
        from ray import cloudpickle  # the environment workers pickled them with it

        try:
            self.environments = [None if b is None else cloudpickle.loads(b) for b in self.chunk.environments or []]
        except Exception as err:  # noqa: BLE001 - named for the user: the class must import in the reward workers
            raise RewardFunctionError(
                f"reward {reward!r}: cannot unpickle the environments of samples "
                f"{self.offset}..{self.offset + self.n - 1}"
                f" ({type(err).__name__}: {err}); the environment class must be importable in the reward workers",
                reward=reward, sample=self.offset, error=f"{type(err).__name__}: {err}",
            ) from None

    def log_metric(self, name: str, value: float) -> None:
        with self._lock:
            self.metrics[name].append(float(value))

    def log_extra_at(self, lo: int, hi: int) -> Callable[[str, list[Any]], None]:
        """log_extra for the call on samples [lo, hi): its values land on those samples' rows, whatever order
        the concurrent calls finish in."""

        def log_extra(column: str, values: list[Any]) -> None:
            with self._lock:
                self.extra.setdefault(column, [None] * self.n)[lo : lo + len(values[: hi - lo])] = values[: hi - lo]

        return log_extra

    def spans(self, spec: RewardSpec) -> list[tuple[int, int]]:
        """[lo, hi) per call: one sample (default), one group (batched), or the whole chunk (reward model)."""
        unit = self.n if spec.model else self.chunk.group_size if spec.batched else 1
        return [(lo, min(lo + unit, self.n)) for lo in range(0, self.n, unit)]

    def kwargs(self, lo: int, hi: int, extras: tuple[str, ...] = ()) -> dict[str, Any]:
        """TRL's reward call: dataset columns, prompts, completions, completion_ids, trainer_state, log hooks; and
        `extras`: "environments" (the instances, when the batch has them, as TRL passes them only with an
        environment_factory) or "env_rewards" (with env_classes, for an environment's own reward)."""
        c = self.chunk
        kw = {name: vals[lo:hi] for name, vals in c.columns.items()}
        kw.update(
            prompts=c.prompts[lo:hi],
            completions=c.completions[lo:hi],
            completion_ids=c.completion_ids[lo:hi],
            trainer_state=self.trainer_state,
            log_extra=self.log_extra_at(lo, hi),
            log_metric=self.log_metric,
        )
        if "environments" in extras and self.environments is not None:
            kw["environments"] = self.environments[lo:hi]
        if "env_rewards" in extras:
            kw["env_rewards"] = (c.env_rewards or [])[lo:hi]
            kw["env_classes"] = None if c.env_classes is None else c.env_classes[lo:hi]
        return kw

