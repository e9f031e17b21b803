"""The box task learns in `loop.mode: async`, both agentic paths: configs/tools.yaml (TRL's environment class: the agent
loop in the generator) and configs/agent.yaml (the `openai` agent on the generator's endpoint), on the local Ray
cluster with real vLLM, environment pool, reward pool and learner. The generators never wait for a batch boundary, so
trajectories run across weight loads (their turns under several versions); every step still trains a whole batch
and the reward rises as it does in the pipelined loop, which runs the same settings against the same bar.
(Async's accounting: tests/unit/orchestrator/loop/test_feed.py; the demo in async:
tests/integration/runs/test_async.py.)"""

from __future__ import annotations

import time

import pytest

from orchestrator.config import load_config
from orchestrator.run.train import train
from tests.conftest import ROOT

# The presets' own settings but the run's length: the tiny tool model's reward has risen well past the first steps'
# by then in both loops (bench/README.md "Learning with tools"; the endpoint's 80-step curve).
STEPS = 60
# Steps averaged at each end of the run.
WINDOW = 5
# How far the last steps' reward must be above the first steps' (the box task's reward is in [0, 1]; a policy that
# never opens a box scores at most 1/900): well above the first steps' spread between seeds.
RISE = 0.15
TASKS = {"tools": ("tools.yaml", "rewards/BoxEnv/mean"), "agent": ("agent.yaml", "rewards/box_agent/mean")}
# The loops compared, as overrides. async-keep: trajectories go on across a load on the old weights' KV cache
# (generation.kv_after_update keep), on the environment-class path (the endpoint's requests enter the same engine
# loop, which salts them alike).
MODES = {"async": ["loop.mode=async"], "pipelined": ["loop.mode=pipelined"],
         "async-keep": ["loop.mode=async", "generation.kv_after_update=keep"]}
RUNS = [("tools", "async"), ("tools", "pipelined"), ("tools", "async-keep"), ("agent", "async"), ("agent", "pipelined")]


@pytest.mark.parametrize(("task", "mode"), RUNS, ids=[f"{t}-{m}" for t, m in RUNS])
def test_the_box_task_learns(ray_cluster, tmp_path, task: str, mode: str) -> None:
    config, reward = TASKS[task]
    cfg = load_config(ROOT / "configs" / config, [f"logging.dir={tmp_path}", *MODES[mode],
                                                  f"grpo.max_steps={STEPS}"])
    t0 = time.monotonic()
    history = train(cfg, name=f"{task}-{mode}", show_progress=False)
    wall = time.monotonic() - t0
    rows = [h for h in history if "step" in h and reward in h]
    assert [h["step"] for h in rows] == list(range(1, STEPS + 1))
    groups = cfg.generation.generation_batch_size // cfg.generation.num_generations
    assert all(h["batch/groups"] == groups for h in rows)  # every step a whole batch
    if cfg.loop.mode == "async":
        assert max(h["async/version_lag/max"] for h in rows) <= cfg.loop.max_staleness
        assert sum(h["async/loads_in_flight"] for h in rows) > 0  # loads landed while trajectories ran
    rewards = [h[reward] for h in rows]
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    windows = [round(sum(rewards[i:i + 10]) / len(rewards[i:i + 10]), 3) for i in range(0, STEPS, 10)]
    print(f"{task} {mode}: reward first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}; by 10 steps {windows}; "
          f"{STEPS} steps in {wall:.0f} s")
    assert last > first + RISE, (first, last, windows)
