"""`rayward view RUN [RUN ...] [--port P]`: serve the page of one or more runs until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import socket
from pathlib import Path
from typing import Any

from orchestrator.telemetry.metrics import find_run_dir

# Tried first when --port is not given (a URL that stays the same from one `rayward view` to the next, for an ssh
# port forward set up once); when it is taken, any free port.
DEFAULT_PORT = 8765
# Loopback only by default: the page has no authentication, and the run's samples may be private. On a cluster,
# reach it through an ssh tunnel (docs/viewer.md), or pass --host 0.0.0.0 knowingly.
DEFAULT_HOST = "127.0.0.1"


def add_view_parser(sub: Any, parents: list[argparse.ArgumentParser] | None = None) -> argparse.ArgumentParser:
    """The `view` subcommand on rayward's subparsers."""
    v = sub.add_parser("view", parents=parents or [],
                       help="a web page of runs: curves, samples by prompt, token log-probs; follows a running run")
    v.add_argument("runs", nargs="+", metavar="RUN",
                   help="run directory, or a run name under --dir (several: overlaid)")
    v.add_argument("--dir", default="runs", help="logging dir the run names are under (default: runs)")
    v.add_argument("--port", type=int, default=None,
                   help=f"port to serve on (default {DEFAULT_PORT}, or a free one when it is taken; 0: any free one)")
    v.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only; the page has no login)")
    v.set_defaults(func=cmd_view)
    return v


def resolve_run(run: str, logging_dir: str) -> Path:
    """A run directory from what the user typed; a directory the run has not written to yet is one too (the page
    shows it as it starts)."""
    if Path(run).is_dir():
        return Path(run)
    return find_run_dir(run, logging_dir)


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def cmd_view(args: argparse.Namespace) -> int:
    run_dirs = [resolve_run(r, args.dir) for r in args.runs]
    port = args.port
    if port is None:
        port = DEFAULT_PORT if _free(args.host, DEFAULT_PORT) else 0
    try:
        asyncio.run(serve(run_dirs, host=args.host, port=port))
    except KeyboardInterrupt:
        pass
    return 0


async def serve(run_dirs: list[Path], *, host: str, port: int, announce: bool = True) -> None:
    """Serve until cancelled; prints the page's URL first."""
    from aiohttp import web

    from orchestrator.view.server import make_app

    runner = web.AppRunner(make_app(run_dirs), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if port == 0 else port  # noqa: SLF001 - the port 0 chose
    if announce:
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        names = ", ".join(str(d) for d in run_dirs)
        print(f"rayward view: {names}\nrayward view: http://{shown}:{bound}/ (Ctrl-C to stop)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
