"""What held-out eval costs a training run: the demo (configs/demo.yaml, 40 steps) without eval and with eval
every 10 steps, in the synchronous and the pipelined loop.

    python bench/eval_cost.py                                   # sync: no eval, all 256 toy prompts, 32 prompts
    python bench/eval_cost.py --modes sync,pipelined --repeats 2
    python bench/eval_cost.py --variant k8:max_samples=16,num_generations=8   # more eval blocks to compare

Each run is its own subprocess (its own embedded Ray cluster), one after the other. Eval blocks are the issue's
demo eval, `{"data": {"path": "toy"}, "every_n_steps": 10, "at_start": true, "num_generations": 4}`, plus each
variant's items. Measured per run:

* loop s: wall seconds of the training loop (`run_sync` / `run_pipelined`: every step, every eval, the final
  drain and checkpoint), and run s: the whole `train()` call (Ray and vLLM start-up included).
* eval s: the evals' own wall seconds (`eval/seconds`: generation + scoring, measured on the driver). In the
  sync loop that is the learner's wait for them; in the pipelined loop it includes queueing behind training
  batches, and the cost is only what the loop waits longer.
* cost: the share of the loop's wall time that eval adds, (loop - loop without eval) / loop, against the
  no-eval run of the same mode in the same invocation; for the sync loop also eval s / loop s (the same
  quantity, measured directly, without the run-to-run noise). Goal: < 15 %.
* pipelined: the longest learner wait for a batch (`time/wait_rollouts`) with and without eval, and the longest
  eval generation of the sync runs: eval may stall the learner by at most one eval generation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO_EVAL = {"data": {"path": "toy"}, "every_n_steps": 10, "at_start": True, "num_generations": 4}
DEFAULT_VARIANTS = ("none:", "all-256:", "32-prompts:max_samples=32")


def worker(mode: str, eval_block: dict[str, Any] | None, out: Path, logdir: Path) -> None:
    """One training run; writes its timings and logged rows to `out`."""
    import orchestrator.loop.loops as loop
    from orchestrator.config import load_config
    from orchestrator.run.train import train

    loop_s: list[float] = []

    def timed(fn):
        def wrapper(run):
            t0 = time.perf_counter()
            try:
                return fn(run)
            finally:
                loop_s.append(time.perf_counter() - t0)

        return wrapper

    loop.run_sync, loop.run_pipelined = timed(loop.run_sync), timed(loop.run_pipelined)  # train() looks them up
    overrides = [f"logging.dir={logdir}", f"loop.mode={mode}", "logging.log_completions=false"]
    if eval_block is not None:
        overrides.append(f"eval={json.dumps(eval_block)}")
    t0 = time.perf_counter()
    history = train(load_config(ROOT / "configs" / "demo.yaml", overrides), show_progress=False)
    run_s = time.perf_counter() - t0
    out.write_text(json.dumps({"loop_s": loop_s[0], "run_s": run_s, "history": history}))


def parse_variant(text: str) -> tuple[str, dict[str, Any] | None]:
    """LABEL:KEY=VALUE,... -> (label, eval block); `none:` is the run without eval."""
    label, _, items = text.partition(":")
    if label == "none":
        return label, None
    block = dict(DEMO_EVAL)
    for item in filter(None, items.split(",")):
        key, _, value = item.partition("=")
        block[key] = json.loads(value)
    return label, block


def spawn(mode: str, label: str, block: dict[str, Any] | None, tmp: Path, timeout: int) -> dict[str, Any]:
    out = tmp / f"{mode}-{label}-{time.time_ns()}.json"
    cmd = [sys.executable, __file__, "--worker", mode, "--out", str(out), "--logdir", str(tmp / "runs"),
           "--eval-block", json.dumps(block)]
    log = out.with_suffix(".log")
    # This checkout's rayward, whatever the environment has installed (the driver; actors get the cwd).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)}
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if rc != 0:
        raise SystemExit(f"{mode} {label}: exit {rc}; last lines of {log}:\n"
                         + "".join(log.read_text().splitlines(True)[-30:]))
    return json.loads(out.read_text())


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    steps = [h for h in res["history"] if "time/step" in h]
    evals = [h for h in res["history"] if "eval/seconds" in h]
    waits = [h["time/wait_rollouts"] for h in steps if "time/wait_rollouts" in h]
    return {
        "loop_s": res["loop_s"], "run_s": res["run_s"], "evals": len(evals),
        "eval_s": sum(h["eval/seconds"] for h in evals),
        "eval_max_s": max((h["eval/seconds"] for h in evals), default=0.0),
        "eval_curve": [(h["step"], round(h["eval/reward"], 4)) for h in evals],
        "max_wait_s": max(waits, default=None), "median_step_s": statistics.median(h["time/step"] for h in steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="sync", help="comma list of sync,pipelined (default: sync)")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE,...",
                    help="an eval block: the demo eval with these eval.* values (JSON values); `none:` = no eval")
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode and variant (default 1)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run before it is killed")
    ap.add_argument("--json", help="also write every run's summary here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--logdir", help=argparse.SUPPRESS)
    ap.add_argument("--eval-block", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.worker:
        worker(ns.worker, json.loads(ns.eval_block), Path(ns.out), Path(ns.logdir))
        return
    variants = [parse_variant(v) for v in (ns.variant or DEFAULT_VARIANTS)]
    if variants[0][0] != "none":
        variants.insert(0, ("none", None))
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="rayward-eval-cost-") as tmp:
        for _ in range(ns.repeats):
            for mode in ns.modes.split(","):
                for label, block in variants:
                    r = summarize(spawn(mode, label, block, Path(tmp), ns.timeout))
                    results.setdefault((mode, label), []).append(r)
                    print(f"  {mode:<9} {label:<12} loop {r['loop_s']:6.2f}s  run {r['run_s']:6.2f}s  "
                          f"evals {r['evals']}  eval {r['eval_s']:5.2f}s  curve {r['eval_curve']}", flush=True)
    print("\nheld-out eval cost on the demo (40 steps, eval every 10 steps and at the start; medians over repeats)")
    print(f"{'mode':<9} {'eval':<12} {'loop s':>7} {'run s':>7} {'evals':>5} {'eval s':>7} {'eval/loop':>9} "
          f"{'cost':>6} {'max wait s':>10}  eval reward by step")
    gen_max = max((r["eval_max_s"] for (m, _), rs in results.items() if m == "sync" for r in rs), default=None)
    for (mode, label), rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("loop_s", "run_s", "eval_s")}
        base = statistics.median(r["loop_s"] for r in results[(mode, "none")])
        cost = (med["loop_s"] - base) / med["loop_s"] if label != "none" else None
        share = med["eval_s"] / med["loop_s"] if mode == "sync" and label != "none" else None
        wait = f"{max(r['max_wait_s'] for r in rs):.2f}" if rs[0]["max_wait_s"] is not None else "-"
        pct = lambda x: f"{100 * x:.1f}%" if x is not None else "-"  # noqa: E731
        print(f"{mode:<9} {label:<12} {med['loop_s']:7.2f} {med['run_s']:7.2f} {rs[0]['evals']:>5} "
              f"{med['eval_s']:7.2f} {pct(share):>9} {pct(cost):>6} {wait:>10}  {rs[-1]['eval_curve']}")
    if gen_max is not None:
        print(f"longest eval (generation + scoring) in the sync runs: {gen_max:.2f}s")
    if ns.json:
        Path(ns.json).write_text(json.dumps({f"{m}/{lbl}": rs for (m, lbl), rs in results.items()}, indent=1))


if __name__ == "__main__":
    main()
