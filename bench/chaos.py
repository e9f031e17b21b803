"""Chaos runs: long runs under repeated faults, injected from outside as a machine would.

    python bench/chaos.py                              # the demo, 2,000 pipelined steps (profile `demo`)
    python bench/chaos.py --profile models             # a judge and a distillation teacher beside the demo's reward
    python bench/chaos.py --profile models --loop async
    python bench/chaos.py --profile agentic            # an environment class with tools; an OpenAI-SDK agent
    python bench/chaos.py --steps 200                  # every part's schedule scaled to 200 steps
    python bench/chaos.py --two-node                   # on cluster/local_cluster.sh, also killing its second node

The profiles (their runs, pieces and fault schedules) are in bench/chaos_profiles.py. Each part is `rayward run`
of a config written from a preset (its own embedded Ray, or the local cluster); the victims are found among the
driver's own process tree (`ray::<Class>` titles), so other work on the machine is never touched. A SIGTERM goes to
the driver's process group, as a scheduler sends it, and the part continues with `--resume auto`.

Prints each fault with the time to recover and the steps lost. "Recovered in": for a worker or engine, until a new
process of its class is alive and a step is logged; for the learner and the generator, the run's own record in
faults.jsonl; for the SIGTERM, until the resumed run logs a step. Then checks: exit 0, every step trained with a
full batch, no prompt draw trained twice (the final lineage of steps has each draw once), what went missing and
was counted (reward timeouts and errors, teacher failures, skipped rows, failed trajectories), the run tree's memory
(USS of the driver and every process under it, and of the local cluster's nodes) in its last tenth against its first
tenth after the last resume, each sampled with one live process of every actor class and no fault pending, and the
object store's use at both. The generators' restart budget (cluster.generator_max_restarts) is the schedule's
generator deaths.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.chaos_profiles import FAULTS, GENERATOR_DEATHS, PROFILES, Part, Schedule  # noqa: E402

MEMORY_TOLERANCE = 0.05
# The end sample is taken this many steps before the last (a sample at the last step can catch the teardown).
MEMORY_END_MARGIN = 10
# Seconds a SIGTERMed run has to checkpoint and exit before it is killed.
SIGTERM_WAIT_S = 300
# Metrics that count what a run went on without: a sample trained without it is counted there, never silent.
# The driver's line when a resume cannot load a checkpoint (it falls back to an older one): a lost checkpoint.
UNLOADABLE = re.compile(r"checkpoint-\d+ could not be loaded")
# Of those, the run's running counts (the metric holds the total so far) and per-step shares (of trajectories).
RUNNING = ("data/skipped_rows",)
SHARES = ("multiturn/stop_reason/timeout", "multiturn/stop_reason/env_error")
COUNTED = re.compile(r"^(rewards/[^/]+/(timeouts|errors)|distill/teacher_failures|data/skipped_rows"
                     r"|data_plane/lost_groups|multiturn/stop_reason/(timeout|env_error))$")


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")] if path.exists() else []


def _procs(root: psutil.Process, cls: str, extra: list[psutil.Process] = ()) -> list[psutil.Process]:
    """The live (not stopped) processes of one actor class under the driver, or among `extra` (a local cluster's
    nodes). Ray titles an actor's process `ray::<Class>.<method>`, a named actor's `ray::<name>:<Class>.<method>`."""
    out = []
    for p in [*root.children(recursive=True), *extra]:
        try:
            cmd = p.cmdline()
            if cmd and re.match(rf"ray::(\S*:)?{cls}(\.|$|\s)", cmd[0]) and p.status() not in (
                    psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                out.append(p)
        except psutil.Error:
            continue
    return out


def tree_mb(root: psutil.Process, extra: list[psutil.Process] = ()) -> dict[str, float]:
    """The run tree's memory by kind of process (`process_kind`): each process's unique set size (RSS would count the
    libraries every process maps, torch's included, once per process), in MB."""
    out: dict[str, float] = {}
    for p in [root, *root.children(recursive=True), *extra]:
        try:
            k = "driver" if p.pid == root.pid else process_kind(p.cmdline())
            out[k] = out.get(k, 0.0) + p.memory_full_info().uss / 2**20
        except psutil.Error:
            continue
    return out


def process_kind(cmd: list[str]) -> str:
    """A process's kind for the memory breakdown: an actor's class (`ray::<name>:<Class>.<method>`), a Ray
    daemon's name (raylet, gcs_server, the dashboard, ...), or its program."""
    if not cmd:
        return "?"
    m = re.match(r"ray::(?:\S*:)?([A-Za-z_]\w*)", cmd[0])
    if m:
        return m.group(1)
    words = [w for w in cmd[:4] if not w.startswith("-")]
    for w in reversed(words):
        name = Path(w).name
        if name and not name.startswith("python"):
            return name[:40]
    return Path(cmd[0]).name[:40]


def object_store_mb(root: psutil.Process, gcs: str | None) -> float | None:
    """The object store's use across the cluster (`ray memory --stats-only`), or None when it cannot be read. The
    embedded cluster's GCS picks its port at start: tried are the ports its gcs_server listens on."""
    addresses = [gcs] if gcs else []
    for p in [] if gcs else root.children(recursive=True):
        try:
            cmd = p.cmdline()
            if cmd and cmd[0].endswith("gcs_server"):
                ip = next((a.split("=", 1)[1] for a in cmd if a.startswith("--node-ip-address=")), "127.0.0.1")
                addresses = [f"{ip}:{c.laddr.port}" for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
                break
        except psutil.Error:
            continue
    for address in addresses:
        r = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "memory", "--stats-only", "--address",
                            address], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "RAY_AUTH_MODE": "token"})
        m = re.search(r"Plasma memory usage (\d+) MiB", r.stdout)
        if m:
            return float(m.group(1))
    return None


@dataclass
class Fault:
    kind: str
    step: int  # the last logged step when it was injected
    t: float  # time.monotonic() at injection
    t_wall: float = 0.0  # time.time() at injection (faults.jsonl's clock)
    before: frozenset[int] = frozenset()  # the victim class's pids before the fault
    recovered_s: float | None = None
    steps_lost: int = 0
    note: str = ""


@dataclass
class Sample:
    step: int
    by_kind: dict[str, float]  # MB of USS per kind of process (`process_kind`)
    store_mb: float | None = None

    @property
    def tree_mb(self) -> float:
        return sum(self.by_kind.values())

    def grown(self, first: Sample, top: int = 5) -> str:
        """The kinds of process whose memory changed most since `first`, for the report."""
        kinds = set(self.by_kind) | set(first.by_kind)
        delta = sorted(((self.by_kind.get(k, 0.0) - first.by_kind.get(k, 0.0), k) for k in kinds),
                       key=lambda d: -abs(d[0]))
        return ", ".join(f"{k} {d:+.0f} MB" for d, k in delta[:top])

    @classmethod
    def now(cls, step: int, root: psutil.Process, extra: list[psutil.Process], gcs: str | None) -> Sample:
        """The run tree's memory now; the object store's once `ray memory` answers (a thread: it takes seconds,
        while the monitor must keep injecting faults on time)."""
        sample = cls(step, tree_mb(root, extra))

        def read() -> None:
            try:
                sample.store_mb = object_store_mb(root, gcs)
            except (subprocess.SubprocessError, OSError, psutil.Error):
                pass  # reported as not read

        threading.Thread(target=read, daemon=True).start()
        return sample


@dataclass
class PartResult:
    part: str
    ok: bool
    lines: list[str]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="demo")
    ap.add_argument("--part", default=None, help="run only this part of the profile (agentic: tools or agent)")
    ap.add_argument("--loop", choices=("pipelined", "async"), default=None, help="loop.mode (default: the preset's)")
    ap.add_argument("--steps", type=int, default=None, help="grpo.max_steps of each part (default: the profile's; "
                                                           "the schedule scales with it)")
    ap.add_argument("--save-steps", type=int, default=None, help="grpo.save_steps (default: a twentieth of the run)")
    ap.add_argument("--hang-timeout", type=float, default=20.0, help="cluster.hang_timeout_s")
    ap.add_argument("--two-node", action="store_true", help="run on cluster/local_cluster.sh and kill its 2nd node")
    ap.add_argument("--no-faults", action="store_true",
                    help="the same run without faults (its memory: the run's own, against the faults')")
    ap.add_argument("--dir", default="/tmp/rayward-chaos", help="logging.dir")
    ap.add_argument("--name", default=f"chaos-{os.getpid()}")
    args = ap.parse_args()
    parts = [p for p in PROFILES[args.profile] if args.part in (None, p.name)]
    if not parts:
        ap.error(f"--part {args.part}: the profile {args.profile!r} has {[p.name for p in PROFILES[args.profile]]}")
    results = [run_part(part, args) for part in parts]
    if len(results) > 1:
        print("\nchaos: " + ", ".join(f"{r.part} {'OK' if r.ok else 'FAILED'}" for r in results))
    return 0 if all(r.ok for r in results) else 1


def run_part(part: Part, args: argparse.Namespace) -> PartResult:
    steps = args.steps or part.steps
    sched = Schedule.of(part, steps, args.two_node) if not args.no_faults else Schedule(steps, {})
    save = args.save_steps or max(2, steps // 20)
    name = f"{args.name}-{part.name}"
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-config").mkdir(exist_ok=True)
    config = part.config(out / f"{name}-config", args.loop)
    overrides = [f"grpo.max_steps={steps}", f"grpo.save_steps={save}", f"logging.dir={out}",
                 f"cluster.hang_timeout_s={args.hang_timeout}", "cluster.max_failures=3",
                 f"cluster.generator_max_restarts={sched.count(*GENERATOR_DEATHS) + 1}",
                 "logging.check_logprob_parity=false", "logging.progress=false", *part.overrides]
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
    run_dir = out / name
    log = open(out / f"{name}.out", "w")
    plan = ", ".join(f"{k} at {sorted(v)}" if len(v) <= 4 else f"{k} every {min(v)}" for k, v in sched.at.items())
    print(f"\nchaos [{part.name}]: {steps} steps of configs/{part.preset}.yaml + the profile's pieces ({config}), "
          f"save_steps {save}, loop {args.loop or 'preset'}; faults: {plan}; run dir {run_dir}", flush=True)

    def start(*extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(config), *overrides, "--name", name,
                                 *extra], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: the SIGTERM's target

    def cluster_procs() -> list[psutil.Process]:
        """The local cluster's nodes (their raylets and workers are not under the driver)."""
        found = []
        for line in (cluster.dir / "pids").read_text().splitlines() if cluster else []:
            try:
                p = psutil.Process(int(line.split()[0]))
                found += [p, *p.children(recursive=True)]
            except psutil.Error:
                continue
        return found

    t0 = time.monotonic()
    proc = start()
    root = psutil.Process(proc.pid)
    faults: list[Fault] = []
    pending: list[Fault] = []
    first: Sample | None = None
    last: Sample | None = None
    first_after = max(2, steps // 10)  # the first memory sample's step (moved past a resume)
    seen = 0
    stopped: list[str] = []  # how each driver before the last ended (a SIGTERM's note)
    trail: list[Sample] = []  # the run tree's memory about every tenth of the run, after the last resume
    try:
        while True:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
            rows = _rows(run_dir / "metrics.jsonl")
            step = max((r["step"] for r in rows), default=0)
            if step > seen:
                extra = cluster_procs()
                for f in pending:
                    cls = FAULTS[f.kind].cls
                    if FAULTS[f.kind].recovery is None and f.kind != "sigterm" and (
                            cls is None or {p.pid for p in _procs(root, cls, extra)} - f.before):
                        f.recovered_s = time.monotonic() - f.t
                pending = [f for f in pending if f.recovered_s is None]
                seen_before, seen = seen, step
                whole = not pending and all(_procs(root, cls, extra) for cls in part.roles)
                if whole and step >= first_after and first is None:
                    first = Sample.now(step, root, extra, cluster and cluster.gcs)
                if whole and step >= steps - MEMORY_END_MARGIN and last is None:
                    last = Sample.now(step, root, extra, cluster and cluster.gcs)
                if whole and first is not None and (not trail or step >= trail[-1].step + steps // 10):  # between
                    trail.append(Sample(step, tree_mb(root, extra)))
                for kind in [k for s in range(seen_before + 1, step + 1) for k in sched.due(s)]:  # none skipped
                    if kind == "sigterm":
                        f, proc = sigterm(proc, step, start, run_dir)
                        stopped.append(f.note)
                        root, seen, first, trail = psutil.Process(proc.pid), 0, None, []
                        first_after = step + max(2, steps // 10)
                    else:
                        f = inject(kind, step, root, cluster, extra)
                    if f is not None:
                        faults.append(f)
                        pending.append(f)
                        print(f"chaos [{part.name}]: step {step}: {f.kind} {f.note}", flush=True)
                    if kind == "sigterm":
                        break
            records = _rows(run_dir / "faults.jsonl")
            for f in pending:  # the run's own record of the recovery (the pipelined loop logs steps ahead of it)
                kind = FAULTS[f.kind].recovery
                recs = [r for r in records if r["kind"] == kind and r["time"] >= f.t_wall]
                if kind is not None and recs:
                    f.recovered_s, f.steps_lost = recs[0]["time"] - f.t_wall, recs[0].get("steps_lost", 0)
                if f.kind == "sigterm" and seen > f.steps_lost:  # the resumed run logged a step past its checkpoint
                    f.recovered_s = time.monotonic() - f.t
                    f.steps_lost = max(0, f.step - f.steps_lost)  # the driver checkpoints as it stops
            pending = [f for f in pending if f.recovered_s is None]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        if cluster is not None:
            cluster.down(keep_logs=rc != 0)
        log.close()
    return report(part.name, rc, time.monotonic() - t0, faults, run_dir, sched, first, last, Path(log.name), stopped,
                  trail)


def sigterm(proc: subprocess.Popen, step: int, start, run_dir: Path) -> tuple[Fault, subprocess.Popen]:
    """SIGTERM to the driver's process group (as SLURM or Kubernetes stops a job); once it has exited, the same run
    with `--resume auto`. The fault's steps_lost holds the checkpoint's step until the resumed run passes it."""
    f = Fault("sigterm", step, time.monotonic(), time.time())
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        rc = proc.wait(SIGTERM_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    try:  # what the group left behind (a Ray worker that outlived its raylet) goes with it
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    ckpts = sorted(int(p.name.split("-")[-1]) for p in run_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit())
    f.steps_lost = ckpts[-1] if ckpts else 0
    f.note = f"(process group {proc.pid}; exit {rc}, checkpoint at step {f.steps_lost}; resumed with --resume auto)"
    return f, start("--resume", "auto")


def inject(kind: str, step: int, root: psutil.Process, cluster, extra: list[psutil.Process]) -> Fault | None:
    f = Fault(kind, step, time.monotonic(), time.time())
    if kind == "node_kill":
        from tests.fixtures.cluster import SCRIPT

        subprocess.run(["bash", str(SCRIPT), "kill-node", "2"], env=cluster.env, capture_output=True, timeout=60)
        f.note = "(local_cluster.sh kill-node 2)"
        return f
    cls, sig = FAULTS[kind].cls, FAULTS[kind].sig
    victims = _procs(root, cls, extra)
    if not victims:
        print(f"chaos: step {step}: no live ray::{cls} to {kind}", flush=True)
        return None
    f.before = frozenset(p.pid for p in victims)
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


def report(part: str, rc: int, wall: float, faults: list[Fault], run_dir: Path, sched: Schedule,
           first: Sample | None, last: Sample | None, log: Path, stopped: list[str],
           trail: list[Sample] = ()) -> PartResult:
    lines: list[str] = []
    say = lines.append
    rows = [r for r in _rows(run_dir / "metrics.jsonl") if "loss" in r]
    kept = {r["step"]: r for r in rows}  # a step trained again after a rewind: its last row is the one kept
    groups = {r.get("batch/groups") for r in kept.values()}
    draws, retrained = lineage_draws(_rows(run_dir / "completions.jsonl"))
    twice = len(draws) - len(set(draws))
    say(f"chaos [{part}]: faults")
    say(f"  {'step':>6}  {'fault':<16} {'recovered in':>13}  {'steps lost':>10}  note")
    for f in faults:
        rec = f"{f.recovered_s:.1f} s" if f.recovered_s is not None else "-"
        say(f"  {f.step:>6}  {f.kind:<16} {rec:>13}  {f.steps_lost:>10}  {f.note}")
    say(f"chaos [{part}]: per fault kind (count, recovered in: max, steps lost)")
    for kind in dict.fromkeys(f.kind for f in faults):
        mine = [f for f in faults if f.kind == kind]
        recs = [f.recovered_s for f in mine if f.recovered_s is not None]
        say(f"  {kind:<16} {len(mine):>3}  {max(recs):>7.1f} s  {sum(f.steps_lost for f in mine):>4}"
            + ("" if len(recs) == len(mine) else f"  ({len(mine) - len(recs)} not seen recovering)") if recs else
            f"  {kind:<16} {len(mine):>3}        -  (none seen recovering)")
    for r in _rows(run_dir / "faults.jsonl"):
        say(f"  run's record: {r['kind']}: {r['message']}")
    counted: dict[str, float] = {}
    for r in kept.values():
        for k, v in r.items():
            if COUNTED.match(k) and isinstance(v, (int, float)):
                # a running count: its last value; a per-step share: its mean over the steps; else the sum
                counted[k] = v if k in RUNNING else counted.get(k, 0) + v / (len(kept) if k in SHARES else 1)
    say(f"chaos [{part}]: exit {rc} after {wall:.0f} s (drivers before it: {stopped or 'none'}); steps trained "
        f"{len(kept)}/{sched.steps} (rows {len(rows)}, {len(rows) - len(kept)} trained again after rewinds)")
    say(f"chaos [{part}]: groups per step {sorted(g for g in groups if g is not None)} (a full batch is one value); "
        f"prompt draws in the trained lineage {len(draws)}, trained twice {twice}; trainings discarded by a rewind "
        f"{retrained}")
    say(f"chaos [{part}]: went on without, counted: "
        + (", ".join(f"{k} {v:.1%} of trajectories" if k in SHARES else f"{k} {v:g}"
                     for k, v in sorted(counted.items()) if v) or "nothing"))
    grew = first is None or last is None or last.tree_mb / first.tree_mb - 1 > MEMORY_TOLERANCE
    if first and last:
        store = (f"; object store {first.store_mb:.0f} -> {last.store_mb:.0f} MiB" if first.store_mb is not None
                 and last.store_mb is not None else "; object store not read")
        say(f"chaos [{part}]: run-tree memory (USS) {first.tree_mb:.0f} MB at step {first.step} -> "
            f"{last.tree_mb:.0f} MB at step {last.step} ({last.tree_mb / first.tree_mb - 1:+.1%}; goal within "
            f"{MEMORY_TOLERANCE:.0%}){store}")
        say(f"chaos [{part}]:   changed most: {last.grown(first)}")
        say(f"chaos [{part}]:   by tenths: " + ", ".join(f"{t.tree_mb:.0f} MB at {t.step}" for t in trail))
        for k in [k for _, k in sorted((-abs(last.by_kind.get(k, 0) - first.by_kind.get(k, 0)), k)
                                       for k in last.by_kind)[:3]]:
            say(f"chaos [{part}]:     {k}: " + ", ".join(f"{t.by_kind.get(k, 0):.0f}" for t in [first, *trail, last]))
    if grew:
        say("chaos: memory goal not met" + ("" if first and last else " (no sample with every actor alive)"))
    refused = [x for x in log.read_text(errors="replace").splitlines() if UNLOADABLE.search(x)]
    for x in refused[:3]:
        say(f"chaos [{part}]: a checkpoint was refused on resume: {x[:300]}")
    ok = rc == 0 and len(kept) == sched.steps and len(groups) == 1 and twice == 0 and not grew and not refused
    say(f"chaos [{part}]: {'OK' if ok else 'FAILED'} (driver output: {log})")
    print("\n" + "\n".join(lines), flush=True)
    return PartResult(part, ok, lines)


if __name__ == "__main__":
    sys.exit(main())
