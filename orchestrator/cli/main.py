"""`rayward` command line: run | eval | samples | plot | scale | tiny-model | rewards | config-reference, and on
a (remote) Ray cluster through the Jobs API: submit | status | logs | stop | list.

What goes wrong ends in a short message and a non-zero exit, never a traceback (unless --debug): 2 for a bad
config or input, 1 for a run that failed (orchestrator/run/errors.py says what and where), 3 for an unreachable
cluster, 130 for Ctrl-C, 143 (128 + SIGTERM) for a run stopped by SIGTERM. A run in its loop stops at the next
step boundary with a checkpoint on either; a second Ctrl-C quits at once (orchestrator/run/signals.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator.cli.auth import AuthError
from orchestrator.config import ConfigError, load_config

# Exit codes beyond 0: a bad config or input, a failed run, an unreachable cluster, Ctrl-C, SIGTERM (128 + 15).
EXIT_BAD_INPUT, EXIT_FAILED, EXIT_UNREACHABLE, EXIT_INTERRUPTED, EXIT_STOPPED = 2, 1, 3, 130, 143
# Commands whose extra `key=value` words are config overrides, wherever they stand on the line.
TAKES_OVERRIDES = ("run", "submit", "eval")


def _cmd_run(args: argparse.Namespace) -> int:
    if args.max_retries:
        from orchestrator.cli.retry import run_with_retries

        return run_with_retries(args, args.max_retries)
    from orchestrator.run.train import train

    train(load_config(args.config, args.overrides), args.name, resume=args.resume, show_actor_output=args.verbose)
    return 0


def _cmd_samples(args: argparse.Namespace) -> int:
    from orchestrator.cli.samples import print_samples

    return print_samples(args.run, logging_dir=args.dir, step=args.step, limit=args.limit, width=args.width)


def _cmd_plot(args: argparse.Namespace) -> int:
    from orchestrator.cli.plot import plot_run
    from orchestrator.telemetry.metrics import find_run_dir

    run_dir = find_run_dir(args.run, args.dir)
    out = plot_run(run_dir, args.out)
    print(out)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from orchestrator.run.evaluate import evaluate

    evaluate(load_config(args.config, args.overrides), args.checkpoint, name=args.name, output=args.output)
    return 0


def _cmd_scale(args: argparse.Namespace) -> int:
    bounds = args.min is not None or args.max is not None
    pinned = {"reward": args.reward_workers, "env": args.env_workers, "judge": args.judge_engines,
              "teacher": args.teacher_engines, "generators": args.generators}
    counts = sum(n is not None for n in pinned.values())
    if counts + bounds != 1:  # exactly one action
        print("rayward scale: give --reward-workers N (a fixed count) or --min/--max (autoscaling bounds); for the "
              "environment pool --env-workers N, or --pool env --min/--max; for a judge's engines --judge-engines N "
              "(--judge REWARD), or --pool judge --min/--max; for the distillation teacher's --teacher-engines N, or "
              "--pool teacher --min/--max; for the generator fleet --generators N", file=sys.stderr)
        return EXIT_BAD_INPUT
    pool = next((k for k, n in pinned.items() if n is not None), args.pool)
    if args.judge is not None and pool != "judge":
        print("rayward scale: --judge names the judge reward whose engines --judge-engines (or --pool judge "
              "--min/--max) sizes", file=sys.stderr)
        return EXIT_BAD_INPUT
    from orchestrator.cli import jobs
    from orchestrator.cli.scale import ScaleRequest, scale

    count = next((n for n in pinned.values() if n is not None), None)
    request = ScaleRequest(args.run, pool, count, args.min, args.max, args.judge)
    try:
        stats = scale(jobs.normalize_address(args.address), request)
    except jobs.ScaleRefused as err:
        print(f"rayward scale: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (jobs.JobsError, AuthError) as err:
        print(f"rayward scale: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE if "reach" in str(err) or "no answer" in str(err) else EXIT_FAILED
    if pool == "generators":  # the driver applies it at its next step boundary (orchestrator/loop/fleet.py)
        print(f"rayward scale: {args.run}: generators -> {stats.target_workers} at the run's next step boundary "
              f"({stats.workers} taking work, {stats.retiring} retiring now)")
        return 0
    what = f"{pool} engines" if pool in ("judge", "teacher") else f"{pool} workers"
    print(f"rayward scale: {args.run}: {what} -> {stats.target_workers} ({stats.workers} live, "
          f"{stats.starting} starting, {stats.retiring} retiring); autoscaling {stats.autoscale}")
    return 0


def _cmd_tiny_model(args: argparse.Namespace) -> int:
    from orchestrator.builtin.models.tiny import build_tiny_model

    print(build_tiny_model(args.path, seed=args.seed))
    return 0


def _cmd_rewards(args: argparse.Namespace) -> int:
    from actors.rewards.builtin import BUILTIN_REWARDS

    for name, target in sorted(BUILTIN_REWARDS.items()):
        print(f"{name:24s} {target}")
    return 0


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from orchestrator.config import config_reference

    print("| field | default | meaning |\n|---|---|---|")
    for key, default, doc in config_reference():
        print(f"| `{key}` | `{default}` | {doc} |")
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    from orchestrator.cli import jobs

    def go() -> int:
        address = jobs.normalize_address(args.address)
        sub = jobs.build_submission(
            args.config, args.overrides, name=args.name, working_dir=args.working_dir,
            extra_excludes=args.exclude, extra_env=args.env, max_file_mib=args.max_file_mib,
            ship_rayward=not args.no_ship_rayward, entrypoint_num_cpus=args.entrypoint_num_cpus,
            run_flags=[f for f, on in (("--verbose", args.verbose), ("--debug", args.debug)) if on]
            + (["--max-retries", str(args.max_retries)] if args.max_retries else []),
        )
        for note in sub.notes:
            print(f"rayward submit: {note}", file=sys.stderr)
        if args.dry_run:
            import json

            print(json.dumps(sub.public(), indent=2))
            return 0
        return jobs.submit(sub, address, follow=args.follow)

    return jobs.guarded("submit", go)


def _cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.cli import jobs

    return jobs.guarded(
        "status", lambda: jobs.status(jobs.normalize_address(args.address), args.run, as_json=args.json)
    )


def _cmd_logs(args: argparse.Namespace) -> int:
    from orchestrator.cli import jobs

    return jobs.guarded("logs", lambda: jobs.logs(jobs.normalize_address(args.address), args.run, follow=args.follow))


def _cmd_stop(args: argparse.Namespace) -> int:
    from orchestrator.cli import jobs

    return jobs.guarded("stop", lambda: jobs.stop(jobs.normalize_address(args.address), args.run, wait_s=args.wait))


def _cmd_list(args: argparse.Namespace) -> int:
    from orchestrator.cli import jobs

    return jobs.guarded(
        "list", lambda: jobs.list_runs(jobs.normalize_address(args.address), show_all=args.all, as_json=args.json)
    )


ADDRESS_HELP = ("Ray dashboard / Jobs API URL, as every client command takes it (default: $RAY_API_SERVER_ADDRESS, "
                "$RAY_ADDRESS or http://127.0.0.1:8265)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rayward",
                                description="GRPO training on Ray: vLLM generators, reward pool, learner")
    sub = p.add_subparsers(dest="command", required=True)
    # --verbose / --debug: what a run shows (run, and submit for the job's driver)
    shown = argparse.ArgumentParser(add_help=False)
    shown.add_argument("-v", "--verbose", action="store_true",
                       help="also show the actors' output (vLLM, Ray, reward functions' prints); it is always in "
                            "<run dir>/actors.log")
    shown.add_argument("--debug", action="store_true", help="full tracebacks (Ray's and rayward's) on errors")
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", help="full tracebacks on errors")
    _add_training(sub, shown, debug)
    _add_run_readers(sub, debug)
    _add_scale(sub)
    _add_tools(sub)
    _add_jobs(sub, shown)
    return p


def _add_training(sub: Any, shown: argparse.ArgumentParser, debug: argparse.ArgumentParser) -> None:
    r = sub.add_parser("run", parents=[shown], help="train on an embedded local Ray cluster (or cluster.address)")
    r.add_argument("config", help="YAML config (see configs/)")
    r.add_argument("overrides", nargs="*", help="dotted overrides, anywhere on the line, e.g. grpo.max_steps=10")
    r.add_argument("--name", help="run name (default: generated and printed)")
    r.add_argument("--resume", nargs="?", const=True, default=False, metavar="auto",
                   help="continue from the latest checkpoint of run --name (an error if it has none, or nothing "
                        "left to train); `--resume auto`: continue if there is a checkpoint, else start")
    r.add_argument("--max-retries", type=int, default=0, metavar="N",
                   help="restart a failed driver up to N times, each continuing from the latest checkpoint (not "
                        "after bad input, SIGTERM or Ctrl-C)")
    r.set_defaults(func=_cmd_run)

    e = sub.add_parser("eval", parents=[debug],
                       help="evaluate a checkpoint (or the config's model) on the eval block's data")
    e.add_argument("config", help="YAML config: its eval block (data, k, rewards), model and cluster")
    e.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.num_generations=8 eval.temperature=0")
    e.add_argument("--checkpoint", help="an HF model directory, e.g. runs/NAME/checkpoint-best (default: model)")
    e.add_argument("--name", help="name of the eval's actors and report directory (default: generated)")
    e.add_argument("--output", help="JSON report path (default: <logging.dir>/<name>/eval.json)")
    e.set_defaults(func=_cmd_eval)


def _add_run_readers(sub: Any, debug: argparse.ArgumentParser) -> None:
    """What reads a run directory: samples, plot, view."""
    from orchestrator.view.cli import add_view_parser

    run_help = "run directory, or a run name under --dir"
    sm = sub.add_parser("samples", parents=[debug], help="a run's latest samples: prompt, completion, rewards")
    sm.add_argument("run", help=run_help)
    sm.add_argument("--dir", default="runs", help="logging dir the run name is under (default: runs)")
    sm.add_argument("--step", type=int, help="this step instead of the latest")
    sm.add_argument("-n", "--limit", type=int, default=16, help="samples shown (default 16; 0: all)")
    sm.add_argument("--width", type=int, help="table width in characters (default: the terminal's)")
    sm.set_defaults(func=_cmd_samples)

    pl = sub.add_parser("plot", parents=[debug], help="PNG of a run's rewards, eval reward, phase times, KL, entropy")
    pl.add_argument("run", help=run_help)
    pl.add_argument("--dir", default="runs", help="logging dir the run name is under (default: runs)")
    pl.add_argument("--out", help="PNG path (default: <run dir>/plot.png)")
    pl.set_defaults(func=_cmd_plot)
    add_view_parser(sub, parents=[debug])


def _add_scale(sub: Any) -> None:
    from orchestrator.cli.jobs import default_address
    from orchestrator.cli.scale import POOLS

    s = sub.add_parser("scale", help="resize a running run's reward, environment, judge or teacher pool, or set its "
                                     "autoscaling bounds, or resize its generator fleet")
    s.add_argument("run", help="run name")
    s.add_argument("--reward-workers", type=int, help="pin the reward pool at this many workers (pauses autoscaling)")
    s.add_argument("--env-workers", type=int,
                   help="pin the environment pool at this many workers (pauses autoscaling)")
    s.add_argument("--judge-engines", type=int,
                   help="pin a judge reward's engine pool at this many engines (pauses its autoscaling)")
    s.add_argument("--judge", metavar="REWARD",
                   help="the judge reward --judge-engines or --pool judge applies to (default: the run's only one)")
    s.add_argument("--teacher-engines", type=int,
                   help="pin the distillation teacher's engine pool at this many engines (pauses its autoscaling)")
    s.add_argument("--generators", type=int,
                   help="resize the generator fleet to this many vLLM engines, at the run's next step boundary (a new "
                        "engine loads the current weights before it samples; one removed finishes its calls first)")
    s.add_argument("--min", type=int, help="autoscale with at least this many workers (turns autoscaling on)")
    s.add_argument("--max", type=int, help="autoscale with at most this many workers (turns autoscaling on)")
    s.add_argument("--pool", choices=POOLS, default="reward", help="the pool --min/--max apply to (default: reward)")
    s.add_argument("--address", default=default_address(), help=ADDRESS_HELP)
    s.set_defaults(func=_cmd_scale)


def _add_tools(sub: Any) -> None:
    t = sub.add_parser("tiny-model", help="write the offline tiny model + tokenizer as an HF checkpoint")
    t.add_argument("path")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=_cmd_tiny_model)
    sub.add_parser("rewards", help="list built-in reward functions").set_defaults(func=_cmd_rewards)
    sub.add_parser("config-reference", help="print every config field (markdown)").set_defaults(
        func=_cmd_config_reference
    )


def _add_jobs(sub: Any, shown: argparse.ArgumentParser) -> None:
    """The Jobs API client commands: submit, status, logs, stop, list."""
    from orchestrator.cli.jobs import DEFAULT_MAX_FILE_MIB, default_address

    j = sub.add_parser("submit", parents=[shown], help="submit a run to a Ray cluster through the Jobs API")
    j.add_argument("config", help="YAML config (validated here before anything is uploaded), or a Python script "
                   "(a TRL script using rayward.GRPOTrainer), run as `python SCRIPT args` with its directory")
    j.add_argument("overrides", nargs="*", help="dotted overrides, anywhere on the line, e.g. grpo.max_steps=10 (a "
                   "script: its arguments)")
    j.add_argument("--name", help="run name (default: config name or generated); the job id is rayward-NAME")
    j.add_argument("--address", default=default_address(), help=ADDRESS_HELP)
    j.add_argument("--working-dir", default=None, help="directory shipped as the job's working_dir (default: ., "
                   "or the script's directory)")
    j.add_argument("--exclude", action="append", default=[], help="extra gitignore-style exclude (repeatable)")
    j.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra env var for the run")
    j.add_argument("--max-file-mib", type=float, default=DEFAULT_MAX_FILE_MIB, help="skip larger files in the upload")
    j.add_argument("--no-ship-rayward", action="store_true", help="use the image's installed rayward instead of "
                   "shipping this client's orchestrator/ and actors/ as py_modules")
    j.add_argument("--entrypoint-num-cpus", type=float, help="CPUs reserved for the driver")
    j.add_argument("--max-retries", type=int, default=0, metavar="N",
                   help="the job restarts a failed driver up to N times, each continuing the run from its latest "
                        "checkpoint (not after bad input or `rayward stop`)")
    j.add_argument("--dry-run", action="store_true", help="print the job (entrypoint, runtime_env) and exit")
    j.add_argument("-f", "--follow", action="store_true", help="stream the logs until the run ends")
    j.set_defaults(func=_cmd_submit)

    for cmd, fn, text in (
        ("status", _cmd_status, "a submitted run's status, and its actors while it runs"),
        ("logs", _cmd_logs, "a submitted run's driver log"),
        ("stop", _cmd_stop, "stop a submitted run"),
    ):
        c = sub.add_parser(cmd, help=text)
        c.add_argument("run", help="run name (or a submission id)")
        c.add_argument("--address", default=default_address(), help=ADDRESS_HELP)
        if cmd == "status":
            c.add_argument("--json", action="store_true", help="one JSON object")
        if cmd == "logs":
            c.add_argument("-f", "--follow", action="store_true",
                           help="stream until the run ends; exit 0 iff it succeeded")
        if cmd == "stop":
            c.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the job to stop")
        c.set_defaults(func=fn)
    ls = sub.add_parser("list", help="runs submitted to the cluster")
    ls.add_argument("--address", default=default_address(), help=ADDRESS_HELP)
    ls.add_argument("--all", action="store_true", help="every job, not only rayward runs")
    ls.add_argument("--json", action="store_true", help="a JSON list")
    ls.set_defaults(func=_cmd_list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; `key=value` words after options (`run CONFIG --name x grpo.max_steps=3`) are
    overrides too, in the order given. Anything else unknown is an error, as argparse says it."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "resume", False) not in (False, True, "auto"):  # `--resume key=value`: an override it took
        if "=" not in args.resume:
            parser.error(f"--resume takes no value but `auto`, not {args.resume!r}")
        extra, args.resume = [args.resume, *extra], True
    if getattr(args, "max_retries", 0) < 0:
        parser.error("--max-retries must be 0 or more")
    if extra:
        stray = [w for w in extra if w.startswith("-") or "=" not in w]
        if args.command not in TAKES_OVERRIDES or stray:
            parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from orchestrator.run.cluster import run_sys_path

    for path in run_sys_path():  # `my_rewards:fn` imports from the run directory, as with `python -m`
        if path not in sys.path:
            sys.path.insert(0, path)
    debug = getattr(args, "debug", False)
    try:
        if args.command not in ("tiny-model", "rewards", "config-reference", "samples", "plot", "view"):
            from orchestrator.cli.auth import prepare_client_auth

            prepare_client_auth()  # before anything imports ray: Ray 2.60 reads RAY_AUTH_MODE at import
        return args.func(args)
    except ConfigError as err:
        print(f"rayward: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except AuthError as err:
        print(f"rayward {args.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ConnectionError as err:  # unreachable cluster (orchestrator.run.cluster.UnreachableError and Ray's own)
        print(f"rayward: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except FileNotFoundError as err:  # a run directory or file named on the command line
        print(f"rayward {args.command}: {err.strerror or err}" + (f": {err.filename}" if err.filename else ""),
              file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("rayward: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # noqa: BLE001 - every failure ends in a short message (orchestrator/run/errors.py)
        from orchestrator.run.errors import RunFailed, RunStopped, explain

        if isinstance(err, RunStopped):
            print(f"rayward: {err}", file=sys.stderr)
            return EXIT_INTERRUPTED if err.signal == "SIGINT" else EXIT_STOPPED
        if isinstance(err, RunFailed):
            print(explain(err, debug=debug), file=sys.stderr)
            return EXIT_FAILED
        print(explain(err, debug=debug, headline=f"rayward {args.command}: failed"), file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
