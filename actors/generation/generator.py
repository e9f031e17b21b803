"""vLLM rollout generator: batched sampling with per-token logprobs, agentic rollouts, and in-place weight sync.

A plain class so it can be used in-process (tests, scripts) or wrapped with `ray.remote` elsewhere.
Its engine is stepped by an `EngineLoop` (engine.py): every request, batch or single, goes through it, and so
does every change of weights, between two engine steps. vLLM is imported lazily so importing this module (e.g.
for `WeightSyncExtension` in an engine worker or for type checks) stays cheap.

    generate / generate_stream     one turn per sample (token-id prompts)
    rollout / rollout_stream       agentic: multi-turn conversations with tools over the environment pool (the
                                   agent loop, or agent functions calling the endpoint), when built with
                                   `environments` and `agent`
    all four take (prompts or rows, seeds one per prompt, Sampling) alike; the streams yield FinishedGroups
    load_weights / join_weight_group / receive_weights   the weights, labelled with the learner's step

Its engine opens through engine.py `open_engine`, as every vLLM engine of a run does. What a feature adds
is a part chosen once from the constructor's arguments, each with a plain implementation when the feature is
off, so the methods read as the core job: the prompts' form (prompts.py: token ids, or a vision-language
model's images), routing replay (routes.py: the experts each sample's tokens went to) and agentic rollouts
(actors/agents/rollouts.py: none, the agent loop, or the agent endpoint).

As a Ray actor it has two concurrency groups (GENERATOR_GROUPS): generation in the default one, weight joins
and loads in "weights", so a load lands between two engine steps of a rollout in flight (pipelined training)
instead of after it. A call that must not sample with weights older than step k passes min_version=k.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any, Literal

from actors.agents.endpoint import AgentEndpoint
from actors.agents.loop import AgentSettings, TurnSettings
from actors.agents.rollouts import rollouts_part
from actors.envs.client import Environments
from actors.generation.engine import FinishedQueue, Request, close_engine, open_engine, token_versions
from actors.generation.prompts import prompt_part
from actors.generation.routes import route_part
from actors.generation.vllm_plugin import SPIN_ENV
from actors.payloads import HOLD_LOADS, group_out, payload_store
from actors.runtime.cpus import Share, describe, omp_waits
from actors.types import FinishedGroups, FinishedOuts, GroupOut, Sample, Sampling
from actors.vision import Images

# vLLM resolves this by qualified name inside each engine worker process.
WEIGHT_SYNC_EXTENSION = "actors.weights.receiver.WeightSyncExtension"
# The policy engine's own vLLM arguments, beside those every engine of a run is opened with (open_engine).
POLICY_ENGINE_KWARGS: dict[str, Any] = dict(
    worker_extension_cls=WEIGHT_SYNC_EXTENSION,
    # Sampled-token logprobs after temperature/top-k/top-p, i.e. the distribution actually
    # sampled from; the learner compares against log_softmax(logits / temperature).
    logprobs_mode="processed_logprobs",
    # Allow full-vocab prompt logprobs, needed by sequence_logprobs at temperature != 1.
    max_logprobs=-1,
)
# Busy-spin window (seconds) of vLLM's engine<->worker queue readers, capped by actors.generation.vllm_plugin.
# vLLM spins 1 s after every message, burning a core after each generate that the learner and reward workers
# need. Decode steps are milliseconds apart, so a few ms keeps the spin on the fast path while decoding and
# cuts the idle tail (bench/README.md has the measurements).
ENGINE_SPIN_S = 0.005
# The generator actor's Ray concurrency groups (ray.remote(concurrency_groups=...)) and which methods run in each
# besides the default group. Weight joins and loads run in "weights", beside a generation call in the default
# group: they wait for the engine's next step boundary (EngineLoop.exclusive), not for the call's end. One at a
# time, so loads apply in the order they were sent.
GENERATOR_GROUPS = {"weights": 1}
GENERATOR_METHOD_GROUPS = {"join_weight_group": "weights", "receive_weights": "weights", "load_weights": "weights"}
# What a weight load does to the KV cache of the sequences it lands among (generation.kv_after_update).
KvAfterUpdate = Literal["keep", "recompute"]


class Generator:
    """One vLLM engine that samples completions for token-id prompts."""

    def __init__(
        self,
        model: str,
        *,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 512,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        cpu_share: Share | None = None,
        enforce_eager: bool = True,
        extra_engine_kwargs: dict[str, Any] | None = None,
        environments: Environments | None = None,
        agent: AgentSettings | None = None,
        record_routes: bool = False,
        processor_kwargs: dict[str, Any] | None = None,
        payload_hold: int = HOLD_LOADS,
        kv_after_update: KvAfterUpdate = "recompute",
    ) -> None:
        """environments, agent: an agentic run's environment pool (actors.envs.client.PoolEnvironments over the
        pool actor's handle) and its settings; both or neither (then `rollout` is unavailable). record_routes:
        every Sample carries the experts the engine's MoE layers chose for its tokens (grpo.router_replay R3).
        processor_kwargs: a vision-language model's processor settings (model.processor_kwargs), for vLLM's
        processor and this generator's (which maps the driver's expanded image placeholders to vLLM's).
        payload_hold: weight loads this generator keeps its own reference to each payload for (actors/payloads.py
        HeldStore: loop.max_staleness + HOLD_LOADS).
        kv_after_update: what a weight load does to the KV cache of running sequences (generation.kv_after_update):
        `recompute` preempts them and recomputes it under the new weights; `keep` lets them go on with it, and
        salts every request with the version it enters under, so no new request reuses blocks of other weights."""
        self.model, self.seed, self.max_model_len = model, seed, max_model_len
        self.tensor_parallel_size = tensor_parallel_size
        # The features, each a part chosen here once: agentic rollouts (actors/agents/rollouts.py), the
        # prompts' form (prompts.py: images for a vision-language model), routing replay (routes.py).
        self.agents = rollouts_part(environments, agent)
        self.prompts = prompt_part(model, processor_kwargs)
        extra = dict(extra_engine_kwargs or {})
        self.routes = route_part(record_routes, eager=extra.get("enforce_eager", enforce_eager))
        # the object store in an actor (each payload held payload_hold loads); in-process, the payloads as they are
        self._put = payload_store(payload_hold)
        if kv_after_update not in ("keep", "recompute"):
            raise ValueError(f"kv_after_update must be 'keep' or 'recompute', not {kv_after_update!r}")
        self.kv_after_update = kv_after_update
        # what each weight load does to the KV cache, chosen once
        self._kv_after_load: Callable[[], None] = self._recompute_kv if kv_after_update == "recompute" else _keep_kv
        # Inherited by the engine processes, where the rayward vLLM plugin reads it (an explicit setting wins).
        os.environ.setdefault(SPIN_ENV, str(ENGINE_SPIN_S))
        engine = open_engine(
            model, seed=seed, dtype=dtype, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib,
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            cpu_share=cpu_share, enforce_eager=enforce_eager,
            # the run's extra arguments win over the policy's and routing replay's, a VLM's prompts' over them
            engine_kwargs={**POLICY_ENGINE_KWARGS, **self.routes.engine_kwargs, **extra,
                           **self.prompts.engine_kwargs},
            isolate_versions=kv_after_update == "keep",
        )
        self.llm, self.loop, self.on_gpu, self._cores = engine.llm, engine.loop, engine.on_gpu, engine.cores
        self.tokenizer = self.llm.get_tokenizer()
        self.routes.attach(engine)
        self.agents.attach(self.loop, self.tokenizer, self.prompts.vision)

    @property
    def vision(self) -> Images | None:
        """A vision-language model's processor (the prompts part's); None: a text model."""
        return self.prompts.vision

    @property
    def endpoint(self) -> AgentEndpoint | None:
        """The agent endpoint (agent_function: actors/agents/endpoint.py); None: there is none."""
        return self.agents.endpoint

    def cpu_threads(self) -> str:
        """How this engine computes, for the start-up log."""
        if self.on_gpu:
            return f"GPU, tp {self.tensor_parallel_size}"
        if self.tensor_parallel_size > 1:
            return f"engine OpenMP threads bound to {os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}{omp_waits()}"
        import torch

        threads = self.loop.exclusive(torch.get_num_threads)  # on the thread that computes
        return f"engine {threads} torch threads, its share {describe(self._cores)}{omp_waits()}"

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        device = "cuda" if self.on_gpu else "cpu"
        return f"Generator(model={self.model!r}, device={device}, tp={self.tensor_parallel_size})"

    def generate(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
    ) -> list[list[Sample]]:
        """Sample `sampling.n` completions per prompt; result[i][j] is sample j of prompt i.

        seeds: one per prompt (vLLM seeds sample j of a prompt with its seed + j), so that repeated prompts still
        get different samples while a repeated call draws the same ones; None: unseeded.
        min_version: sample with weights of at least this policy version (the requests wait for its load);
        pin: no weight load until the call is done (an eval of one version). Sample.versions: per token.
        images: per prompt, the images its ids' (expanded) placeholders stand for (a vision-language model).
        """
        # One batch, so vLLM schedules all prompts * n samples together.
        params = self._params(sampling, seeds, len(prompt_token_ids))
        requests = self.loop.submit_batch(self.prompts.engine_prompts(prompt_token_ids, images), params,
                                          min_version=min_version, pin=pin)
        return [self._finished(out, p) for out, p in zip(_results(requests), prompt_token_ids, strict=True)]

    def _finished(self, out: Any, prompt_ids: list[int]) -> list[Sample]:
        """One finished request's samples: its prompt checked (the prompts part), their routes set (the routes
        part)."""
        return self.routes.routes(out, prompt_ids, _samples(self.prompts.checked(out, prompt_ids)))

    def _params(self, sampling: Sampling, seeds: list[int] | None, num_prompts: int) -> Any:
        """One SamplingParams for every prompt, or one per prompt with its seed."""
        bias = self.prompts.logit_bias
        if seeds is None:
            return self._sampling_params(**asdict(sampling), logit_bias=bias)
        if len(seeds) != num_prompts:
            raise ValueError(f"{len(seeds)} seeds for {num_prompts} prompts")
        return [self._sampling_params(**asdict(sampling), seed=s, logit_bias=bias) for s in seeds]

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the engine loop and the engine now (in-process use: tests, scripts). vLLM's in-process client shuts
        its engine down when garbage-collected, and that shutdown tears down the process-wide parallel groups: an
        engine left to the collector breaks whichever engine the process runs when the collector gets to it."""
        close_engine(self.loop, self.llm, timeout_s)

    def ping(self) -> None:
        """The driver's hang check (called in the actor's health concurrency group, so it answers while a batch
        generates; a generator that does not answer is stopped or wedged)."""

    def generate_stream(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, images: list[tuple[Any, ...]] | None = None,
    ) -> Iterator[FinishedGroups]:
        """`generate`, streamed: yields the groups that finished after every engine step in which some did,
        so their rewards can be scored while the rest of the batch is still decoding. One engine batch, so no cost over
        `generate`. seeds: one per prompt, as in `generate`.

        As a Ray actor method it is a streaming generator in the default concurrency group: a weight load (the
        "weights" group) may land between two of its engine steps, which Sample.versions records per token;
        min_version keeps it from sampling with weights older than that version."""
        t0 = time.perf_counter()
        finished = FinishedQueue()
        requests = self.loop.submit_batch(self.prompts.engine_prompts(prompt_token_ids, images),
                                          self._params(sampling, seeds, len(prompt_token_ids)),
                                          finished=finished, min_version=min_version)
        index = {r.request_id: i for i, r in enumerate(requests)}
        try:
            for done in finished:
                groups = []
                for r in done:
                    i = index[r.request_id]
                    groups.append((i, self._finished(r.result(), prompt_token_ids[i])))
                yield FinishedGroups(groups, time.perf_counter() - t0)
        finally:  # a consumer that stops early leaves nothing decoding
            for r in requests:
                r.cancel()

    def rollout(
        self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False,
    ) -> list[list[Sample]]:
        """Agentic rollouts: `sampling.n` multi-turn trajectories per dataset row; result[i][j] is sample j of
        row i (Sample.trajectory: its conversation, token roles, stop reason, environment outputs).

        rows: dataset rows, exactly as the dataset has them (a `prompt` column of chat messages, the environments'
        columns: reset's arguments). seeds: one per row: the group's environment seed (its G sessions start from
        the same state) and, with the sample and turn, each turn's sampling seed. sampling: as in `generate`,
        max_tokens being the model-token budget of each trajectory. min_version, pin: as in `generate`, for every
        turn."""
        out: dict[int, list[Sample]] = {}
        for finished in self.rollout_stream(rows, seeds, sampling, min_version=min_version, pin=pin):
            out.update(finished.groups)
        return [out[i] for i in range(len(rows))]

    def rollout_stream(
        self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False,
    ) -> Iterator[FinishedGroups]:
        """`rollout`, streamed: yields the rows' groups as they finish (FinishedGroups, as `generate_stream`:
        (row index, its samples)). A consumer that stops early leaves no turn decoding and no session open."""
        t0 = time.perf_counter()
        driver = self.agents.driver(self._turns(sampling, min_version, pin), sampling)
        for groups in driver.run(rows, seeds):
            yield FinishedGroups(groups, time.perf_counter() - t0)

    def _turns(self, sampling: Sampling, min_version: int | None, pin: bool) -> TurnSettings:
        """One rollout call's turns: each a request for one sample, with its own budget and seed. The sampling
        reaches `_sampling_params` as its keyword arguments (n, max_tokens, temperature, top_p, top_k): the
        record's fields, converted here alone."""
        turn = {**asdict(sampling), "n": 1}
        self._sampling_params(**{**turn, "max_tokens": 1})  # bad sampling arguments fail here, before any open

        def params(max_tokens: int, seed: int, stop: list[str] | None = None) -> Any:
            return self._sampling_params(**{**turn, "max_tokens": max_tokens, "seed": seed},
                                         logit_bias=self.prompts.logit_bias, stop=stop)

        return TurnSettings(n=sampling.n, max_tokens=sampling.max_tokens, max_model_len=self.max_model_len,
                            params=params, min_version=min_version, pin=pin, routes=self.routes.turn_routes)

    # --- answers for the driver: finished groups as GroupOuts, their token data in the object store ----------

    def generate_groups(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
    ) -> list[GroupOut]:
        """`generate`, each prompt's group as the driver takes it (actors/payloads.py): its SampleInfos, and a
        reference to its token data, which stays in this node's object store for the stages that read it."""
        groups = self.generate(prompt_token_ids, seeds, sampling, min_version=min_version, pin=pin, images=images)
        return [self._out(i, g, prompt_token_ids, images) for i, g in enumerate(groups)]

    def generate_groups_stream(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, images: list[tuple[Any, ...]] | None = None,
    ) -> Iterator[FinishedOuts]:
        """`generate_stream`, its groups as `generate_groups` answers them."""
        for done in self.generate_stream(prompt_token_ids, seeds, sampling, min_version=min_version, images=images):
            yield FinishedOuts([self._out(i, g, prompt_token_ids, images) for i, g in done.groups], done.seconds,
                               self.loop.counters)

    def rollout_groups(
        self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False,
    ) -> list[GroupOut]:
        """`rollout`, each row's group as `generate_groups` answers it (the prompt's ids: in its trajectories)."""
        groups = self.rollout(rows, seeds, sampling, min_version=min_version, pin=pin)
        return [self._out(i, g) for i, g in enumerate(groups)]

    def rollout_groups_stream(
        self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
        min_version: int | None = None, pin: bool = False,
    ) -> Iterator[FinishedOuts]:
        """`rollout_stream`, its groups as `generate_groups` answers them."""
        for done in self.rollout_stream(rows, seeds, sampling, min_version=min_version, pin=pin):
            yield FinishedOuts([self._out(i, g) for i, g in done.groups], done.seconds, self.loop.counters)

    def _out(self, i: int, samples: list[Sample], prompt_ids: list[list[int]] | None = None,
             images: list[tuple[Any, ...]] | None = None) -> GroupOut:
        return group_out(i, samples, self._put, prompt_ids=None if prompt_ids is None else prompt_ids[i],
                         images=images[i] if images else ())

    @staticmethod
    def _sampling_params(
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        logit_bias: dict[int, float] | None = None,
        stop: list[str] | None = None,
    ) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            # logprobs=0 returns just the sampled token's logprob (no top-k alternatives).
            logprobs=0,
            # A vision-language model never samples an image placeholder (the learner's forward would take it for
            # an image); the learner applies the same bias (actors/vision.py PLACEHOLDER_BIAS).
            logit_bias=logit_bias,
            # An agent's stop strings (actors/agents/endpoint.py): the turn ends after one; its ids are kept.
            stop=stop or None,
        )

    # --- weights (actors.weights: the engine side runs in every worker, see receiver.py) --------------------

    def load_weights(self, blob: bytes, version: int | None = None) -> None:
        """Object-store backend: replace the engine weights in place from safetensors bytes, between two
        engine steps. version: the policy version of these weights, the learner's step (default: the engine's
        current one + 1); every token sampled after the load carries it (Sample.versions)."""
        self._change_weights(lambda: self.llm.collective_rpc("rayward_load_weights", args=(blob,)), version)

    def join_weight_group(
        self, host: str, port: int, rank_offset: int, world_size: int, generation: int, timeout_s: float,
        plan: list[list[Any]],
    ) -> list[int]:
        """Collective backend: every engine worker (TP rank) joins the weight-transfer group; returns their
        ranks. Between two engine steps, like every call into the engine's workers."""
        args = (host, port, rank_offset, world_size, generation, timeout_s, plan)
        return self.loop.exclusive(lambda: self.llm.collective_rpc("rayward_join_weight_group", args=args))

    def receive_weights(self, version: int | None = None) -> dict[str, float]:
        """Collective backend: every engine worker receives the buckets and loads them in place, between two
        engine steps. version: as in `load_weights`."""
        stats = self._change_weights(lambda: self.llm.collective_rpc("rayward_receive_weights"), version)
        return {k: max(s[k] for s in stats) for k in stats[0]}

    def _change_weights(self, load: Callable[[], Any], version: int | None) -> Any:
        def load_and_reset() -> Any:
            result = load()
            self._kv_after_load()
            self.prompts.after_weight_load(self.llm.llm_engine)
            return result

        if version is None:
            version = self.loop.version + 1
        result = self.loop.exclusive(load_and_reset, version=version)
        self._put.loaded()
        return result

    def _recompute_kv(self) -> None:
        """kv_after_update recompute: cached KV blocks were computed with the old weights; reusing them would mix
        policies. Requests in flight are preempted and their KV recomputed, so every token sampled from now on is
        the new policy's, conditioned on the same ids (AReaL)."""
        self.llm.llm_engine.reset_prefix_cache(reset_running_requests=True)

    def sequence_logprobs(self, token_ids: list[int], temperature: float = 1.0,
                          images: tuple[Any, ...] | None = None) -> list[float]:
        """Engine logprob of tokens[1:] given their prefixes, under softmax(logits / temperature); images: those
        the ids' placeholders stand for (a vision-language model).

        For learner <-> generator parity checks; returns len(token_ids) - 1 values.
        """
        return self.sequence_logprobs_and_routes(token_ids, temperature, images)[0]

    def sequence_logprobs_and_routes(self, token_ids: list[int], temperature: float = 1.0,
                                     images: tuple[Any, ...] | None = None) -> tuple[list[float], Any]:
        """`sequence_logprobs`, and the experts the engine's MoE layers chose at each position (numpy int16
        [len(token_ids), layers, top_k]; None where this engine records no routes): the parity check replays them
        in the learner when the run replays routing (grpo.router_replay R3), as training does."""
        from vllm import SamplingParams

        token_ids = list(token_ids)
        # vLLM computes prompt logprobs from raw logits (temperature is a sampling-only step).
        # At T=1 the target token's logprob suffices; otherwise fetch the full vocab (-1) and
        # renormalise: log_softmax(logprobs / T) == log_softmax(logits / T).
        full_vocab = not math.isclose(temperature, 1.0)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=-1 if full_vocab else 0)
        (prompt,) = self.prompts.engine_prompts([token_ids], [images] if images else None)
        out = self.prompts.checked(self.loop.submit(prompt, params).result(), token_ids)
        assert out.prompt_logprobs is not None
        # The prefill computed every position of token_ids (the one token sampled after them, none).
        (sample,) = self.routes.routes(out, token_ids,
                                       [Sample(list(out.outputs[0].token_ids), [], "", "length")])
        routes = None if sample.routes is None else sample.routes[: len(token_ids)]
        # Entry 0 is None: the first token has no prefix to condition on.
        steps = out.prompt_logprobs[1:]
        if not full_vocab:
            return [step[tok].logprob for tok, step in zip(token_ids[1:], steps, strict=True)], routes
        result = []
        for tok, step in zip(token_ids[1:], steps, strict=True):
            scaled = {t: lp.logprob / temperature for t, lp in step.items()}
            m = max(scaled.values())
            log_z = m + math.log(sum(math.exp(v - m) for v in scaled.values()))
            result.append(scaled[tok] - log_z)
        return result, routes


def _keep_kv() -> None:
    """kv_after_update keep (PipelineRL, prime-rl): running requests go on with the KV the old weights computed.
    Nothing to reset: vLLM's reset_prefix_cache without preempting them does nothing while any block is in use
    (vLLM 0.32 BlockPool.reset_prefix_cache), so the engine loop salts each request with its version instead."""


def _results(requests: list[Request]) -> list[Any]:
    """The requests' outputs in order; if one fails, the rest are aborted and its error raised."""
    try:
        return [r.result() for r in requests]
    finally:
        for r in requests:
            r.cancel()


def _samples(out: Any) -> list[Sample]:
    """One prompt's vLLM RequestOutput as rayward samples (versions: the policy version of each token)."""
    samples = []
    for comp in out.outputs:
        ids = list(comp.token_ids)
        assert comp.logprobs is not None and len(comp.logprobs) == len(ids)
        logprobs = [step[tok].logprob for tok, step in zip(ids, comp.logprobs, strict=True)]
        samples.append(Sample(ids, logprobs, comp.text, comp.finish_reason or "length", token_versions(comp)))
    return samples
