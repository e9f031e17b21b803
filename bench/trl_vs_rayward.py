"""Same GRPO work, four ways: TRL's GRPOTrainer (serial reward, and a reward on a thread pool) vs rayward sync vs
rayward pipelined (CPU).

    python bench/trl_vs_rayward.py                       # tiny workload, all four, 8 steps each (2 warm-up excluded)
    python bench/trl_vs_rayward.py --workload 100m --steps 6 --warmup 1    # a 100M-parameter random Qwen2
    python bench/trl_vs_rayward.py --workload varlen --which trl-threaded,sync,pipelined --steps 6 --warmup 1 \
        --variant padded:pipelined:grpo.padding_free=false    # variable lengths: packed against TRL and padded
    python bench/trl_vs_rayward.py --workload moe --which trl,sync,pipelined --steps 6 --warmup 1   # MoE ~114M
    python bench/trl_vs_rayward.py --which sync,pipelined --steps 16 \
        --variant pipe-s2:pipelined:loop.max_staleness=2   # + runs with other knobs

Every system gets the same work per optimizer step, from --workload:
  tiny: rayward's offline tiny model, 8 prompts x num_generations 8 = 64 completions of at most 16 new tokens,
        micro-batches of 32 (configs/demo.yaml);
  100m: a random Qwen2-shaped 100M-parameter model (bench/models.py), 2 prompts x 8 = 16 completions of 32 tokens,
        one micro-batch of 16;
  varlen: the same shape with variable completion lengths (bench/models.py build_varlen_model: EOS follows one of a
        set of trigger tokens, so lengths are geometric with mean ~64, capped at 512), 16 completions, one
        micro-batch of 16, learning rate 1e-6 (the lengths stay put over the run); rayward packs its micro-batches
        (grpo.padding_free, its default on CPU) where TRL pads them: add
        `--variant padded:pipelined:grpo.padding_free=false` for rayward padded;
all on the toy letter prompts at temperature 1.0, two reward functions (`bench/bench_rewards.py`: a cheap one
and a 50 ms-per-completion "sandbox" call; `trl-threaded` runs the sandbox call on a --threads thread pool, as a
TRL user who knows the reward is I/O bound would), loss dapo, beta 0, lr 3e-3, one optimizer step per generation
batch. TRL generates with transformers `generate` (use_vllm=False); rayward with its vLLM-CPU
generator actor. Each system runs in its own subprocess, one after the other (no Ray or torch state leaks
between them, no competition for the cores); the parent prints median seconds per step (first --warmup steps
excluded) and the ratio to TRL, the per-phase medians, CPU seconds per step by process role, and the two goals
(pipelined >= 3x faster than TRL; pipelined step <= 1.15x the slowest phase of the sync run). See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REWARDS_FILE = Path(__file__).resolve().parent / "bench_rewards.py"
SYSTEMS = ("trl", "trl-threaded", "sync", "pipelined")
TEMPERATURE = 1.0
LEARNING_RATE = 3e-3
NUM_GENERATIONS = 8
SEED = 0


@dataclass(frozen=True)
class Workload:
    """What every system does per optimizer step (rayward reads the rest from configs/demo.yaml)."""

    model: str  # "tiny", or a bench/models.py size
    generation_batch_size: int  # completions per step
    micro_batch: int  # rayward grpo.per_device_train_batch_size; TRL per_device_train_batch_size
    max_completion_length: int
    mean_length: int | None = None  # a variable-length model (bench/models.py build_varlen_model) of this mean
    learning_rate: float = LEARNING_RATE
    max_model_len: int | None = None  # rayward generation.max_model_len, where the default cannot hold a completion

    def model_path(self) -> str:
        from bench.models import MOE_SHAPES, build_model, build_moe_model, build_varlen_model
        from orchestrator.builtin.models.tiny import ensure_tiny_model

        if self.model == "tiny":
            return str(ensure_tiny_model())
        if self.model in MOE_SHAPES:
            return str(build_moe_model(self.model))
        if self.mean_length is not None:
            return str(build_varlen_model(self.model, self.mean_length))
        return str(build_model(self.model))

    def rayward_overrides(self) -> list[str]:
        return [f"model.name_or_path={self.model_path()}",
                f"generation.generation_batch_size={self.generation_batch_size}",
                f"grpo.per_device_train_batch_size={self.micro_batch}",
                f"generation.max_completion_length={self.max_completion_length}",
                f"grpo.learning_rate={self.learning_rate}",
                *([f"generation.max_model_len={self.max_model_len}"] if self.max_model_len else [])]


WORKLOADS = {
    "tiny": Workload("tiny", 64, 32, 16),
    "100m": Workload("100m", 16, 16, 32),
    # Variable lengths (issue 26): geometric with mean ~64 tokens up to 512; a small learning rate, as real RL runs
    # use, so the lengths the EOS row sets stay put over the run.
    "varlen": Workload("100m", 16, 16, 512, mean_length=64, learning_rate=1e-6, max_model_len=1024),
    # A mixture of experts (issue 33): ~114M parameters, 16 experts, top-2 (bench/models.py MOE_SHAPES); as 100m
    # otherwise. Both trainers add the load-balancing loss by TRL's rule (the config's coefficient).
    "moe": Workload("moe100m", 16, 16, 32),
}
# Goals (issue: rayward on one machine against a well-written TRL script): {workload: {vs system: ratio}}
GOALS = {"tiny": {"trl": 4.0, "trl-threaded": 1.5}, "100m": {"trl-threaded": 1.4}, "varlen": {}, "moe": {"trl": 3.0}}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------------------
# Workers (one per subprocess)
# ---------------------------------------------------------------------------------------------------------



def step_timer() -> Any:
    """A TrainerCallback timing each optimizer step (on_step_begin -> on_step_end), with the CPU seconds of every
    process role after it and TRL's logged rows that carry completions/mean_length."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []
            self.logs: list[dict[str, Any]] = []
            self.cpu: list[dict[str, float]] = []

        def on_step_begin(self, args, state, control, **kw):
            self.begin.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            self.end.append(time.perf_counter())
            self.cpu.append({**_cpu_by_role(), "wall": self.end[-1]})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    return StepTimer()


def timed_train(trainer: Any, timer: Any) -> tuple[list[dict[str, float]], float]:
    """trainer.train() with its generation and reward phases timed (the two methods TRL's generation step calls,
    wrapped on this instance only); per step {time/step, time/generate, time/reward, time/train}, and the wall time."""
    phase: dict[str, list[float]] = {"generate": [], "reward": []}

    def timed(name: str, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phase[name].append(time.perf_counter() - t0)

        return wrapper

    trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    step_s = [e - b for b, e in zip(timer.begin, timer.end, strict=True)]
    per_step = []
    for i, s in enumerate(step_s):
        g = phase["generate"][i] if i < len(phase["generate"]) else 0.0
        r = phase["reward"][i] if i < len(phase["reward"]) else 0.0
        per_step.append({"time/step": s, "time/generate": g, "time/reward": r, "time/train": s - g - r})
    return per_step, wall

def run_trl(steps: int, workdir: Path, w: Workload, threads: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(REWARDS_FILE.parent))
    from bench_rewards import letter_fraction, sandbox_reward, threaded

    from orchestrator.builtin.tasks.letters import toy_dataset

    torch.manual_seed(SEED)
    model_path = w.model_path()
    sandbox = threaded(sandbox_reward, threads) if threads > 1 else sandbox_reward

    timer = step_timer()

    args = GRPOConfig(
        output_dir=str(workdir / "trl-out"),
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=w.generation_batch_size // w.micro_batch,
        # -> steps_per_generation = GA: one generation per optimizer step
        generation_batch_size=w.generation_batch_size,
        num_generations=NUM_GENERATIONS,
        max_completion_length=w.max_completion_length,
        temperature=TEMPERATURE,
        learning_rate=w.learning_rate,
        lr_scheduler_type="constant",
        loss_type="dapo",
        beta=0.0,
        num_iterations=1,
        max_steps=steps,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # the rayward runs turn it off too (both default to on)
        use_vllm=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=SEED,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=[letter_fraction, sandbox],
        args=args,
        train_dataset=Dataset.from_list(toy_dataset()),
        callbacks=[timer],
    )
    per_step, wall = timed_train(trainer, timer)
    lengths = [lg["completions/mean_length"] for lg in timer.logs]
    rewards = [lg.get("reward") for lg in timer.logs]
    return {"system": "trl-threaded" if threads > 1 else "trl", "per_step": per_step, "mean_length": lengths,
            "reward": rewards, "wall_s": wall,
            "cpu_marks": timer.cpu}


# Matched against each process's command line and name (vLLM-CPU's engine and model-worker processes are named
# VLLM::EngineCore and VLLM::Worker, children of the generator actor).
ROLES = (("generator", ("ray::Generator", "VLLM::", "generator-")), ("learner", ("ray::Learner", "/learner")),
         ("reward_workers", ("RewardWorker", "/reward-")), ("reward_pool", ("RewardPool", "reward-pool")))


def _cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process and every descendant (the embedded Ray cluster:
    its daemons, the actors, vLLM's engine process), grouped by role."""
    import psutil

    me = psutil.Process()
    out = dict.fromkeys([r for r, _ in ROLES] + ["driver", "ray_daemons"], 0.0)
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            name = " ".join(proc.cmdline())[:300] + " " + proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        role = "driver" if proc.pid == me.pid else next(
            (r for r, keys in ROLES if any(k in name for k in keys)), "ray_daemons")
        out[role] += t.user + t.system
    return out


def run_rayward(
    mode: str, steps: int, reward_workers: int, workdir: Path, extra: list[str], w: Workload
) -> dict[str, Any]:
    from orchestrator.config import load_config
    from orchestrator.run.train import train
    from orchestrator.telemetry.metrics import MetricsLogger

    # CPU accounting per step (instrumentation of this subprocess only): after each step is logged, read the
    # CPU seconds every process of the run has used so far.
    cpu_marks: list[dict[str, float]] = []
    log = MetricsLogger.log

    def log_with_cpu(self, step, metrics):
        log(self, step, metrics)
        cpu_marks.append({**_cpu_by_role(), "wall": time.perf_counter()})

    MetricsLogger.log = log_with_cpu

    overrides = [
        f"name=bench-{mode}-{os.getpid()}",
        f"grpo.max_steps={steps}",
        f"rewards.1={{name: sandbox, function: '{REWARDS_FILE}:sandbox_reward'}}",
        f"cluster.num_reward_workers={reward_workers}",
        f"loop.mode={mode}",
        f"logging.dir={workdir / 'runs'}",
        "logging.check_logprob_parity=false",
        "grpo.gradient_checkpointing=false",  # as TRL is run above: the same work, no recomputation on either side
        "logging.log_completions=false",
        *w.rayward_overrides(),
        *extra,  # --set / --variant: knobs for experiments (printed with the results)
    ]
    cfg = load_config(ROOT / "configs" / "demo.yaml", overrides)
    # The workload must be the one TRL gets (demo.yaml is the source of the numbers).
    g, o = cfg.generation, cfg.grpo
    assert (g.num_generations, g.generation_batch_size, g.max_completion_length, g.temperature) == (
        NUM_GENERATIONS, w.generation_batch_size, w.max_completion_length, TEMPERATURE
    ), g
    assert (o.learning_rate, o.loss_type, o.beta, o.per_device_train_batch_size, o.num_iterations) == (
        w.learning_rate, "dapo", 0.0, w.micro_batch, 1
    ), o
    assert [r.name for r in cfg.rewards] == ["letter", "sandbox"]
    t0 = time.perf_counter()
    history = train(cfg, show_progress=True)
    wall = time.perf_counter() - t0
    keys = ("time/step", "time/generate", "time/reward", "time/train", "time/sync", "time/generate_busy",
            "time/wait_rollouts", "time/train_compute", "rewards/sandbox/latency_s", "rewards/letter/latency_s",
            "policy_staleness", "sampling/sampling_logp_difference/max", "sampling/importance_sampling_ratio/mean")
    per_step = [{k: h[k] for k in keys if isinstance(h.get(k), (int, float))} for h in history]
    return {
        "system": mode,
        "per_step": per_step,
        "mean_length": [h.get("completions/mean_length") for h in history],
        "reward": [h.get("reward") for h in history],
        "wall_s": wall,
        "loop": cfg.loop.model_dump(),
        "reward_workers": reward_workers,
        "reward_chunk_groups": cfg.cluster.reward_chunk_groups,
        "extra": list(extra),
        "cpu_marks": cpu_marks,
    }


# ---------------------------------------------------------------------------------------------------------
# Parent: one subprocess per system, then the tables
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Planned:
    label: str  # the row name in the tables
    kind: str  # trl | sync | pipelined
    overrides: list[str]  # rayward config overrides on top of the shared workload; env:NAME=VALUE sets a variable

    @property
    def env(self) -> dict[str, str]:
        return dict(o[4:].split("=", 1) for o in self.overrides if o.startswith("env:"))

    @property
    def config(self) -> list[str]:
        return [o for o in self.overrides if not o.startswith("env:")]


def spawn(p: Planned, ns: argparse.Namespace, workdir: Path) -> dict[str, Any] | None:
    out, log = workdir / f"{p.label}.json", workdir / f"{p.label}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", p.kind, "--steps", str(ns.steps),
           "--reward-workers", str(ns.reward_workers), "--out", str(out), "--workdir", str(workdir),
           "--workload", ns.workload, "--threads", str(ns.threads)]
    for kv in p.config:
        cmd += ["--set", kv]
    env = {**os.environ, **p.env}  # inherited by the embedded Ray cluster's raylet, hence by every actor
    env.pop("RAY_ADDRESS", None)  # rayward's train() must start its own embedded cluster, not join another
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH")) if x)
    print(f"[bench] {p.label}: running ({ns.steps} steps), log {log}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc: Any = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                     timeout=ns.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    print(f"[bench] {p.label}: rc {rc} in {time.perf_counter() - t0:.0f}s", flush=True)
    if rc != 0 or not out.exists():
        print("\n".join(f"    {line}" for line in log.read_text().splitlines()[-30:]), flush=True)
        return None
    res = json.loads(out.read_text())
    res["kind"], res["label"], res["env"] = p.kind, p.label, p.env
    if p.env:
        res["extra"] = res.get("extra", []) + [f"env:{k}={v}" for k, v in p.env.items()]
    return res


def summarize(res: dict[str, Any], warmup: int) -> dict[str, Any]:
    rows = res["per_step"][warmup:] or res["per_step"]
    keys = sorted({k for r in rows for k in r})
    med = {k: _median([r[k] for r in rows if k in r]) for k in keys}
    lengths = [x for x in res["mean_length"] if x is not None]
    rewards = [x for x in res["reward"][warmup:] if x is not None]
    return {"kind": res["kind"], "env": res.get("env", {}), "median": med, "n": len(rows),
            "mean_step": statistics.fmean(r["time/step"] for r in rows),
            "mean_length": sum(lengths) / len(lengths) if lengths else math.nan,
            "mean_reward": sum(rewards) / len(rewards) if rewards else math.nan,
            "steps": [round(r["time/step"], 2) for r in res["per_step"]], "extra": res.get("extra", []),
            "cpu_per_step": _cpu_per_step(res.get("cpu_marks") or [], warmup)}


def _cpu_per_step(marks: list[dict[str, float]], warmup: int) -> dict[str, float] | None:
    """CPU seconds per optimizer step by role over the measured steps (marks are taken after each step)."""
    if len(marks) <= warmup or warmup < 1:
        return None
    a, b = marks[warmup - 1], marks[-1]
    n = len(marks) - warmup
    out = {k: (b[k] - a[k]) / n for k in a if k != "wall"}
    out["total"] = sum(out.values())
    out["wall"] = (b["wall"] - a["wall"]) / n
    return out


def _fmt(v: float | None, width: int = 14) -> str:
    return f"{v:>{width}.3f}" if v is not None else f"{'-':>{width}}"


def report(results: dict[str, dict[str, Any]], warmup: int, reward_workers: int, workload: str) -> dict[str, Any]:
    s = {label: summarize(r, warmup) for label, r in results.items()}
    trl = next((v["median"]["time/step"] for v in s.values() if v["kind"] == "trl"), None)
    trl_t = next((v["median"]["time/step"] for v in s.values() if v["kind"] == "trl-threaded"), None)
    sync = next((v for v in s.values() if v["kind"] == "sync"), None)
    w = max(11, *(len(k) for k in s))
    print()
    print(f"median wall seconds per optimizer step (steps {warmup + 1}..{max(len(v['steps']) for v in s.values())}; "
          f"rayward: {reward_workers} reward workers)")
    print(f"{'system':<{w}} {'s/step':>8} {'(mean)':>8} {'mean len':>9} {'reward':>7} {'TRL/this':>9} "
          f"{'TRLthr/this':>11}   every step (s)")
    ratios: dict[str, float] = {}
    ratios_t: dict[str, float] = {}
    for label, v in s.items():
        m = v["median"]["time/step"]
        if trl:
            ratios[label] = trl / m
        if trl_t:
            ratios_t[label] = trl_t / m
        steps = v["steps"]
        shown = " ".join(f"{x:g}" for x in steps[:12]) + (f" ... ({len(steps)} steps)" if len(steps) > 12 else "")
        extra = f"  [{' '.join(v['extra'])}]" if v["extra"] else ""
        print(f"{label:<{w}} {m:>8.3f} {v['mean_step']:>8.3f} {v['mean_length']:>9.2f} {v['mean_reward']:>7.3f} "
              f"{(f'{ratios[label]:.2f}x') if label in ratios else '-':>9} "
              f"{(f'{ratios_t[label]:.2f}x') if label in ratios_t else '-':>11}   {shown}{extra}")
    print()
    print("median phase seconds per step (sync: phases in sequence; pipelined: generate_busy = generator-busy "
          "seconds of the batch, wait_rollouts = learner idle)")
    cols = {"generate": "time/generate", "reward": "time/reward", "train": "time/train", "sync": "time/sync",
            "generate_busy": "time/generate_busy", "wait_rollouts": "time/wait_rollouts",
            "train_compute": "time/train_compute", "sandbox_lat": "rewards/sandbox/latency_s",
            "logp_gap_max": "sampling/sampling_logp_difference/max"}
    print(f"{'system':<{w}} " + " ".join(f"{c:>13}" for c in cols))
    for label, v in s.items():
        print(f"{label:<{w}} " + " ".join(_fmt(v["median"].get(c), 13) for c in cols.values()))
    cpu = {label: v["cpu_per_step"] for label, v in s.items() if v.get("cpu_per_step")}
    if cpu:
        roles = ["generator", "learner", "reward_workers", "reward_pool", "driver", "ray_daemons", "total"]
        print()
        print("CPU seconds per step, by process role (all processes of the run; 2 cores give at most 2.0 per "
              "wall second)")
        print(f"{'system':<{w}} " + " ".join(f"{r:>14}" for r in roles) + f" {'wall s/step':>12} {'cores busy':>10}")
        for label, c in cpu.items():
            print(f"{label:<{w}} " + " ".join(f"{c[r]:>14.3f}" for r in roles)
                  + f" {c['wall']:>12.3f} {c['total'] / c['wall']:>10.2f}")
    out: dict[str, Any] = {"summary": s, "ratios_vs_trl": ratios, "ratios_vs_trl_threaded": ratios_t}

    def sync_phases(v: dict[str, Any]) -> dict[str, float]:
        med = v["median"]
        return {"generate": med.get("time/generate", 0.0), "reward": med.get("time/reward", 0.0),
                "train+sync": med.get("time/train", 0.0) + med.get("time/sync", 0.0)}

    phases = sync_phases(sync) if sync is not None else None
    if phases is not None:
        out["sync_phases"] = phases
    for label, v in s.items():
        if v["kind"] != "pipelined":
            continue
        # the reference phases: the sync run with the same knobs (a padded pipelined run against the padded sync
        # run), else the same environment (a variant that changes the generator's process layout is compared with
        # a sync run that has the same change), else the plain sync run
        ref = next((lab for lab, x in s.items() if x["kind"] == "sync" and x["extra"] == v["extra"]), None)
        ref = ref or next((lab for lab, x in s.items() if x["kind"] == "sync" and x["env"] == v["env"]), None)
        ref = ref or next((lab for lab, x in s.items() if x["kind"] == "sync"), None)
        print()
        p = v["median"]["time/step"]
        for vs, want in GOALS[workload].items():
            got = (ratios if vs == "trl" else ratios_t).get(label)
            print(f"goal [{label}, {workload}]: >= {want}x faster than {vs} per step: "
                  + (f"{got:.2f}x -> {'MET' if got >= want else 'MISSED'}" if got else f"{vs} not run"))
        if ref is None:
            print(f"overlap [{label}]: needs the sync run in the same invocation")
            continue
        ph = sync_phases(s[ref])
        slowest = max(ph, key=lambda k: ph[k])
        bound = p / ph[slowest]
        out.setdefault("phase_bound", {})[label] = bound
        print(f"overlap [{label}]: step / slowest phase of {ref} = {p:.3f} / {ph[slowest]:.3f} ({slowest}) = "
              f"{bound:.2f}x (1.0 = perfect overlap; with mean step {v['mean_step'] / ph[slowest]:.2f}x)")
    for label, v in s.items():
        if v["kind"] == "sync":
            ph, step = sync_phases(v), v["median"]["time/step"]
            print(f"{label} phases: " + ", ".join(f"{k} {x:.3f}s" for k, x in ph.items())
                  + f"; step {step:.3f}s (driver {step - sum(ph.values()):.3f}s)")
    return out


def plan(ns: argparse.Namespace, ap: argparse.ArgumentParser) -> list[Planned]:
    which = [x.strip() for x in ns.which.split(",") if x.strip()]
    unknown = sorted(set(which) - set(SYSTEMS))
    if unknown:
        ap.error(f"--which: unknown {unknown} (choose from {list(SYSTEMS)})")
    runs = [Planned(k, k, [] if k.startswith("trl") else list(ns.set)) for k in SYSTEMS if k in which]
    for spec in ns.variant:
        try:
            label, kind, kvs = spec.split(":", 2)
        except ValueError:
            ap.error(f"--variant {spec!r}: expected LABEL:sync|pipelined:KEY=VALUE[,KEY=VALUE...]")
        items = [kv for kv in kvs.split(",") if kv]
        if kind not in SYSTEMS or not label or label in {r.label for r in runs}:
            ap.error(f"--variant {spec!r}: kind must be one of {list(SYSTEMS)} and the label new")
        if kind.startswith("trl") and any(not kv.startswith("env:") for kv in items):
            ap.error(f"--variant {spec!r}: a trl variant takes env:NAME=VALUE items only")
        runs.append(Planned(label, kind, ([] if kind.startswith("trl") else list(ns.set)) + items))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="tiny", help="what each step does (default tiny)")
    ap.add_argument("--threads", type=int, default=16, help="trl-threaded: threads of its sandbox reward (default 16)")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per system (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps excluded from the medians (default 2)")
    ap.add_argument("--reward-workers", type=int, default=4, help="rayward cluster.num_reward_workers (default 4)")
    ap.add_argument("--which", default=",".join(SYSTEMS), help="comma list of trl,sync,pipelined (default: all)")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:KIND:ITEM,...",
                    help="an extra rayward run with config overrides, for experiments (repeatable), e.g. "
                    "pipe-s2:pipelined:loop.max_staleness=2")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra rayward config override for every rayward run (repeatable)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per system before it is killed")
    ap.add_argument("--json", help="also write the raw results and summary here")
    ap.add_argument("--keep-logs", action="store_true", help="keep the per-system logs and run dirs")
    ap.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.steps <= ns.warmup:
        ap.error("--steps must be greater than --warmup")

    if ns.worker:  # child process: run one system, write its JSON
        workdir = Path(ns.workdir)
        w = WORKLOADS[ns.workload]
        if ns.worker in ("trl", "trl-threaded"):
            res = run_trl(ns.steps, workdir, w, ns.threads if ns.worker == "trl-threaded" else 1)
        else:
            res = run_rayward(ns.worker, ns.steps, ns.reward_workers, workdir, ns.set, w)
        Path(ns.out).write_text(json.dumps(res))
        return

    runs = plan(ns, ap)
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="rayward-bench-"))
    results = {}
    for p in runs:
        res = spawn(p, ns, workdir)
        if res is not None:
            results[p.label] = res
    failed = len(results) < len(runs)
    if results:
        summary = report(results, ns.warmup, ns.reward_workers, ns.workload)
        if ns.json:
            Path(ns.json).write_text(json.dumps({"results": results, **summary}, indent=1))
    print(f"\n[bench] total {time.perf_counter() - t0:.0f}s")
    if failed or ns.keep_logs:
        print(f"[bench] logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
