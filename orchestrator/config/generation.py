"""`generation:` sampling in the vLLM generators."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.config.base import _Section

# vLLM arguments `engine_kwargs` may not set: what the weight sync and the logprobs rest on, and those with a field
OWN_ENGINE_KWARGS = {"model", "worker_extension_cls", "logprobs_mode", "max_model_len", "tensor_parallel_size",
                     "gpu_memory_utilization", "dtype"}


class GenerationConfig(_Section):
    num_generations: int = Field(8, ge=2)
    """Completions per prompt (G, the GRPO group size)."""
    generation_batch_size: int = Field(32, ge=2)
    """Completions generated per optimizer step, across all generators; a multiple of num_generations
    (prompts per step = generation_batch_size / num_generations)."""
    max_completion_length: int = Field(64, ge=1)
    """Maximum new tokens per completion (also the dr_grpo normaliser). With tools: the tokens the model samples
    over all turns of a trajectory; tool results count in agent.max_tool_tokens instead (TRL counts both in
    this one)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the learner divides logits by it too, so logprobs match the sampler's."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (not applied to training logprobs, as in TRL)."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling; 0 disables it."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the chat template wherever rayward renders one (TRL's name): the prompts of training
    and eval, an agentic run's first prompt, tool results and template check, and reward models' inputs. E.g.
    `{enable_thinking: false}` renders a Qwen3 policy without thinking, as TRL's environment examples do."""
    max_model_len: int = Field(512, ge=16)
    """vLLM context length (prompt + completion)."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """KV cache per generator in GiB on CPU (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """Fraction of GPU memory a generator's vLLM may take (GPU only)."""
    kv_after_update: Literal["keep", "recompute"] = "recompute"
    """What a weight load that lands while sequences run (loop.mode async; pipelined when a sync lands mid-call)
    does to their KV cache. `recompute` (AReaL): the engine preempts them and re-prefills their ids under the new
    weights, so every later token is conditioned exactly as the new policy would be, at the cost of recomputing
    every running sequence's KV at each load. `keep` (PipelineRL, prime-rl): they go on with the cache the old
    weights computed, with no re-prefill, but the tokens after the load are sampled attending to the old policy's
    keys and values, so the sampler's logprobs differ from the new policy's recomputed ones (the importance-sampling
    correction covers the gap, as it covers staleness); a request that enters after the load never reuses a
    cached block of other weights. docs/pipelined.md#async-generation."""
    max_tool_calling_iterations: int | None = Field(None, ge=0)
    """With tools: the most tool-calling rounds per trajectory (TRL's name); a model that still calls a tool after
    them ends its trajectory with stop reason `max_turns`. null: no limit but the token budgets and
    agent.trajectory_timeout_s."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More `vllm.LLM` arguments for the generators' engines (e.g. `max_num_seqs`, `enable_prefix_caching`,
    `logits_processors: [module:Class]`), passed as given over rayward's own, as the judges' `engine_kwargs`.
    Refused: the ones the weight sync and the logprobs rest on (`model`, `worker_extension_cls`,
    `logprobs_mode`) and those with a field of their own here (`max_model_len`, `tensor_parallel_size`,
    `gpu_memory_utilization`, `dtype`: model.dtype)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism inside each generator (vLLM's name): the engine's workers split every layer.
    On GPUs each generator actor then takes tensor_parallel_size x cluster.generator.num_gpus GPUs of one node;
    on CPU each rank gets its own share of the actor's cores (VLLM_CPU_OMP_THREADS_BIND, set unless given)."""

    @model_validator(mode="after")
    def _divisible(self) -> GenerationConfig:
        if self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size}) must be a multiple of "
                f"num_generations ({self.num_generations})"
            )
        if refused := sorted(set(self.engine_kwargs) & OWN_ENGINE_KWARGS):
            raise ValueError(f"engine_kwargs: {', '.join(refused)} cannot be set here (the weight sync and logprobs "
                             "rest on them, or they have a field of their own: max_model_len, tensor_parallel_size, "
                             "gpu_memory_utilization, model.dtype)")
        if self.max_completion_length >= self.max_model_len:
            raise ValueError(
                f"max_completion_length ({self.max_completion_length}) must be below max_model_len "
                f"({self.max_model_len}), which also holds the prompt"
            )
        return self
