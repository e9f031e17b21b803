"""The second-model tier's engines (a judge's, a distillation teacher's): a model on one vLLM engine of its own,
fed by an EngineLoop, as a plain class (no Ray import: actors/engines/pool.py makes them Ray actors). Its
engine opens through actors/generation/engine.py `open_engine`, as the generators' do (on CPU: their
settings)."""

from __future__ import annotations

import os
from typing import Any

from actors import user_code
from actors.generation.engine import close_engine, open_engine


class EngineModel:
    """A model on one vLLM engine of its own (`spec.model`, `spec.seed`), or over an engine loop built elsewhere
    (`from_loop`: tests' scripted engine). Subclasses answer requests (JudgeEngine.judge, TeacherEngine.logprobs)."""

    def __init__(self, spec: Any, *, max_model_len: int = 1024, sys_path: list[str] | None = None,
                 **engine: Any) -> None:
        """engine: `open_engine`'s options (dtype, kv_cache_gib, gpu_memory_utilization, engine_kwargs: the
        engine's own vLLM arguments); sys_path: where the user's code is imported from (a judge's parser)."""
        user_code.add_to_sys_path(sys_path)
        opened = open_engine(spec.model, seed=spec.seed, max_model_len=max_model_len, **engine)
        self.llm = opened.llm
        self._setup(spec, opened.loop, max_model_len, self.llm.get_tokenizer())

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


__all__ = ["EngineModel"]
