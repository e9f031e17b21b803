"""Chaos run: the long pipelined demo under repeated faults, injected from outside as a machine would.

    python bench/chaos.py                    # 2,000 steps: the issue's run
    python bench/chaos.py --steps 200        # the same schedule scaled to 200 steps
    python bench/chaos.py --steps 200 --two-node   # on cluster/local_cluster.sh, also killing the second node

At 2,000 steps the schedule is: a reward worker SIGKILLed every 100 steps, a generator every 500, the learner
once, a generator SIGSTOPped once, and (--two-node) the second node killed once; --steps N scales every interval
by N / 2,000. The run is `rayward run configs/pipelined.yaml` (its own embedded Ray, or the local cluster); the
victims are found among the driver's own process tree (`ray::<Class>` titles), so other work on the machine is
never touched. Prints each fault with the time to recover (until the next step is logged; for the learner, the
recovery's own record) and the steps lost, then checks: exit 0, every step trained with a full batch, no step's
samples trained twice (the final lineage of steps has each prompt draw once), and the run tree's memory (USS of
the driver and every process under it, and of the local cluster's nodes) near the end against step 100's (half
the run's, when shorter), each sampled with one live process of every actor class and no fault pending. The
generators' restart budget (cluster.generator_max_restarts) is set to the schedule's generator deaths.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FULL_STEPS = 2000
# The schedule at 2,000 steps: (what, every or at step).
REWARD_KILL_EVERY, GENERATOR_KILL_EVERY = 100, 500
LEARNER_KILL_AT, GENERATOR_STOP_AT, NODE_KILL_AT = 1250, 750, 1650
MEMORY_BASE_STEP = 100  # memory is compared with the run tree's at this step (scaled)
MEMORY_TOLERANCE = 0.05
# The end sample is taken this many steps before the last (a sample at the last step can catch the teardown).
MEMORY_END_MARGIN = 10
# A memory sample counts only while the run has one live process of each (a sample during a recovery would
# miss the restarting actor).
ROLES = ("Generator", "Learner", "RewardWorker")
# The run's faults.jsonl record that closes each fault (others: recovered when the next step is logged).
RECOVERY_RECORD = {"learner_kill": "learner_recovered", "generator_kill": "generator_restarted",
                   "generator_stop": "generator_restarted"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")] if path.exists() else []


def _procs(root: psutil.Process, cls: str, extra: list[psutil.Process] = ()) -> list[psutil.Process]:
    """The live processes of one actor class (Ray titles them `ray::<Class>...`) under the driver, or among
    `extra` (a local cluster's nodes)."""
    out = []
    for p in [*root.children(recursive=True), *extra]:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].startswith(f"ray::{cls}"):
            out.append(p)
    return out


def tree_mb(root: psutil.Process, extra: list[psutil.Process] = ()) -> float:
    """The run tree's memory: each process's unique set size (RSS would count the libraries every process maps,
    torch's included, once per process)."""
    total = 0
    for p in [root, *root.children(recursive=True), *extra]:
        try:
            total += p.memory_full_info().uss
        except psutil.Error:
            continue
    return total / 2**20


@dataclass
class Fault:
    kind: str
    step: int  # the last logged step when it was injected
    t: float  # time.monotonic() at injection
    t_wall: float = 0.0  # time.time() at injection (faults.jsonl's clock)
    recovered_s: float | None = None
    steps_lost: int = 0
    note: str = ""


@dataclass
class Schedule:
    steps: int
    reward_every: int
    generator_every: int
    learner_at: int
    stop_at: int
    node_at: int | None
    memory_at: int
    done: set = field(default_factory=set)

    @classmethod
    def scaled(cls, steps: int, two_node: bool) -> Schedule:
        f = steps / FULL_STEPS
        s = lambda n: max(2, round(n * f))  # noqa: E731
        return cls(steps, s(REWARD_KILL_EVERY), s(GENERATOR_KILL_EVERY), s(LEARNER_KILL_AT), s(GENERATOR_STOP_AT),
                   s(NODE_KILL_AT) if two_node else None, min(MEMORY_BASE_STEP, steps // 2))

    def generator_deaths(self) -> int:
        """How often the schedule takes a generator down (kills, the stop, the node): its restart budget."""
        return self.steps // self.generator_every + 1 + (self.node_at is not None)

    def due(self, step: int) -> list[str]:
        """Faults due at `step` not yet injected (each step at most once per kind)."""
        want = []
        if step % self.reward_every == 0:
            want.append(("reward_kill", step))
        if step % self.generator_every == 0 and step != self.stop_at:
            want.append(("generator_kill", step))
        for kind, at in (("learner_kill", self.learner_at), ("generator_stop", self.stop_at),
                         ("node_kill", self.node_at)):
            if at is not None and step == at:
                want.append((kind, step))
        out = [k for k, s in want if (k, s) not in self.done]
        self.done.update((k, step) for k in out)
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=FULL_STEPS, help="grpo.max_steps (the schedule scales with it)")
    ap.add_argument("--save-steps", type=int, default=None, help="grpo.save_steps (default: the reward-kill interval)")
    ap.add_argument("--hang-timeout", type=float, default=20.0, help="cluster.hang_timeout_s")
    ap.add_argument("--two-node", action="store_true", help="run on cluster/local_cluster.sh and kill its 2nd node")
    ap.add_argument("--dir", default="/tmp/rayward-chaos", help="logging.dir")
    ap.add_argument("--name", default=f"chaos-{os.getpid()}")
    args = ap.parse_args()

    sched = Schedule.scaled(args.steps, args.two_node)
    save = args.save_steps or sched.reward_every
    overrides = [f"grpo.max_steps={args.steps}", f"grpo.save_steps={save}", f"logging.dir={args.dir}",
                 f"cluster.hang_timeout_s={args.hang_timeout}", "cluster.max_failures=3",
                 f"cluster.generator_max_restarts={sched.generator_deaths()}",
                 "logging.check_logprob_parity=false", "logging.progress=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""}
    cluster = None
    if args.two_node:
        from tests.fixtures.cluster import Cluster

        cluster = Cluster()
        cluster.up(reward_nodes=2)  # reward workers on either reward node; the second one is killed
        overrides += [f"cluster.address={cluster.gcs}",
                      "cluster.reward_worker={num_cpus: 0.25, resources: {reward_node: 1}}",
                      "cluster.num_reward_workers=4"]
        env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    run_dir = Path(args.dir) / args.name
    log = open(Path(args.dir).mkdir(parents=True, exist_ok=True) or Path(args.dir) / f"{args.name}.out", "w")
    print(f"chaos: {args.steps} steps, save_steps {save}; reward worker SIGKILL every {sched.reward_every}, "
          f"generator SIGKILL every {sched.generator_every}, learner SIGKILL at {sched.learner_at}, generator "
          f"SIGSTOP at {sched.stop_at}" + (f", second node killed at {sched.node_at}" if sched.node_at else "")
          + f"; run dir {run_dir}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "configs/pipelined.yaml", *overrides,
                             "--name", args.name], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)

    def cluster_procs() -> list[psutil.Process]:
        """The local cluster's nodes (their raylets and workers are not under the driver)."""
        out = []
        for line in (cluster.dir / "pids").read_text().splitlines() if cluster else []:
            try:
                p = psutil.Process(int(line.split()[0]))
                out += [p, *p.children(recursive=True)]
            except psutil.Error:
                continue
        return out
    faults: list[Fault] = []
    pending: list[Fault] = []
    mem_base = mem_end = None
    seen = 0
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            rows = _rows(run_dir / "metrics.jsonl")
            step = max((r["step"] for r in rows), default=0)
            if step > seen:
                now = time.monotonic()
                for f in pending:
                    if f.kind in ("reward_kill", "node_kill"):
                        f.recovered_s = now - f.t
                pending = [f for f in pending if f.recovered_s is None]
                seen_before, seen = seen, step
                extra = cluster_procs()
                whole = not pending and all(_procs(root, cls, extra) for cls in ROLES)
                if whole and step >= sched.memory_at and mem_base is None:
                    mem_base = (step, tree_mb(root, extra))
                if whole and step >= sched.steps - MEMORY_END_MARGIN and mem_end is None:
                    mem_end = (step, tree_mb(root, extra))
                due = [k for s in range(seen_before + 1, step + 1) for k in sched.due(s)]  # none skipped
                for kind in due:
                    f = inject(kind, step, root, cluster, extra)
                    if f is not None:
                        faults.append(f)
                        pending.append(f)
                        print(f"chaos: step {step}: {f.kind} {f.note}", flush=True)
            records = _rows(run_dir / "faults.jsonl")
            for f in pending:  # the run's own record of the recovery (the pipelined loop logs steps ahead of it)
                kind = RECOVERY_RECORD.get(f.kind)
                recs = [r for r in records if r["kind"] == kind and r["time"] >= f.t_wall]
                if kind is not None and recs:
                    f.recovered_s, f.steps_lost = recs[0]["time"] - f.t_wall, recs[0].get("steps_lost", 0)
            pending = [f for f in pending if f.recovered_s is None]
    finally:
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
        if cluster is not None:
            cluster.down(keep_logs=rc != 0)
        log.close()
    return report(rc, time.monotonic() - t0, faults, run_dir, sched, mem_base, mem_end, Path(log.name))


def inject(kind: str, step: int, root: psutil.Process, cluster, extra: list[psutil.Process]) -> Fault | None:
    cls, sig = {"reward_kill": ("RewardWorker", signal.SIGKILL), "generator_kill": ("Generator", signal.SIGKILL),
                "learner_kill": ("Learner", signal.SIGKILL), "generator_stop": ("Generator", signal.SIGSTOP),
                "node_kill": (None, None)}[kind]
    f = Fault(kind, step, time.monotonic(), time.time())
    if kind == "node_kill":
        from tests.fixtures.cluster import SCRIPT

        subprocess.run(["bash", str(SCRIPT), "kill-node", "2"], env=cluster.env, capture_output=True, timeout=60)
        f.note = "(local_cluster.sh kill-node 2)"
        return f
    victims = _procs(root, cls, extra)
    if not victims:
        print(f"chaos: step {step}: no live ray::{cls} to {kind}", flush=True)
        return None
    victims[0].send_signal(sig)
    f.note = f"(pid {victims[0].pid})"
    return f


def lineage_draws(samples: list[dict]) -> tuple[list[int], int]:
    """The prompt draws (prompt_index) of the run's final lineage: a step's samples as last trained (a step trained
    again after a rewind replaces the lost training's rows, which came before); and how many trainings a rewind
    discarded."""
    trainings: list[tuple[int, list[dict]]] = []
    for s in samples:  # consecutive rows of one step are one training
        if not trainings or trainings[-1][0] != s["step"]:
            trainings.append((s["step"], []))
        trainings[-1][1].append(s)
    last = {step: rows for step, rows in trainings}
    draws = [d for rows in last.values() for d in sorted({r["prompt_index"] for r in rows})]
    return draws, len(trainings) - len(last)


def report(rc: int, wall: float, faults: list[Fault], run_dir: Path, sched: Schedule, mem_base, mem_end,
           log: Path) -> int:
    rows = [r for r in _rows(run_dir / "metrics.jsonl") if "loss" in r]
    last = {r["step"]: r for r in rows}  # a step trained again after a rewind: its last row is the one kept
    groups = {r.get("batch/groups") for r in last.values()}
    draws, retrained = lineage_draws(_rows(run_dir / "completions.jsonl"))
    twice = len(draws) - len(set(draws))
    print("\nchaos: faults")
    print(f"  {'step':>6}  {'fault':<16} {'recovered in':>13}  {'steps lost':>10}  note")
    for f in faults:
        rec = f"{f.recovered_s:.1f} s" if f.recovered_s is not None else "-"
        print(f"  {f.step:>6}  {f.kind:<16} {rec:>13}  {f.steps_lost:>10}  {f.note}")
    for r in _rows(run_dir / "faults.jsonl"):
        print(f"  run's record: {r['kind']}: {r['message']}")
    lost = sum(f.steps_lost for f in faults)
    print(f"\nchaos: exit {rc} after {wall:.0f} s; steps trained {len(last)}/{sched.steps} "
          f"(rows {len(rows)}, {len(rows) - len(last)} retrained after rewinds, {lost} lost in recoveries)")
    print(f"chaos: groups per step {sorted(g for g in groups if g is not None)} (a full batch is one value); "
          f"prompt draws in the trained lineage {len(draws)}, trained twice {twice}; trainings discarded by a "
          f"rewind {retrained}")
    if mem_base and mem_end:
        growth = mem_end[1] / mem_base[1] - 1
        print(f"chaos: run-tree memory (USS) {mem_base[1]:.0f} MB at step {mem_base[0]} -> {mem_end[1]:.0f} MB at step "
              f"{mem_end[0]} ({growth:+.1%}; goal within {MEMORY_TOLERANCE:.0%})")
    grew = mem_base is None or mem_end is None or mem_end[1] / mem_base[1] - 1 > MEMORY_TOLERANCE
    if grew:
        print("chaos: memory goal not met" + ("" if mem_base and mem_end else " (no sample with every actor alive)"))
    ok = rc == 0 and len(last) == sched.steps and len(groups) == 1 and twice == 0 and not grew
    print(f"chaos: {'OK' if ok else 'FAILED'} (driver output: {log})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
