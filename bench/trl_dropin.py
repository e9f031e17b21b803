"""One TRL script, run twice: with `from trl import GRPOConfig, GRPOTrainer`, then with `from rayward import ...`
and nothing else changed (issue 32). Same model and work per step as bench/trl_vs_rayward.py's 100M case: a random
100M-parameter Qwen2 (bench/models.py), 2 prompts x 8 = 16 completions of 32 tokens per step in one micro-batch,
the toy letter prompts, two reward functions defined in the script (a cheap one, and a 50 ms-per-completion
"sandbox" call, the script's plain serial code), dapo, beta 0, lr 3e-3.

    python bench/trl_dropin.py                      # 8 steps each, the first 2 not counted (~6 min on 2 cores)
    python bench/trl_dropin.py --steps 6 --warmup 1 --which rayward
    python bench/trl_dropin.py --which trl,rayward,rayward-pipelined   # + the script with rayward's own keyword
                                                                       # rayward={"loop": {"mode": "pipelined"}}

Each run is its own `python script.py` process, one after the other. The script prints its trainer's
log_history; this prints, per system, the median seconds per optimizer step (TRL's own `step_time`, rayward's
`time/step`: both time generation, rewards and the update), the whole process's wall time (start-up included:
rayward starts Ray, a vLLM engine and its workers), and rayward's steps/s against TRL's. TRL generates with
transformers' generate (the script leaves use_vllm at TRL's default, False); rayward with vLLM, as always.
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

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''\
import json, os, random, time
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

rng = random.Random(0)
dataset = Dataset.from_list([{"prompt": f"Write the letter {c}:", "letter": c}
                             for c in (rng.choice("abcd") for _ in range(256))])


def letter_fraction(completions, letter, **kwargs):
    return [sum(ch == want for ch in c) / max(len(c), 1) for c, want in zip(completions, letter)]


def sandbox_reward(completions, letter, **kwargs):
    out = []
    for c, want in zip(completions, letter):
        time.sleep(0.05)  # a sandbox round trip per completion
        out.append(float(want in c))
    return out


args = GRPOConfig(output_dir=os.environ["OUTPUT_DIR"], max_steps=int(os.environ["STEPS"]), learning_rate=3e-3,
                  per_device_train_batch_size=16, num_generations=8, max_completion_length=32,
                  lr_scheduler_type="constant", gradient_checkpointing=False, use_cpu=True, bf16=False,
                  logging_steps=1, report_to="none", save_strategy="no", seed=0)
trainer = GRPOTrainer(model=os.environ["MODEL"], reward_funcs=[letter_fraction, sandbox_reward], args=args,
                      train_dataset=dataset)  # KEYWORD
trainer.train()
print("RESULT " + json.dumps(trainer.state.log_history))
'''
SYSTEMS = {"trl": "from trl import GRPOConfig, GRPOTrainer", "rayward": "from rayward import GRPOConfig, GRPOTrainer",
           "rayward-pipelined": "from rayward import GRPOConfig, GRPOTrainer"}
# rayward-pipelined: the import, and rayward's one keyword of its own (what the script would add to go further)
KEYWORD = {"rayward-pipelined": ', rayward={"loop": {"mode": "pipelined"}}'}
STEP_KEY = {"trl": "step_time", "rayward": "time/step", "rayward-pipelined": "time/step"}


def run(system: str, steps: int, model: str, workdir: Path) -> dict:
    script = workdir / f"{system}_script.py"
    text = SCRIPT.replace(SYSTEMS["trl"], SYSTEMS[system])
    text = text.replace("train_dataset=dataset)  # KEYWORD", f"train_dataset=dataset{KEYWORD.get(system, '')})")
    script.write_text(text)
    env = {**os.environ, "MODEL": model, "OUTPUT_DIR": str(workdir / f"{system}-out"), "STEPS": str(steps),
           "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"{system} failed (exit {out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
    history = json.loads(lines[-1].removeprefix("RESULT "))
    times = [r[STEP_KEY[system]] for r in history if STEP_KEY[system] in r]
    return {"step_s": times, "wall_s": wall, "reward": [r.get("reward") for r in history if "reward" in r]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2, help="first steps not counted")
    ap.add_argument("--which", default="trl,rayward")
    ap.add_argument("--json", help="write the raw numbers here")
    ns = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.models import build_model

    model = str(build_model("100m"))
    results = {}
    with tempfile.TemporaryDirectory(prefix="rayward-dropin-") as tmp:
        for system in ns.which.split(","):
            results[system] = run(system, ns.steps, model, Path(tmp))
    print(f"the same TRL script, {ns.steps} steps, median of steps {ns.warmup + 1}..{ns.steps} (100M model, 16 "
          "completions of 32 tokens per step)")
    print(f"{'import':18} {'s/step':>8} {'steps/s':>8} {'process wall s':>15}  every step (s)")
    rate = {}
    for system, r in results.items():
        med = statistics.median(r["step_s"][ns.warmup:])
        rate[system] = 1 / med
        every = " ".join(f"{s:.2f}" for s in r["step_s"])
        print(f"{system:18} {med:8.3f} {rate[system]:8.3f} {r['wall_s']:15.1f}  {every}")
    for system in rate:
        if system != "trl" and "trl" in rate:
            print(f"{system} / TRL steps/s: {rate[system] / rate['trl']:.2f}x")
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
