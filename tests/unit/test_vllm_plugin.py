"""The vLLM general plugin that caps the engine queues' busy-spin (actors/vllm_plugin.py)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

pytest.importorskip("vllm")
zmq = pytest.importorskip("zmq")

from vllm.distributed.device_communicators import shm_broadcast  # noqa: E402

from actors import vllm_plugin  # noqa: E402


def test_plugin_is_registered_with_vllm() -> None:
    names = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert "actors.vllm_plugin:register" in names


@pytest.fixture
def restore_wait():
    original = shm_broadcast.SpinCondition.wait
    yield
    shm_broadcast.SpinCondition.wait = original


def _reader(ctx) -> shm_broadcast.SpinCondition:
    return shm_broadcast.SpinCondition(
        is_reader=True, context=ctx, notify_address="inproc://rayward-spin-test"
    )


def test_without_env_the_plugin_changes_nothing(monkeypatch, restore_wait) -> None:
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    vllm_plugin.register()
    ctx = zmq.Context()
    try:
        cond = _reader(ctx)
        cond.wait(timeout_ms=0)
        assert cond.busy_loop_s == 1
    finally:
        ctx.destroy(linger=0)


def test_env_caps_spin_of_existing_and_new_readers(monkeypatch, restore_wait) -> None:
    ctx = zmq.Context()
    try:
        existing = _reader(ctx)  # created before the plugin loads, as vLLM may do
        monkeypatch.setenv(vllm_plugin.SPIN_ENV, "0.005")
        vllm_plugin.register()
        vllm_plugin.register()  # idempotent: loaded once per process by vLLM, but harmless twice
        existing.wait(timeout_ms=0)
        assert existing.busy_loop_s == 0.005
        existing.record_read()
        existing.wait(timeout_ms=0)  # inside the window: a sched_yield, no socket poll
        assert existing.busy_loop_s == 0.005
    finally:
        ctx.destroy(linger=0)
