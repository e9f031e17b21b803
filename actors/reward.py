"""RewardWorker: calls a run's reward functions on chunks of completions, exactly as TRL's GRPOTrainer does.

A plain class (no Ray import): `actors.reward_pool.RewardPool` makes it a Ray actor. Each reward function
keeps TRL 1.16's signature:

    fn(prompts=[...], completions=[...], completion_ids=[[...]], <dataset columns>=[...],
       trainer_state=TrainerState, log_extra=fn, log_metric=fn, **kwargs) -> list[float | None]

sync or `async def`. Unlike TRL, every call has a time bound and an error policy, and by default each
completion is scored by its own call so a slow or failing sample cannot take its neighbours with it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Threads for sync reward calls of one chunk: enough that every per-sample call of a chunk starts at once
# (so its timeout is measured from its own start), small enough to stay cheap when idle.
SYNC_CALL_THREADS = 64


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something unusable; the message names the reward and sample."""


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


def load_reward_function(spec: RewardSpec) -> Callable[..., Any]:
    """Import `module:callable` or `path/to/file.py:callable` (and call it with spec.kwargs if given)."""
    target = spec.function or ""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise RewardFunctionError(
            f"reward {spec.name!r}: function {target!r} is not of the form module:callable"
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            mod_spec = importlib.util.spec_from_file_location(f"rayward_user_{path.stem}", path)
            if mod_spec is None or mod_spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the user's to see, with the reward named
        raise RewardFunctionError(
            f"reward {spec.name!r}: cannot import {module_name!r} ({type(err).__name__}: {err}); "
            f"the module must be importable from the directory you run rayward from ({os.getcwd()})"
        ) from err
    fn = getattr(module, attr, None)
    if fn is None:
        raise RewardFunctionError(f"reward {spec.name!r}: module {module_name!r} has no attribute {attr!r}")
    if spec.kwargs:
        fn = fn(**spec.kwargs)
    if not callable(fn):
        raise RewardFunctionError(f"reward {spec.name!r}: {target!r} is not callable")
    return fn


def is_async_callable(fn: Any) -> bool:
    """An `async def` function, or an object whose __call__ is one (as TRL's is_async_callable)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def make_trainer_state(state: dict[str, Any]) -> Any:
    """A real transformers.TrainerState, as TRL passes, so `trainer_state.global_step` code runs unchanged."""
    from transformers import TrainerState

    return TrainerState(
        global_step=int(state.get("global_step", 0)),
        max_steps=int(state.get("max_steps", 0)),
        epoch=float(state.get("epoch", 0.0)),
    )


class _RewardModel:
    """A sequence-classification reward model scored on prompt + completion, as TRL does (logits[:, 0])."""

    def __init__(self, path: str):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # the RM reads the last non-pad token

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        if prompts and isinstance(prompts[0], list):  # conversational: chat template over prompt + completion
            texts = [
                self.tokenizer.apply_chat_template(p + c, tokenize=False)
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
    if inspect.isawaitable(out):
        raise RewardFunctionError(f"reward {name!r} returned an un-awaited coroutine")
    if not isinstance(out, (list, tuple)) and not hasattr(out, "tolist"):
        raise RewardFunctionError(
            f"reward {name!r} returned {type(out).__name__}, expected a list of {n} numbers"
        )
    values = out.tolist() if hasattr(out, "tolist") else list(out)
    if len(values) != n:
        raise RewardFunctionError(
            f"reward {name!r} returned {len(values)} values for {n} completions (samples {offset}..{offset + n - 1})"
        )
    clean = []
    for j, v in enumerate(values):
        if v is None:
            clean.append(math.nan)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise RewardFunctionError(
                f"reward {name!r} returned {v!r} ({type(v).__name__}) for sample {offset + j}, expected a number or None"
            ) from None
        if math.isinf(f):
            raise RewardFunctionError(
                f"reward {name!r} returned {f} for sample {offset + j}; rewards must be finite"
            )
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
        trainer_state: dict[str, Any] | None = None,
        sys_path: list[str] | None = None,
    ):
        for p in reversed(
            sys_path or []
        ):  # the user's run directory, so `my_rewards:fn` imports as with python -m
            if p not in sys.path:
                sys.path.insert(0, p)
        self.index = index
        self.specs = list(specs)
        self.functions = [_RewardModel(s.model) if s.model else load_reward_function(s) for s in self.specs]
        self.is_async = [is_async_callable(f) for f in self.functions]
        self.state: dict[str, Any] = dict(trainer_state or {"global_step": 0, "max_steps": 0, "epoch": 0.0})
        make_trainer_state(
            self.state
        )  # import transformers now (seconds), while the engines start, not at step 1
        # One persistent event loop, as TRL keeps one: async reward code may hold loop-bound clients.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="reward-loop").start()
        self._executor = ThreadPoolExecutor(SYNC_CALL_THREADS, thread_name_prefix="reward-call")
        self._stuck = 0  # sync calls still running past their timeout (their threads cannot be killed)
        self._lock = threading.Lock()
        self.chunks_scored = 0

    def __repr__(self) -> str:
        return f"RewardWorker(index={self.index}, rewards={[s.name for s in self.specs]}, step={self.state.get('global_step')})"

    def pid(self) -> int:
        return os.getpid()

    def set_state(self, state: dict[str, Any]) -> int:
        """The learner's push after each optimizer step (via the pool)."""
        self.state = dict(state)
        return int(self.state.get("global_step", 0))

    def score(self, chunk: dict[str, Any], state: dict[str, Any] | None = None) -> dict[str, Any]:
        """Score one chunk. chunk: prompts, completions, completion_ids (n each), columns {name: [n values]},
        group_size, offset (index of its first sample in the batch). Returns per-reward scores (NaN = None),
        counts of timeouts/errors, user metrics and log_extra columns, latency per reward."""
        if state is not None:
            self.state = dict(state)
        trainer_state = make_trainer_state(self.state)
        coro = _score_chunk(self, chunk, trainer_state)
        result = asyncio.run_coroutine_threadsafe(coro, self._loop).result()
        with self._lock:
            self.chunks_scored += 1
        result["worker"] = self.index
        result["global_step"] = int(self.state.get("global_step", 0))
        return result


async def _score_chunk(worker: RewardWorker, chunk: dict[str, Any], trainer_state: Any) -> dict[str, Any]:
    """Every reward on one chunk, concurrently. Module-level on purpose: an `async def` method would make Ray
    run RewardWorker as an async actor, whose sync `score` then blocks its event loop (one chunk at a time)."""
    n, offset = len(chunk["completions"]), int(chunk.get("offset", 0))
    metrics: dict[str, list[float]] = defaultdict(list)
    extra: dict[str, list[Any]] = defaultdict(list)

    def log_metric(name: str, value: float) -> None:
        metrics[name].append(float(value))

    def log_extra(column: str, values: list[Any]) -> None:
        extra[column].extend(values)

    per_reward = await asyncio.gather(
        *(
            _score_reward(worker, k, chunk, n, offset, trainer_state, log_metric, log_extra)
            for k in range(len(worker.specs))
        )
    )
    return {
        "scores": [r[0] for r in per_reward],  # [K][n]
        "timeouts": {s.name: r[1] for s, r in zip(worker.specs, per_reward, strict=True)},
        "errors": {s.name: r[2] for s, r in zip(worker.specs, per_reward, strict=True)},
        "latency_s": {s.name: r[3] for s, r in zip(worker.specs, per_reward, strict=True)},
        "metrics": dict(metrics),
        "extra": dict(extra),
    }


async def _score_reward(worker: RewardWorker, k, chunk, n, offset, trainer_state, log_metric, log_extra):
    spec, fn = worker.specs[k], worker.functions[k]
    unit = n if (spec.batched or spec.model) else 1  # reward models batch the chunk; functions per sample
    if spec.batched and not spec.model:
        unit = int(chunk.get("group_size", n))
    columns = chunk.get("columns", {})
    t0 = time.monotonic()

    def call_args(lo: int, hi: int) -> dict[str, Any]:
        kw = {c: vals[lo:hi] for c, vals in columns.items()}
        kw.update(
            prompts=chunk["prompts"][lo:hi],
            completions=chunk["completions"][lo:hi],
            completion_ids=chunk["completion_ids"][lo:hi],
            trainer_state=trainer_state,
            log_extra=log_extra,
            log_metric=log_metric,
        )
        return kw

    spans = [(lo, min(lo + unit, n)) for lo in range(0, n, unit)]
    outs = await asyncio.gather(
        *(_call(worker, k, fn, call_args(lo, hi), hi - lo, offset + lo) for lo, hi in spans)
    )
    scores, timeouts, errors = [], 0, 0
    for vals, status in outs:
        scores.extend(vals)
        timeouts += status == "timeout"
        errors += status == "error"
    return scores, timeouts, errors, time.monotonic() - t0


async def _call(
    worker: RewardWorker, k: int, fn, kwargs: dict[str, Any], n: int, offset: int
) -> tuple[list[float], str]:
    spec = worker.specs[k]
    fallback = [math.nan if spec.fallback is None else float(spec.fallback)] * n
    if worker.is_async[k]:
        work = fn(**kwargs)
    else:
        if (
            worker._stuck >= SYNC_CALL_THREADS // 2
        ):  # hung sync calls hold threads forever: start a fresh pool
            worker._executor, worker._stuck = (
                ThreadPoolExecutor(SYNC_CALL_THREADS, thread_name_prefix="reward-call"),
                0,
            )
        work = asyncio.get_running_loop().run_in_executor(worker._executor, lambda: fn(**kwargs))
    try:
        out = await asyncio.wait_for(work, timeout=spec.timeout_s)
        return _validate(spec.name, out, n, offset), "ok"
    except asyncio.TimeoutError:
        if not worker.is_async[k]:
            worker._stuck += 1
        return fallback, "timeout"
    except Exception as err:  # noqa: BLE001 - the reward's on_error policy decides
        if spec.on_error == "fallback":
            return fallback, "error"
        if isinstance(err, RewardFunctionError):
            raise
        where = f"sample {offset}" if n == 1 else f"samples {offset}..{offset + n - 1}"
        raise RewardFunctionError(
            f"reward {spec.name!r} raised on {where}: {type(err).__name__}: {err}"
        ) from err
