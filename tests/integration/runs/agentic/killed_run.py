"""A whole agentic run on the local Ray cluster with one environment-pool worker SIGKILLed while it holds a
trajectory (an environment session or an agent function's run), as an operator or the OOM killer would: what the
loop handed the learner is captured for the test to read (test_tools_run.py, test_agent_run.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from actors.payloads import fetch, resolve_training
from orchestrator.config import RunConfig
from orchestrator.loop import phases
from orchestrator.run.train import train


@dataclass
class Seen:
    """One step's batch as the learner reads it (its token data fetched from the generators' object stores while
    they still hold it) and each row's trajectory."""

    batch: Any  # TrainBatch, resolved
    trajectories: list[Any]  # actors.types.Trajectory per row


@dataclass
class Captured:
    """What the loop handed the learner (phases.to_train_batch's StepBatch, resolved) and what the test did
    meanwhile."""

    steps: list[Seen] = field(default_factory=list)
    run: Any = None
    killed: list[int] = field(default_factory=list)  # pids of the workers SIGKILLed


def kill_a_worker_holding_a_trajectory(ray: Any, name: str, captured: Captured, stop: threading.Event) -> None:
    """Once the run's environment pool holds a trajectory, SIGKILL the worker holding it. Polls until the run ends,
    with no deadline of its own: on a loaded 2-core CI box the engines alone can take minutes to load before the
    pool has its first session."""
    from orchestrator.run.cluster import namespace

    pool = None
    while not stop.is_set():
        try:
            pool = pool or ray.get_actor(f"{name}/env-pool", namespace=namespace(name))
            where = ray.get(pool.session_workers.remote())
            if where:
                victim = ray.get(pool.worker_handles.remote())[next(iter(where.values()))]
                pid = ray.get(victim.pid.remote())
                os.kill(pid, signal.SIGKILL)
                captured.killed.append(pid)
                return
        except Exception:  # noqa: BLE001 - the pool is not up yet, or the trajectory ended meanwhile: try again
            pass
        time.sleep(0.05)


def train_killing_a_worker(ray: Any, cfg: RunConfig, name: str) -> tuple[list[dict[str, Any]], Captured]:
    """Train `cfg` as `name` with one pool worker killed mid-trajectory; (its history, what was captured)."""
    captured = Captured()
    real = phases.to_train_batch

    def capture(run: Any, selection: Any) -> Any:
        captured.run = run
        step = real(run, selection)
        captured.steps.append(Seen(resolve_training(step.batch),
                                   [s.trajectory for p in fetch(step.rollouts.payloads) for s in p.samples]))
        return step

    stop = threading.Event()
    killer = threading.Thread(target=kill_a_worker_holding_a_trajectory, args=(ray, name, captured, stop),
                              daemon=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(phases, "to_train_batch", capture)
    killer.start()
    try:
        history = train(cfg, name=name, show_progress=False)
    finally:
        stop.set()
        mp.undo()
    killer.join()
    return history, captured


def check_the_kill_lost_no_sample(cfg: RunConfig, history: list[dict[str, Any]], captured: Captured, steps: int,
                                  what: str, lost_counter: str, reward: str) -> None:
    """Every step trained, one worker killed while `what` was open, every step a whole batch; the pool replaced it
    and counted `lost_counter`; the trajectories it cut ended env_error without an environment reward, and their
    reward scored its fallback (counted as errors)."""
    assert [h["step"] for h in history] == list(range(1, steps + 1))
    assert len(captured.killed) == 1, f"no {what} was ever open to kill its worker"
    assert all(len(s.batch) == cfg.generation.generation_batch_size for s in captured.steps)  # no sample lost
    assert max(h["env_pool/replaced"] for h in history) >= 1 and max(h[lost_counter] for h in history) >= 1
    lost = [t for s in captured.steps for t in s.trajectories if t.stop_reason == "env_error"]
    assert lost and all(t.env_reward is None for t in lost)
    assert sum(h[f"rewards/{reward}/errors"] for h in history) >= len(lost)  # scored fallback, counted
