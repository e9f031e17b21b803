"""Agentic GRPO, TRL against rayward, in one invocation: the same environment, model, sample counts and a tool that
takes 100 ms.

    python bench/agentic_vs_trl.py                      # 10 steps each, 4 prompts x 8 trajectories, 100 ms tools
    python bench/agentic_vs_trl.py --steps 4            # a short look
    python bench/agentic_vs_trl.py --json out.json      # both sides' per-step numbers to a file
    python bench/agentic_vs_trl.py --model saved-schema # the model with its response schema saved

Both train the tiny tool model on the box task, by default as the hub would ship it (`ensure_stock_tool_model()`:
TRL's qwen2_5 template, no response schema in its tokenizer files, so both sides install one at run time), with
`SlowBoxEnv` (orchestrator/builtin/tasks/boxes.py: every tool call sleeps 100 ms, as a remote tool would), lr 2e-4, loss
dapo, beta 0, temperature 1, at most 3 tool-calling iterations, one optimizer step per generation batch:

- TRL 1.16 `GRPOTrainer(environment_factory=...)`, exactly bench/trl_tools.py's setup (transformers generation; its
  tool loop runs a batch's tool calls one after another, in the trainer's process), with `--trl-threads` torch
  threads;
- rayward: configs/tools.yaml with `environment_factory: SlowBoxEnv`, the pipelined loop (a batch generated while
  the previous one trains), the trajectories' tool calls in the environment pool, each trajectory at its own pace;
  `--env-workers` (16) environment workers, each running one sync call at a time on its main thread as TRL does.

TRL's max_completion_length (128) counts model and tool tokens; rayward's counts model tokens, its tool results
have agent.max_tool_tokens (128). It prints each side's steps/s (over the steps after the first, which pays for
start-up: TRL's first generation, rayward's first batch before the pipeline fills), the tool calls per step (so a
side that calls fewer tools is not faster for it) and the reward; then rayward's speed-up (goal: >= 3x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.builtin.tasks.boxes import SlowBoxEnv  # noqa: E402

ENV = "orchestrator.builtin.tasks.boxes:SlowBoxEnv"
# Logical CPUs per environment worker: SlowBoxEnv's tools sleep (a remote tool's wait), so a worker needs little,
# and 16 of them fit beside the generator, learner and reward worker on a 2-CPU embedded cluster (at the default
# 0.25 only 3 could be placed, and the rest would wait for CPUs the whole run).
ENV_WORKER_CPUS = 0.04


def trl_side(args: argparse.Namespace) -> list[dict[str, Any]]:
    """bench/trl_tools.py's run, with SlowBoxEnv's latency: per step seconds, reward, tool calls."""
    from bench import trl_tools

    trl_args = argparse.Namespace(
        steps=args.steps, prompts=args.prompts, num_generations=args.num_generations, lr=args.lr,
        max_completion_length=args.max_completion_length, max_tool_calling_iterations=args.max_tool_calling_iterations,
        tool_latency=SlowBoxEnv.tool_latency_s, threads=args.trl_threads, json=None, model=args.model_path,
    )
    return [{"seconds": s["seconds"], "reward": s.get("reward"), "tool_calls": s.get("tool_calls")}
            for s in trl_tools.run(trl_args)]


def rayward_side(args: argparse.Namespace) -> list[dict[str, Any]]:
    """configs/tools.yaml on SlowBoxEnv, pipelined: per step seconds, reward, tool calls."""
    from orchestrator.config import load_config, parse_config
    from orchestrator.run.train import train

    n = args.prompts * args.num_generations
    cfg = load_config(ROOT / "configs" / "tools.yaml", [
        f"logging.dir={tempfile.mkdtemp(prefix='rayward-agentic-')}", f"grpo.max_steps={args.steps}",
        f"generation.num_generations={args.num_generations}", f"generation.generation_batch_size={n}",
        f"grpo.per_device_train_batch_size={n}", f"grpo.learning_rate={args.lr}",
        f"generation.max_completion_length={args.max_completion_length}",
        f"generation.max_tool_calling_iterations={args.max_tool_calling_iterations}",
        "loop.mode=pipelined", "logging.progress=false", f"model.name_or_path={args.model_path}",
        f"cluster.num_env_workers={args.env_workers}", f"cluster.env_worker.num_cpus={ENV_WORKER_CPUS}",
    ]).model_dump()
    cfg["environment_factory"] = ENV
    cfg["rewards"] = [{"name": SlowBoxEnv.__name__}]  # the environment's get_reward(), named after its class
    history = [h for h in train(parse_config(cfg), name="agentic-bench", show_progress=False) if "reward" in h]
    return [{"seconds": h["time/step"], "reward": h["reward"], "tool_calls": round(h["multiturn/tool_calls"] * n)}
            for h in history]


def summary(name: str, steps: list[dict[str, Any]]) -> dict[str, float]:
    later = steps[1:] or steps
    out = {
        "steps_per_s": len(later) / sum(s["seconds"] for s in later),
        "tool_calls_per_step": statistics.mean(s["tool_calls"] for s in later),
        "reward": statistics.mean(s["reward"] for s in steps),
        "first_step_s": steps[0]["seconds"],
    }
    print(f"{name:8s} {out['steps_per_s']:.3f} steps/s  {out['tool_calls_per_step']:5.1f} tool calls/step  "
          f"mean reward {out['reward']:.3f}  (first step {out['first_step_s']:.1f} s, {len(steps)} steps)", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (each sampled --num-generations times)")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--max-completion-length", type=int, default=128)
    p.add_argument("--max-tool-calling-iterations", type=int, default=3)
    p.add_argument("--trl-threads", type=int, default=2, help="TRL's torch threads (rayward uses the machine's cores)")
    p.add_argument("--json", type=Path, help="write both sides' per-step numbers here")
    p.add_argument("--env-workers", type=int, default=16,
                   help="rayward's environment workers: each runs one sync tool call at a time on its main thread, "
                        "as TRL's trainer does (TRL: one), so this is how many 100 ms calls are in flight")
    p.add_argument("--model", choices=["stock", "saved-schema"], default="stock",
                   help="stock: the tiny tool model with TRL's qwen2_5 template and no saved response schema, as "
                        "the hub's Qwen2.5 ships (both sides install it at run time); saved-schema: the same model "
                        "with the schema in its tokenizer files")
    args = p.parse_args()
    from orchestrator.builtin.models.tools import ensure_stock_tool_model, ensure_tiny_tool_model

    args.model_path = str(ensure_stock_tool_model() if args.model == "stock" else ensure_tiny_tool_model())
    print(f"TRL GRPOTrainer(environment_factory=SlowBoxEnv), model {args.model}, {args.steps} steps", flush=True)
    trl = trl_side(args)
    print(f"rayward pipelined, environment_factory {ENV}, {args.env_workers} environment workers, {args.steps} steps",
          flush=True)
    ours = rayward_side(args)
    a, b = summary("TRL", trl), summary("rayward", ours)
    print(f"rayward / TRL: {b['steps_per_s'] / a['steps_per_s']:.1f}x steps/s (goal >= 3x)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "trl": trl,
                                         "rayward": ours}, indent=1))


if __name__ == "__main__":
    main()
