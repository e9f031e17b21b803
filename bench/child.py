"""A measurement in a process of its own (a fresh allocator and torch for each peak-memory or timing number): the
parent runs the script again with internal flags; the child prints one `RESULT <json>` line."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

PREFIX = "RESULT "


def report(result: Any) -> None:
    """The child's side: print the measurement for the parent."""
    print(PREFIX + json.dumps(result), flush=True)


def run_child(script: str, args: list[str], env: dict[str, str]) -> Any:
    """The parent's side: run `script` with `args` in a fresh interpreter; its result, or exit naming the failure."""
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env)
    line = next((x for x in p.stdout.splitlines() if x.startswith(PREFIX)), None)
    if line is None:
        sys.exit(f"{args} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line.removeprefix(PREFIX))
