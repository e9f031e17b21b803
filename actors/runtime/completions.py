"""The completions log (`completions.jsonl`, `eval_completions.jsonl`): each sample's row with its completion read
from its group's payload where the log is written, so the text never passes through the driver.

The driver sends a step's rows (step, prompt, rewards raw and gated, total, advantage, the reward functions'
log_extra columns, what the SampleInfo says of an agentic sample) with the payload references of their groups;
`CompletionsWriter.write` fetches the payloads, fills in each row's completion (the text; a conversational
prompt's assistant message; an agentic sample's conversation and the prompt as the engine rendered it), writes
every image in a row once under `<run dir>/images/` and appends the rows. In a run the writer is a Ray actor beside
the driver (`NAME/completions`, started by orchestrator/run/build/start.py); in-process (the loop tests, `rayward
eval`'s report) the same class is called directly.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from actors.payloads import PayloadLost, completion_of, fetch

# Images written by the log, by content, under the run directory.
IMAGES_DIR = "images"


def image_files(value: Any, run_dir: Path) -> Any:
    """`value` with every PIL image in it (nested in dicts and lists) replaced by `images/<sha1 of its pixels>.png`,
    written under run_dir once."""
    if isinstance(value, dict):
        return {k: image_files(v, run_dir) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [image_files(v, run_dir) for v in value]
    if type(value).__module__.startswith("PIL.") and hasattr(value, "tobytes"):
        digest = hashlib.sha1(value.tobytes() + repr((value.mode, value.size)).encode()).hexdigest()[:16]
        name = f"{IMAGES_DIR}/{digest}.png"
        path = run_dir / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            value.save(path)
        return name
    return value


def with_completions(rows: list[dict[str, Any]], payloads: list[Any], group_size: int) -> list[dict[str, Any]]:
    """Each row with its sample's completion (and an agentic sample's prompt as the engine rendered it), read from
    its group's payload (rows in group order, group_size per payload). A lost payload's rows get no completion and
    `payload_lost: true` (the log keeps their rewards)."""
    try:
        groups: list[Any] = fetch(payloads)
    except PayloadLost as err:
        groups = [None if g in err.lost else p for g, p in enumerate(_fetch_each(payloads))]
    out = []
    for i, row in enumerate(rows):
        payload = groups[i // group_size]
        if payload is None:
            out.append({**row, "completion": None, "payload_lost": True})
            continue
        s = payload.samples[i % group_size]
        prompt = row.get("prompt") if s.trajectory is None else s.trajectory.prompt
        out.append({**row, "prompt": prompt, "completion": completion_of(prompt, s)})
    return out


def _fetch_each(payloads: list[Any]) -> list[Any]:
    out = []
    for p in payloads:
        try:
            out.append(fetch([p])[0])
        except PayloadLost:
            out.append(None)
    return out


class CompletionsWriter:
    """Appends rows to a run directory's completions logs (see the module docstring)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def write(self, file: str, rows: list[dict[str, Any]], payloads: list[Any], group_size: int,
              table_rows: int = 0) -> list[dict[str, Any]]:
        """Append `rows` (their completions filled in) to <run dir>/<file>; returns the first `table_rows` of them
        as written (a tracker's completions table)."""
        filled = [image_files(r, self.run_dir) for r in with_completions(rows, payloads, group_size)]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / file, "a") as f:
            f.write("".join(json.dumps(r, default=str) + "\n" for r in filled))
        return filled[:table_rows]

    def ping(self) -> None:
        """Health check (the actor answers between writes)."""


__all__ = ["IMAGES_DIR", "CompletionsWriter", "image_files", "with_completions"]
