"""One freshly built tiny model and the Generator of test_engine.py and test_generator.py, in two layouts: the
engine in process (the CPU generators' default), in CI's tier, and vLLM's engine core in its own process (GPU's
layout), in the scenario tier (CI time: its engine start), shared by both modules. A test that loads other weights
into a generator loads the original ones back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# Long enough that a request is still decoding when a test acts on it (test_engine.py's LONG_TOKENS).
MAX_MODEL_LEN = 1024
# Bounds the wait for the engine's loop to stop at teardown.
CLOSE_WAIT_S = 120


@pytest.fixture(scope="package")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """build_tiny_model's output itself (not the cache other tests share: test_generator.py checks the build)."""
    from orchestrator.builtin.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@contextmanager
def started_generator(tiny_model: Path, multiprocessing: bool) -> Iterator[Any]:
    """A Generator on the tiny model, its engine in process or in an engine core process of its own; shut down on
    exit rather than at interpreter exit, so its processes do not outlive the tests (later ones get the cores back)."""
    from actors.generation.generator import Generator

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if multiprocessing else "0")
        gen = Generator(str(tiny_model), seed=0, max_model_len=MAX_MODEL_LEN, kv_cache_gib=1.0)
        yield gen
        gen.close(CLOSE_WAIT_S)


@pytest.fixture(scope="package")
def engine_core_generator(tiny_model: Path):
    with started_generator(tiny_model, multiprocessing=True) as gen:
        yield gen


@pytest.fixture(scope="module", params=["in-process", "engine-core-process"])
def generator(request: pytest.FixtureRequest, tiny_model: Path):
    if request.param == "engine-core-process":
        yield request.getfixturevalue("engine_core_generator")
        return
    with started_generator(tiny_model, multiprocessing=False) as gen:
        yield gen
