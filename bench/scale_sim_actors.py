"""Synthetic actors for bench/scale_sim.py: a generator and a learner with the methods the real groups call
(actors/runtime/group.py GeneratorGroup, LearnerGroup), no vLLM and no torch, and a ledger they report to.

    SyntheticGenerator   Generator's generate_groups, generate_groups_stream, load_weights, ping, cpu_threads:
                         token ids, log-probs, versions, text (and MoE routes) of long-tailed lengths, each call
                         sleeping the modelled decode time of its batch (`EngineModel`); each group's token data
                         put in this actor's object store and a GroupOut header answered (actors/payloads.py), as
                         the real generator does
    SyntheticLearner     Learner's train_step (fetches the batch's token data as the real learner does, sleeps
                         the modelled seconds for the batch's tokens, pushes each new global_step to the reward
                         pool as rank 0 does), export_weights (a few bytes: the object-store weight sync), ping,
                         cpu_threads, checkpoints (a JSON file)
    Ledger               what each generator call modelled (seconds, tokens), read by the bench after the run

The samples are built the way actors/generation/generator.py `_samples` builds them from vLLM's output (Python
lists), then go through the same `group_out` as the real generator's; a change to that contract changes
`group_samples` here. This module imports numpy, actors.types and actors.payloads only: a Ray worker process of
these classes stays small.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from actors.payloads import PayloadLost, group_out, payload_store, resolve_training
from actors.types import FinishedGroups, FinishedOuts, GroupOut, Sample, Sampling, TrainBatch, TrainerState, TrainResult

# Qwen3's vocabulary: token ids drawn below it pickle as the real ones do (most above 65535: 5 bytes each).
VOCAB = 151_936
# Qwen3-30B-A3B's MoE shape (issue 49's example): 48 MoE layers, 8 experts of 128 chosen per token.
ROUTE_LAYERS, ROUTE_TOP_K, NUM_EXPERTS = 48, 8, 128
# How long a call waits for the weights its min_version asks for before it fails (a load that never comes).
MIN_VERSION_WAIT_S = 600.0


@dataclass(frozen=True)
class EngineModel:
    """One modelled inference engine and the completions it produces.

    Lengths: log-normal (median `median_frac` x max_tokens, shape `sigma`), rounded, clipped to [1,
    max_tokens]: reasoning traces are long-tailed and a share of them run into the limit. Decoding: processor
    sharing; the sequences of one call decode together, each at min(seq_tps, engine_tps / live sequences)
    tokens/s, so a call takes about max(its tokens / engine_tps, its longest sample / seq_tps). Prefill is not
    modelled. Groups are handed back in engine steps of `step_s` (every group finished within a step comes
    back in one yield)."""

    engine_tps: float  # tokens/s of one engine over all its sequences
    seq_tps: float  # tokens/s of one sequence (the decode speed a lone sequence gets)
    median_frac: float = 0.35
    sigma: float = 0.8
    step_s: float = 0.05
    chars_per_token: int = 4  # the completion's text, as detokenized text is about this long
    # MoE routes per sample: int16 [prompt + completion, route_layers, route_top_k]; 0 layers: none
    route_layers: int = 0
    route_top_k: int = ROUTE_TOP_K

    def lengths(self, seed: int, n: int, max_tokens: int) -> np.ndarray:
        """The completion lengths of one prompt's n samples (a function of the prompt's seed)."""
        rng = np.random.default_rng(seed)
        raw = rng.lognormal(math.log(self.median_frac * max_tokens), self.sigma, n)
        return np.clip(np.rint(raw), 1, max_tokens).astype(np.int64)

    def finish_times(self, lengths: np.ndarray) -> np.ndarray:
        """Seconds from the call's start until each sequence's last token (processor sharing: every live
        sequence has decoded the same number of tokens, so they finish in order of length)."""
        out = np.empty(len(lengths))
        t, decoded = 0.0, 0.0
        for k, i in enumerate(np.argsort(lengths, kind="stable")):
            rate = min(self.seq_tps, self.engine_tps / (len(lengths) - k))
            t += (lengths[i] - decoded) / rate
            decoded = float(lengths[i])
            out[i] = t
        return out


def group_samples(pools: dict[str, Any], lengths: np.ndarray, prompt_len: int, max_tokens: int, version: int,
                  offset: int, end_version: int | None = None) -> list[Sample]:
    """One prompt's samples: lists sliced from the generator's pools of random values (each `tolist()` builds
    fresh Python objects, as `_samples` does from vLLM's output), and routes as views of its routes pool
    (numpy pickles a contiguous view's own bytes only)."""
    samples = []
    cpt = pools["chars_per_token"]
    for j, n in enumerate(lengths.tolist()):
        start = (offset * 7919 + j * 104729) % max_tokens  # another window of the pools for each sample
        routes = pools["routes"][start: start + prompt_len + n] if pools["routes"] is not None else None
        samples.append(Sample(
            completion_ids=pools["ids"][start: start + n].tolist(),
            logprobs=pools["logprobs"][start: start + n].tolist(),
            text=pools["text"][start * cpt: (start + n) * cpt],
            finish_reason="length" if n >= max_tokens else "stop",
            # the first token sampled by `version`, the rest by the weights it finished under (a load landed
            # while it ran: the shared engine's in-flight updates)
            versions=[version] + [version if end_version is None else end_version] * (n - 1),
            routes=routes,
        ))
    return samples


class SharedEngine:
    """One modelled engine shared by every call of a generator actor (the async loop runs several at once; the
    pipelined and sync loops one at a time, where it is the same as EngineModel.finish_times). A thread advances
    it by `step_s`: every live sequence decodes min(seq_tps, engine_tps / live) tokens/s; a group is handed to
    its call when its last sequence finishes. It counts the engine's occupancy: the share of its modelled
    capacity in use (live x seq_tps / engine_tps, at most 1), over the time it had any sequence."""

    def __init__(self, engine: EngineModel):
        self.engine = engine
        self._lock = threading.Condition()
        self._calls: list[dict[str, Any]] = []
        self.busy_s, self.used_s = 0.0, 0.0  # modelled seconds with any sequence live; x occupancy
        self.version = 0
        threading.Thread(target=self._run, daemon=True, name="shared-engine").start()

    def submit(self, lengths: list[np.ndarray], version: int) -> dict[str, Any]:
        """Start decoding the groups' sequences now; the returned call's "done" list fills with (group, version at
        its end) as groups finish, and "left" counts the groups still decoding."""
        left = np.concatenate(lengths).astype(np.float64) if lengths else np.zeros(0)
        group = np.repeat(np.arange(len(lengths)), [len(x) for x in lengths])
        call = {"left": left, "group": group, "pending": np.array([len(x) for x in lengths]), "done": [],
                "groups_left": len(lengths), "version": version}
        with self._lock:
            self._calls.append(call)
            self._lock.notify_all()
        return call

    def take(self, call: dict[str, Any]) -> tuple[list[tuple[int, int]], bool]:
        """The groups the call has finished since the last take (waiting for at least one), and whether it is
        done."""
        with self._lock:
            self._lock.wait_for(lambda: call["done"] or call["groups_left"] == 0)
            out, call["done"] = call["done"], []
            return out, call["groups_left"] == 0

    def _run(self) -> None:
        e = self.engine
        while True:
            time.sleep(e.step_s)
            with self._lock:
                live = sum(int((c["left"] > 0).sum()) for c in self._calls)
                if not live:
                    continue
                rate = min(e.seq_tps, e.engine_tps / live)
                self.busy_s += e.step_s
                self.used_s += e.step_s * min(1.0, live * e.seq_tps / e.engine_tps)
                for c in self._calls:
                    alive = c["left"] > 0
                    c["left"][alive] -= rate * e.step_s
                    ended = alive & (c["left"] <= 0)
                    for g in c["group"][ended].tolist():
                        c["pending"][g] -= 1
                        if c["pending"][g] == 0:
                            c["done"].append((g, self.version))
                            c["groups_left"] -= 1
                self._calls = [c for c in self._calls if c["groups_left"] > 0 or c["done"]]
                self._lock.notify_all()


class SyntheticGenerator:
    """Generator's methods that the loop and the object-store weight sync call, on a modelled engine (see
    EngineModel). As a Ray actor it has Generator's concurrency groups (weight loads beside generation): a
    call waits for the weights its min_version names, as vLLM requests do, and labels every token with the
    version it started under."""

    def __init__(self, model: str, *, seed: int = 0, index: int = 0, engine: EngineModel, max_tokens: int,
                 prompt_len: int, ledger: Any = None, shared_engine: bool = False, payload_hold: int = 3,
                 **_: Any) -> None:
        """shared_engine: every call decodes on one SharedEngine (calls at once share it) instead of each call
        being modelled alone (right when calls run one at a time)."""
        self.model, self.index, self.engine, self.ledger = model, index, engine, ledger
        self.shared = SharedEngine(engine) if shared_engine else None
        self.put, self.payload_hold = None, payload_hold
        self.version = 0
        self._weights = threading.Condition()
        self._calls = 0
        rng = np.random.default_rng(seed)
        span = 2 * max_tokens  # room for a window of any length at any start
        self.pools: dict[str, Any] = {
            "ids": rng.integers(0, VOCAB, span),
            "logprobs": -rng.exponential(0.7, span),
            "text": ("lorem ipsum dolor sit amet " * (span * engine.chars_per_token // 27 + 1)),
            "chars_per_token": engine.chars_per_token,
            "routes": None,
        }
        if engine.route_layers:
            shape = (span + prompt_len, engine.route_layers, engine.route_top_k)
            self.pools["routes"] = rng.integers(0, NUM_EXPERTS, shape, dtype=np.int16)

    def __repr__(self) -> str:
        return f"SyntheticGenerator(index={self.index})"

    def ping(self) -> None:
        """The driver's hang check (HEALTH_GROUP)."""

    def cpu_threads(self) -> str:
        e = self.engine
        return f"synthetic engine: {e.engine_tps:.0f} tokens/s, {e.seq_tps:.0f} per sequence"

    # --- weights --------------------------------------------------------------------------------------------

    def load_weights(self, blob: bytes, version: int | None = None) -> None:
        """Object-store backend: the bytes arrive (Ray fetched them); the next calls sample with `version`."""
        with self._weights:
            self.version = self.version + 1 if version is None else version
            if self.shared is not None:  # in flight: the sequences running go on under the new version
                self.shared.version = self.version
            self._weights.notify_all()
        self._store().loaded()

    def _wait_version(self, min_version: int | None) -> int:
        with self._weights:
            if not self._weights.wait_for(lambda: min_version is None or self.version >= min_version,
                                          timeout=MIN_VERSION_WAIT_S):
                raise TimeoutError(f"weights of version {min_version} never arrived (holding {self.version})")
            return self.version

    # --- sampling -------------------------------------------------------------------------------------------

    def _plan(self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling
              ) -> tuple[list[np.ndarray], np.ndarray]:
        """Each prompt's sample lengths and each group's finish time (its last sample's)."""
        if seeds is None:
            seeds = [self.index * 1_000_003 + self._calls * 10_007 + i for i in range(len(prompt_token_ids))]
        lengths = [self.engine.lengths(s, sampling.n, sampling.max_tokens) for s in seeds]
        done = self.engine.finish_times(np.concatenate(lengths)) if lengths else np.zeros(0)
        return lengths, done.reshape(len(lengths), sampling.n).max(axis=1) if lengths else done

    def _record(self, calls: int, prompts: int, lengths: list[np.ndarray], modelled_s: float, wall_s: float,
                cpu_s: float, min_version: int | None) -> None:
        if self.ledger is not None:
            self.ledger.record.remote({
                "kind": "generate", "member": self.index, "call": calls, "min_version": min_version,
                "prompts": prompts, "tokens": int(sum(int(x.sum()) for x in lengths)),
                "modelled_s": modelled_s, "wall_s": wall_s, "cpu_s": cpu_s,
            })

    def generate(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
    ) -> list[list[Sample]]:
        """All the prompts' samples, after the modelled time of the whole batch."""
        by_prompt: dict[int, list[Sample]] = {}
        for finished in self.generate_stream(prompt_token_ids, seeds, sampling, min_version=min_version):
            by_prompt.update(finished.groups)
        return [by_prompt[i] for i in range(len(prompt_token_ids))]

    def generate_stream(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, images: list[tuple[Any, ...]] | None = None,
    ) -> Iterator[FinishedGroups]:
        """The groups as they finish: every engine step (EngineModel.step_s) in which some did, those groups,
        built while the modelled time runs and handed back when it is up."""
        self._calls += 1
        calls, cpu0 = self._calls, time.thread_time()
        version = self._wait_version(min_version)
        t0 = time.perf_counter()
        lengths, done = self._plan(prompt_token_ids, seeds, sampling)
        if self.shared is not None:
            call, finished = self.shared.submit(lengths, version), False
            while not finished:
                ended, finished = self.shared.take(call)
                groups = [(i, group_samples(self.pools, lengths[i], len(prompt_token_ids[i]), sampling.max_tokens,
                                            version, i, end_version=v)) for i, v in ended]
                if groups:
                    yield FinishedGroups(groups, time.perf_counter() - t0)
            wall = time.perf_counter() - t0
            self._record(calls, len(prompt_token_ids), lengths, wall, wall, time.thread_time() - cpu0, min_version)
            return
        step = self.engine.step_s
        ticks: dict[float, list[int]] = {}
        for i in np.argsort(done, kind="stable").tolist():
            ticks.setdefault(math.ceil(done[i] / step) * step, []).append(i)
        for at, prompts in ticks.items():
            groups = [(i, group_samples(self.pools, lengths[i], len(prompt_token_ids[i]), sampling.max_tokens,
                                        version, i)) for i in prompts]
            wait = t0 + at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            yield FinishedGroups(groups, time.perf_counter() - t0)
        modelled = float(done.max()) if len(done) else 0.0
        self._record(calls, len(prompt_token_ids), lengths, modelled, time.perf_counter() - t0,
                     time.thread_time() - cpu0, min_version)

    def generate_groups(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
    ) -> list[GroupOut]:
        """`generate`, each group as the real generator answers it (a header and its payload's reference)."""
        put = self._store()
        groups = self.generate(prompt_token_ids, seeds, sampling, min_version=min_version)
        return [group_out(i, g, put, prompt_ids=prompt_token_ids[i]) for i, g in enumerate(groups)]

    def generate_groups_stream(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, images: list[tuple[Any, ...]] | None = None,
    ) -> Iterator[FinishedOuts]:
        """`generate_stream`, its groups as `generate_groups` answers them."""
        put = self._store()
        for done in self.generate_stream(prompt_token_ids, seeds, sampling, min_version=min_version):
            yield FinishedOuts([group_out(i, g, put, prompt_ids=prompt_token_ids[i]) for i, g in done.groups],
                               done.seconds)

    def _store(self) -> Any:
        """The generator's payload store (actors/payloads.py payload_store: held as the real generator holds them),
        made in the actor's process on first use."""
        if self.put is None:
            self.put = payload_store(self.payload_hold)
        return self.put

    def occupancy(self) -> tuple[float, float]:
        """(modelled seconds the shared engine had any sequence, its mean occupancy over them)."""
        s = self.shared
        return (0.0, math.nan) if s is None or not s.busy_s else (s.busy_s, s.used_s / s.busy_s)

    def sequence_logprobs(self, token_ids: list[int], temperature: float = 1.0,
                          images: tuple[Any, ...] | None = None) -> list[float]:
        return [-0.5] * (len(token_ids) - 1)


@dataclass(frozen=True)
class LearnerModel:
    """The modelled learner: it takes `tokens_per_s` over every token of the batch (prompts and completions,
    forward and backward of num_iterations passes), however many ranks that means."""

    tokens_per_s: float
    num_iterations: int = 1


def batch_tokens(batch: TrainBatch) -> tuple[int, int, int]:
    """(prompt tokens, completion tokens, route bytes) of a batch: it reads every row, as a learner must."""
    prompt = sum(len(p) for p in batch.prompt_ids)
    completion = sum(len(c) for c in batch.completion_ids)
    routes = sum(int(r.nbytes) for r in batch.routes if r is not None) if batch.routes is not None else 0
    return prompt, completion, routes


class SyntheticLearner:
    """Learner's methods that the loop, LearnerGroup and the object-store weight sync call, on a modelled
    learner (LearnerModel). rank 0's `reward_pool` gets every new global_step, awaited, as the real learner
    pushes it."""

    def __init__(self, *, model: LearnerModel, weight_bytes: int = 16, reward_pool: Any = None,
                 **_: Any) -> None:
        self.model, self.weight_bytes, self.reward_pool = model, weight_bytes, reward_pool
        self.global_step = 0

    def __repr__(self) -> str:
        return "SyntheticLearner()"

    def ping(self) -> None:
        """The driver's hang check (HEALTH_GROUP)."""

    def cpu_threads(self) -> str:
        return f"synthetic learner: {self.model.tokens_per_s:.0f} tokens/s"

    def train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None) -> TrainResult:
        """Sleeps the modelled time of the batch's tokens (less what reading it took), then num_iterations
        optimizer steps. Its metrics carry the modelled seconds (sim/learner_modelled_s) for the bench."""
        t0 = time.perf_counter()
        try:
            batch = resolve_training(batch)  # the token data, from the generators' object stores
        except PayloadLost as err:  # as the real learner: nothing trained, the lost groups named
            return TrainResult(self.global_step, {}, num_tokens=0.0, compute_s=0.0, lost=err.lost)
        prompt, completion, route_bytes = batch_tokens(batch)
        modelled = (prompt + completion) / self.model.tokens_per_s
        wait = t0 + modelled - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        for _ in range(self.model.num_iterations):
            self.global_step += 1
            self._push_state(reward_state)
        metrics = {"loss": 0.0, "learning_rate": 1e-6, "sim/learner_modelled_s": modelled,
                   "sim/learner_tokens": float(prompt + completion), "sim/route_bytes": float(route_bytes)}
        return TrainResult(self.global_step, metrics, num_tokens=float(completion),
                           compute_s=time.perf_counter() - t0)

    def _push_state(self, reward_state: TrainerState | None) -> None:
        if self.reward_pool is None:
            return
        import ray

        ray.get(self.reward_pool.set_state.remote(replace(reward_state or TrainerState(),
                                                          global_step=self.global_step)))

    def export_weights(self) -> bytes:
        """The object-store weight sync's blob: a few bytes, so the sync's cost is the calls', not the
        copy's."""
        return bytes(self.weight_bytes)

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> str:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "synthetic_state.json").write_text(json.dumps({"global_step": self.global_step,
                                                                     **(extra or {})}, default=str))
        return path

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        state = json.loads((Path(path) / "synthetic_state.json").read_text())
        self.global_step = state["global_step"]
        return state

    def save_merged(self, path: str) -> str:
        Path(path).mkdir(parents=True, exist_ok=True)
        return path

    def pid(self) -> int:
        return os.getpid()


class Ledger:
    """What the synthetic generators modelled, call by call (they report here, not to the driver, so the
    driver's traffic is the loop's alone)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)

    def take(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out


def private_mb(_actor: Any) -> float:
    """This process's unique memory in MiB (USS: what it alone holds; shared libraries count once per
    machine). Run in an actor's process: ActorGroup.on_each."""
    import psutil

    return psutil.Process().memory_full_info().uss / 2**20
