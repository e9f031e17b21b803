"""Reward functions of the benchmarks, in TRL's reward-function signature.

trl_vs_rayward.py:

* `letter_fraction` (cheap, pure Python): rayward's built-in toy reward, re-exported unchanged.
* `sandbox_reward` (latency-bound): what a user writes around a code-sandbox or remote-judge call, a plain
  sync function that blocks ~50 ms per completion it is given (`time.sleep`, no CPU). TRL calls it once with
  the whole generation batch (and sync reward functions one after the other), so it loops over all of them;
  rayward calls it once per completion by default and gets its concurrency from the reward workers' threads
  and the number of workers. Same function, same per-sample cost in both.

reward_scaling.py: `sleepy` (latency-bound) and `cpu_bound` (a verifier in Python), factories whose settings
travel in the run config to every worker on every node.

reward_autoscale.py: `step_latency`, a reward that becomes slower for a stretch of steps and records every
sample it scored.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from actors.rewards.builtin import completion_text, letter_fraction

SANDBOX_LATENCY_S = 0.05  # one "sandbox round trip" per completion

__all__ = ["SANDBOX_LATENCY_S", "cpu_bound", "letter_fraction", "sandbox_reward", "sleepy", "spin", "step_latency",
           "threaded"]


def sandbox_reward(completions: list[Any], letter: list[str] | None = None, **kwargs: Any) -> list[float]:
    """1.0 if the completion contains the requested letter, else 0.0, after a 50 ms blocking call per completion."""
    out = []
    for i, c in enumerate(completions):
        time.sleep(SANDBOX_LATENCY_S)  # the sandbox round trip: blocks this thread, uses no CPU
        want = letter[i] if letter else ""
        out.append(1.0 if want and want in completion_text(c) else 0.0)
    return out


def sleepy(delay_s: float = 0.05):
    """Factory (config `kwargs`): a latency-bound reward (a sandbox or judge call) that sleeps `delay_s` per
    completion it is given and holds no CPU."""

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        time.sleep(delay_s * len(completions))
        return [1.0] * len(completions)

    return reward


def spin(n: int) -> int:
    """Pure-Python CPU work (holds the GIL): n loop iterations."""
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def cpu_bound(iters: int = 200_000):
    """Factory (config `kwargs`): a CPU-bound reward (a parser or verifier in Python), `iters` loop iterations
    per completion."""

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(spin(iters) % 2) for _ in completions]

    return reward


def threaded(fn: Any, threads: int) -> Any:
    """`fn` called once per completion on a pool of `threads` threads: how a TRL user who knows the reward is
    I/O bound speeds it up (TRL calls a sync reward function once with the whole batch)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(threads)

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        def one(i: int) -> float:
            return fn([completions[i]], **{k: [v[i]] if isinstance(v, list) and len(v) == len(completions) else v
                                         for k, v in kwargs.items()})[0]

        return list(pool.map(one, range(len(completions))))

    reward.__name__ = fn.__name__  # TRL logs rewards under the function's name
    return reward


# One reward call at a time per worker process, as a CPU-bound checker would run (the worker's thread pool
# queues here), so only more workers make scoring faster.
_ONE_AT_A_TIME = threading.Lock()


def step_latency(record_dir: str, base_s: float = 0.02, factor: float = 8.0, rise_step: int = 3,
                 drop_step: int = 10):
    """Factory: a reward whose every call takes `base_s` seconds, `factor` times that while the learner's
    `trainer_state.global_step` is in [rise_step, drop_step) (harder tasks, longer completions), one call at a
    time per worker process. It returns 1.0 per sample and appends one line per scored sample to
    `<record_dir>/<pid>.jsonl`: the step it was scored under, the row's `uid`, the call's latency regime."""

    def reward(completions, uid, trainer_state, **kwargs):
        step = trainer_state.global_step
        slow = rise_step <= step < drop_step
        lines = "".join(
            json.dumps({"step": step, "uid": u, "slow": slow, "pid": os.getpid()}) + "\n" for u in uid
        )
        with _ONE_AT_A_TIME:
            time.sleep(base_s * (factor if slow else 1.0))
            os.makedirs(record_dir, exist_ok=True)
            with open(os.path.join(record_dir, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(lines)
        return [1.0] * len(completions)

    return reward


def judge_per_sample(model: str, template: str, max_tokens: int = 3, kv_cache_gib: float = 0.5):
    """judge_pool.py: an LLM judge as a TRL user writes it, a reward function that holds the judge model (a vLLM
    engine, built in the reward worker on its first call) and asks it about each completion on its own, one
    request at a time (vllm.LLM is not thread-safe: a user's loop, or a lock). The same JudgeEngine, template and
    labels as rayward's judge pool, so the two differ only in how requests reach the engine."""
    from actors.engines.judge import JudgeEngine, JudgeRequest, JudgeSpec

    lock = threading.Lock()
    holder: dict[str, Any] = {}

    def judge(completions: list[Any], letter: list[str], **kwargs: Any) -> list[float | None]:
        with lock:
            if "engine" not in holder:
                spec = JudgeSpec(reward="judge", model=model, template=template, max_tokens=max_tokens,
                                 labels={"yes": 1.0, "no": 0.0}, timeout_s=600.0)
                holder["engine"] = JudgeEngine(spec, max_model_len=128, kv_cache_gib=kv_cache_gib)
            out = []
            for c, want in zip(completions, letter, strict=True):
                answer = holder["engine"].judge([JudgeRequest({"completion": completion_text(c), "letter": want})])[0]
                out.append(answer.value)
            return out

    return judge


def slow_judge_labels(text: str) -> float | None:
    """judge_pool.py's burst: the tiny judge's labels, each answer taking the seconds written in the file
    $RAYWARD_BENCH_JUDGE_SLOW names (0 or no file: none), as a judge behind a slow service would."""
    path = os.environ.get("RAYWARD_BENCH_JUDGE_SLOW", "")
    try:
        delay = float(open(path).read() or 0) if path else 0.0
    except FileNotFoundError:
        delay = 0.0
    time.sleep(delay)
    head = text.strip()
    return 1.0 if head.startswith("yes") else 0.0 if head.startswith("no") else None
