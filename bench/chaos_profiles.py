"""bench/chaos.py's profiles: which runs, with which faults, when.

A profile is one run or more (parts), each written as a config from a shipped preset (configs/) with the pieces
the profile adds, and a fault schedule in fractions of the run's steps (so `--steps N` scales it):

- `demo`: configs/pipelined.yaml, the original chaos run (reward workers, the generator, a generator hang, the
  learner, a node).
- `models`: the demo's reward beside an LLM judge (configs/judge.yaml, gated by the letter reward) and a
  distillation teacher (configs/distill.yaml); faults in the reward, judge and teacher pools, a hang in each engine
  kind, the generator and the learner. `--loop async` runs it in async mode.
- `agentic`: two runs. `tools`: TRL's environment class with tools (configs/tools.yaml) on streamed shards that hold
  bad rows (`data.on_bad_row: skip`), with a judge gated by the environment's reward. `agent`: an OpenAI-SDK agent
  through the endpoint (configs/agent.yaml's, wrapped to raise or hang now and then: bench/chaos_agent.py) on the
  difficulty curriculum, with the same gated judge. Faults in the reward, environment or agent, and judge pools, the
  generator (killed and hung), the learner.

Every part also takes a SIGTERM to its process group (as SLURM or Kubernetes stops a job) and is continued with
`--resume auto`; with `--two-node` a node of a local two-node cluster is killed.
"""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class FaultKind:
    cls: str | None  # the actor class whose process (`ray::<cls>`) takes the signal; None: not a process of the run
    sig: int | None
    # The run's faults.jsonl record that closes the fault; None: recovered when the next step is logged.
    recovery: str | None = None


FAULTS = {
    "reward_kill": FaultKind("RewardWorker", signal.SIGKILL),
    "env_kill": FaultKind("EnvWorker", signal.SIGKILL),
    "agent_kill": FaultKind("AgentWorker", signal.SIGKILL),
    "judge_kill": FaultKind("JudgeEngine", signal.SIGKILL),
    "judge_hang": FaultKind("JudgeEngine", signal.SIGSTOP),
    "teacher_kill": FaultKind("TeacherEngine", signal.SIGKILL),
    "teacher_hang": FaultKind("TeacherEngine", signal.SIGSTOP),
    "generator_kill": FaultKind("Generator", signal.SIGKILL, "generator_restarted"),
    "generator_hang": FaultKind("Generator", signal.SIGSTOP, "generator_restarted"),
    "learner_kill": FaultKind("Learner", signal.SIGKILL, "learner_recovered"),
    "node_kill": FaultKind(None, None),
    "sigterm": FaultKind(None, signal.SIGTERM),
}
GENERATOR_DEATHS = ("generator_kill", "generator_hang", "node_kill")


@dataclass(frozen=True)
class Part:
    """One run of a profile."""

    name: str
    preset: str  # configs/<preset>.yaml, the run's base
    steps: int  # its length at full scale (`--steps` scales every part alike)
    # fault kind -> ("every", fraction) or ("at", fractions): when, in fractions of the run's steps.
    schedule: dict[str, tuple[str, Any]]
    roles: tuple[str, ...]  # the actor classes a memory sample waits for (one live process of each)
    edit: Callable[[dict[str, Any], Path], None] = lambda cfg, d: None  # the profile's pieces, on the preset's dict
    overrides: tuple[str, ...] = ()

    def config(self, out_dir: Path, loop: str | None) -> Path:
        """Write the part's config (the preset, edited) to out_dir; returns its path."""
        cfg = yaml.safe_load((ROOT / "configs" / f"{self.preset}.yaml").read_text())
        self.edit(cfg, out_dir)
        if loop is not None:
            cfg.setdefault("loop", {})["mode"] = loop
        path = out_dir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path


@dataclass
class Schedule:
    """A part's faults at `steps` steps: each kind's steps, each injected once."""

    steps: int
    at: dict[str, set[int]]
    done: set = field(default_factory=set)

    @classmethod
    def of(cls, part: Part, steps: int, two_node: bool) -> Schedule:
        at: dict[str, set[int]] = {}
        for kind, (how, when) in part.schedule.items():
            if kind == "node_kill" and not two_node:
                continue
            if how == "every":
                every = max(2, round(when * steps))
                at[kind] = set(range(every, steps, every))  # none at the last step: no step after it to recover in
            else:
                at[kind] = {max(2, round(f * steps)) for f in when}
        return cls(steps, at)

    def count(self, *kinds: str) -> int:
        return sum(len(self.at.get(k, ())) for k in kinds)

    def due(self, step: int) -> list[str]:
        """Faults due at `step` not yet injected."""
        out = [k for k, steps in self.at.items() if step in steps and (k, step) not in self.done]
        self.done.update((k, step) for k in out)
        return out


# --- the pieces the profiles add -------------------------------------------------------------------------------------

# The judge's reading of an agentic conversation: its first characters (the tiny judge is the letter task's, so its
# verdicts mean little here; the run exercises the judge pool, its gate and its faults).
CONVERSATION_TEMPLATE = "{conversation:.40}\nCorrect?"
# Seconds a judge or teacher call may run before its engine is presumed hung: the reward's timeout_s plus
# cluster.hang_timeout_s (actors/engines/pool.py); short, so a hang costs the run seconds, not minutes.
ENGINE_TIMEOUT_S = 20


def _judge(gate_on: str, template: str | None = None) -> dict[str, Any]:
    judge = yaml.safe_load((ROOT / "configs" / "judge.yaml").read_text())["rewards"][1]
    judge["gate"] = {"reward": gate_on, "threshold": 0.5}
    judge["timeout_s"] = ENGINE_TIMEOUT_S
    if template is not None:
        judge["judge"]["template"] = template
        judge["judge"]["engines"]["max_model_len"] = 256
    return judge


def _models(cfg: dict[str, Any], out: Path) -> None:
    """The letter reward, a judge gated by it, a distillation teacher."""
    cfg["rewards"][1]["timeout_s"] = ENGINE_TIMEOUT_S
    cfg["distillation"] = yaml.safe_load((ROOT / "configs" / "distill.yaml").read_text())["distillation"]
    cfg["distillation"]["timeout_s"] = ENGINE_TIMEOUT_S


# Streamed shards: SHARDS jsonl files of the box task's rows, with bad rows a user's pipeline leaves behind.
SHARDS = 4
SHARD_ROWS = 64


def write_box_shards(out: Path, seed: int = 0) -> tuple[Path, int]:
    """Box-task rows in SHARDS jsonl shards under out/shards, with bad rows: one without the prompt column, one with
    an extra column (another schema), one truncated line, and an empty shard. Returns the directory and how many
    bad rows it holds."""
    from orchestrator.builtin.tasks.boxes import boxes_dataset

    d = out / "shards"
    d.mkdir(parents=True, exist_ok=True)
    rows = boxes_dataset(SHARDS * SHARD_ROWS, seed=seed)
    rng = random.Random(seed)
    bad = 0
    for i in range(SHARDS):
        lines = [json.dumps(r) for r in rows[i * SHARD_ROWS:(i + 1) * SHARD_ROWS]]
        where = rng.randrange(1, len(lines))
        if i == 0:
            lines.insert(where, json.dumps({"box": 1, "seed": 7}))  # no prompt
        elif i == 1:
            lines.insert(where, json.dumps({**rows[0], "difficulty": "hard"}))  # another schema
        elif i == 2:
            lines.insert(where, json.dumps(rows[0])[:25])  # truncated mid-row
        bad += i < 3
        (d / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")
    (d / f"part-{SHARDS:03d}.jsonl").write_text("")  # an empty shard
    return d, bad


def _tools(cfg: dict[str, Any], out: Path) -> None:
    """Streamed shards with bad rows, skipped; a judge gated by the environment's reward."""
    shards, _ = write_box_shards(out)
    cfg["data"] = {"path": str(shards), "streaming": True, "on_bad_row": "skip", "shuffle_buffer_size": 64}
    cfg["rewards"].append(_judge("BoxEnv", CONVERSATION_TEMPLATE))


def _agent(cfg: dict[str, Any], out: Path) -> None:
    """The flaky endpoint agent, the difficulty curriculum, a judge gated by the agent's reward."""
    cfg["agent_function"] = "bench.chaos_agent:flaky_box_agent"
    cfg["agent"]["trajectory_timeout_s"] = 30  # the flaky agent's hangs end here
    cfg["rewards"] = [{"name": "flaky_box_agent", "weight": 1.0}, _judge("flaky_box_agent", CONVERSATION_TEMPLATE)]
    cfg["data"]["sampler"] = "difficulty"
    cfg["data"]["difficulty"] = {"pass_threshold": 0.5, "rest_after": 2, "rest_steps": 20}


ENGINE_ROLES = ("Generator", "Learner", "RewardWorker")

PROFILES: dict[str, list[Part]] = {
    "demo": [Part("demo", "pipelined", 2000, {
        "reward_kill": ("every", 0.05), "generator_kill": ("at", (0.25, 0.5, 0.75)),
        "generator_hang": ("at", (0.375,)), "learner_kill": ("at", (0.625,)), "node_kill": ("at", (0.825,)),
    }, ENGINE_ROLES)],
    "models": [Part("models", "judge", 200, {
        "reward_kill": ("every", 0.1), "judge_kill": ("at", (0.15, 0.55)), "teacher_kill": ("at", (0.25, 0.65)),
        "judge_hang": ("at", (0.4,)), "teacher_hang": ("at", (0.75,)), "generator_kill": ("at", (0.3,)),
        "generator_hang": ("at", (0.85,)), "learner_kill": ("at", (0.5,)), "sigterm": ("at", (0.2,)),
        "node_kill": ("at", (0.9,)),
    }, (*ENGINE_ROLES, "JudgeEngine", "TeacherEngine"), _models)],
    "agentic": [
        Part("tools", "tools", 60, {
            "reward_kill": ("every", 0.2), "env_kill": ("at", (0.15, 0.5, 0.8)), "judge_kill": ("at", (0.3,)),
            "judge_hang": ("at", (0.6,)), "generator_kill": ("at", (0.4,)), "generator_hang": ("at", (0.7,)),
            "learner_kill": ("at", (0.55,)), "sigterm": ("at", (0.2,)), "node_kill": ("at", (0.9,)),
        }, (*ENGINE_ROLES, "EnvWorker", "JudgeEngine"), _tools),
        Part("agent", "agent", 60, {
            "reward_kill": ("every", 0.2), "agent_kill": ("at", (0.15, 0.5, 0.8)), "judge_kill": ("at", (0.3,)),
            "judge_hang": ("at", (0.6,)), "generator_kill": ("at", (0.4,)), "generator_hang": ("at", (0.7,)),
            "learner_kill": ("at", (0.55,)), "sigterm": ("at", (0.2,)), "node_kill": ("at", (0.9,)),
        }, (*ENGINE_ROLES, "AgentWorker", "JudgeEngine"), _agent),
    ],
}
