"""The vLLM general plugin that caps the engine queues' busy-spin (actors/generation/vllm_plugin.py).

The readers are vLLM's real SpinCondition class, built without its zmq sockets: inside the spin window its
`wait` only yields the CPU, which is the path the cap acts on (tearing real sockets down in a test process
aborted libzmq once)."""

from __future__ import annotations

import time
from importlib.metadata import entry_points

import pytest

pytest.importorskip("vllm")

from vllm.distributed.device_communicators import shm_broadcast  # noqa: E402

from actors.generation import vllm_plugin  # noqa: E402

VLLM_SPIN_S = 1  # vLLM's own busy_loop_s default


def test_plugin_is_registered_with_vllm() -> None:
    names = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert "actors.generation.vllm_plugin:register" in names


@pytest.fixture
def restore_wait():
    """vLLM's own `wait` during the test, whatever this process loaded before (an in-process engine of an earlier
    test may have registered the plugin with the env set); the process's state after."""
    before = shm_broadcast.SpinCondition.wait
    shm_broadcast.SpinCondition.wait = getattr(before, "_rayward_original", before)
    yield
    shm_broadcast.SpinCondition.wait = before


def _reader() -> shm_broadcast.SpinCondition:
    """A reader that has just read a message, so `wait` is inside its spin window."""
    cond = shm_broadcast.SpinCondition.__new__(shm_broadcast.SpinCondition)
    cond.is_reader, cond.busy_loop_s, cond.last_read = True, VLLM_SPIN_S, time.monotonic()
    return cond


def test_without_env_the_plugin_changes_nothing(monkeypatch, restore_wait) -> None:
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    vllm_plugin.register()
    cond = _reader()
    cond.wait()
    assert cond.busy_loop_s == VLLM_SPIN_S


def test_env_caps_spin_of_existing_and_new_readers(monkeypatch, restore_wait) -> None:
    existing = _reader()  # created before the plugin loads, as vLLM may do
    monkeypatch.setenv(vllm_plugin.SPIN_ENV, "0.005")
    vllm_plugin.register()
    vllm_plugin.register()  # idempotent: loaded once per process by vLLM, but harmless twice
    existing.wait()
    assert existing.busy_loop_s == 0.005
    new = _reader()
    new.wait()
    assert new.busy_loop_s == 0.005
