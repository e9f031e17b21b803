"""TRL's side of the tool benchmark: GRPOTrainer with `environment_factory=BoxEnv` on the tiny tool model (CPU).

    python bench/trl_tools.py                                  # 40 steps, 4 prompts x 8 generations
    python bench/trl_tools.py --steps 10 --tool-latency 0.1    # every tool call sleeps 100 ms
    python bench/trl_tools.py --json out.json                  # per-step numbers to a file

The box task (orchestrator/builtin/tasks/boxes.py): open the box the user names, `submit` the code inside; the
environment's `get_reward()` is the only reward. The model is `ensure_tiny_tool_model()`
(orchestrator/builtin/models/tools.py), warmed up to call tools but not told which box to open: what GRPO has to learn.
TRL generates with transformers `generate` (use_vllm=False) and runs the tools in its lockstep tool loop, in-process.

Per step it prints the mean reward, the share of samples that opened the box asked for, tool calls and
tool failures (tools that raised: a wrong box number; TRL does not count malformed calls, they are plain text)
in the step, mean model tokens per sample, and the step's seconds. First it prints what policies that never
open a box score on the same rows: nothing at all (0: the answer is a tool call) and a fixed guess
(about 1/900, the task's NO_TOOL_BOUND). See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.builtin.tasks.boxes import NO_TOOL_BOUND, BoxEnv, boxes_dataset  # noqa: E402

SEED = 0
GUESS = 500  # the fixed code the guessing baseline submits (any fixed guess has the same expectation)


def no_tool_baselines(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean reward on `rows` of a policy that calls no tool, and of one that submits GUESS without opening."""
    silent, guess = [], []
    for row in rows:
        env = BoxEnv()
        env.reset(**row)
        silent.append(env.get_reward())
        env.submit(GUESS)
        guess.append(env.get_reward())
    return {"no_tool": statistics.mean(silent), "guess": statistics.mean(guess)}


def env_class(tool_latency_s: float) -> type[BoxEnv]:
    """BoxEnv with every tool call sleeping `tool_latency_s` (same name, so TRL logs its reward as BoxEnv)."""
    return type("BoxEnv", (BoxEnv,), {"tool_latency_s": tool_latency_s})


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from orchestrator.builtin.models.tools import ensure_tiny_tool_model

    torch.set_num_threads(args.threads)
    model_path = str(getattr(args, "model", None) or ensure_tiny_tool_model())
    rows = boxes_dataset(seed=SEED)
    base = no_tool_baselines(boxes_dataset(size=10_000, seed=SEED + 1))
    print(f"never calls a tool: {base['no_tool']:.4f}; submits a guess, never opens a box: {base['guess']:.4f} "
          f"(bound {NO_TOOL_BOUND:.4f})", flush=True)

    steps: list[dict[str, Any]] = []

    class StepLog(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            envs = trainer.environments or []
            steps.append({"step": state.global_step, "seconds": time.perf_counter() - self.t0,
                          "asked_box": statistics.mean(float(e.opened[:1] == [e.box]) for e in envs)})

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps:
                n = args.prompts * args.num_generations
                calls = logs["tools/call_frequency"] * n
                steps[-1].update(reward=logs["reward"], reward_std=logs.get("reward_std"), tool_calls=round(calls),
                                 tool_failures=round(logs["tools/failure_frequency"] * calls),
                                 model_tokens=logs["completions/mean_length"])
                s = steps[-1]
                print(f"step {s['step']:3d}  reward {s['reward']:.3f}  asked box {s['asked_box']:.2f}  "
                      f"tool calls {s['tool_calls']:3d}  failures {s['tool_failures']:2d}  "
                      f"tokens/sample {s['model_tokens']:5.1f}  {s['seconds']:.2f} s", flush=True)

    n = args.prompts * args.num_generations
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-tools-"),
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        generation_batch_size=n,  # one generation batch per optimizer step
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
        temperature=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        loss_type="dapo",
        beta=0.0,
        num_iterations=1,
        max_steps=args.steps,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        use_vllm=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=SEED,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model_path,
        args=config,
        train_dataset=Dataset.from_list(rows),
        environment_factory=env_class(args.tool_latency),
        callbacks=[StepLog()],
    )
    for quiet in (PrinterCallback, ProgressCallback):  # this script prints its own line per step
        trainer.remove_callback(quiet)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    rewards = [s["reward"] for s in steps]
    k = min(5, len(rewards))
    print(f"reward: first {k} steps {statistics.mean(rewards[:k]):.3f}, last {k} steps "
          f"{statistics.mean(rewards[-k:]):.3f}; median step {statistics.median(s['seconds'] for s in steps):.2f} s; "
          f"wall {wall:.0f} s", flush=True)
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (each sampled --num-generations times)")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--max-completion-length", type=int, default=128, help="all turns plus tool results (TRL)")
    p.add_argument("--max-tool-calling-iterations", type=int, default=3)
    p.add_argument("--tool-latency", type=float, default=0.0, help="seconds every tool call sleeps")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--json", type=Path, help="write the per-step numbers here")
    args = p.parse_args()
    steps = run(args)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "steps": steps},
                                        indent=1))


if __name__ == "__main__":
    main()
