"""`rayward` command line: run | scale | tiny-model | rewards | config-reference."""

from __future__ import annotations

import argparse
import sys

from orchestrator.config import ConfigError, load_config


def _cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.api import train

    train(load_config(args.config, args.overrides), args.name)
    return 0


def _cmd_scale(args: argparse.Namespace) -> int:
    import ray

    from orchestrator.auth import prepare_client_auth
    from orchestrator.cluster import namespace

    prepare_client_auth()
    ray.init(address=args.address or "auto", namespace=namespace(args.run), log_to_driver=False)
    try:
        pool = ray.get_actor(f"{args.run}/reward-pool")
    except ValueError:
        print(f"rayward scale: no run named {args.run!r} on this cluster (no actor {args.run}/reward-pool)", file=sys.stderr)
        return 2
    stats = ray.get(pool.scale.remote(args.reward_workers))
    print(f"rayward scale: {args.run}: reward workers -> {stats['workers']} (retiring {stats['retiring']})")
    return 0


def _cmd_tiny_model(args: argparse.Namespace) -> int:
    from orchestrator.tiny import build_tiny_model

    print(build_tiny_model(args.path, seed=args.seed))
    return 0


def _cmd_rewards(args: argparse.Namespace) -> int:
    from orchestrator.toy import BUILTIN_REWARDS

    for name, target in sorted(BUILTIN_REWARDS.items()):
        print(f"{name:24s} {target}")
    return 0


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from orchestrator.config import config_reference

    print("| field | default | meaning |\n|---|---|---|")
    for key, default, doc in config_reference():
        print(f"| `{key}` | `{default}` | {doc} |")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rayward", description="GRPO training on Ray: vLLM generators, reward pool, learner")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train on an embedded local Ray cluster (or cluster.address)")
    r.add_argument("config", help="YAML config (see configs/)")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. grpo.max_steps=10 generation.num_generations=4")
    r.add_argument("--name", help="run name (default: generated and printed)")
    r.set_defaults(func=_cmd_run)

    s = sub.add_parser("scale", help="resize a running run's reward pool")
    s.add_argument("run", help="run name")
    s.add_argument("--reward-workers", type=int, required=True, help="target number of reward workers")
    s.add_argument("--address", help="Ray GCS address (default: auto)")
    s.set_defaults(func=_cmd_scale)

    t = sub.add_parser("tiny-model", help="write the offline tiny model + tokenizer as an HF checkpoint")
    t.add_argument("path")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=_cmd_tiny_model)

    sub.add_parser("rewards", help="list built-in reward functions").set_defaults(func=_cmd_rewards)
    sub.add_parser("config-reference", help="print every config field (markdown)").set_defaults(
        func=_cmd_config_reference
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"rayward: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rayward: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
