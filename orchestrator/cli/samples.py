"""`rayward samples RUN`: what the model wrote at a step (the latest by default), as a table on the terminal.

Reads the run's completions log (`<run dir>/completions.jsonl`, written by orchestrator/loop/phases.py): one row per
trained sample with its prompt, completion, each reward's raw score, the weighted total and the advantage. With
tools the completion is the whole conversation: tool calls marked `→`, tool results `←`, and a stop column.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

from orchestrator.telemetry.metrics import COMPLETIONS_FILE, find_run_dir

# Characters of a prompt / completion shown in a cell (a table of whole completions would not fit a screen).
CELL_CHARS = 240
# A completion that is a conversation (tools) is several turns: more room, still a screen.
CONVERSATION_CHARS = 960
# Bytes read at a time from the end of the log when looking for the latest step.
TAIL_BLOCK = 1 << 20


def conversation(messages: list[dict[str, Any]]) -> str:
    """A completion's messages as text: each assistant message's content, its tool calls marked `→ name(args)`,
    each tool result marked `← name: result`. A single plain assistant message is its content, as before tools."""
    lines = []
    for msg in messages:
        content = msg.get("content") or ""
        if msg.get("role") == "tool":  # a multimodal result's blocks: its text, each image as <image FILE>
            lines.append(f"← {msg.get('name', 'tool')}: "
                         f"{parts_text(content) if isinstance(content, list) else content}")
            continue
        if content:
            lines.append(content if isinstance(content, str) else json.dumps(content, default=str))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            lines.append(f"→ {fn.get('name')}({args if isinstance(args, str) else json.dumps(args, default=str)})")
    return "\n".join(lines)


def parts_text(parts: list[Any]) -> str:
    """Content parts (a vision-language prompt, a tool's multimodal result) as text: their text, each image as
    <image FILE> (the completions log names each image's file under the run dir)."""
    return " ".join(f"<image {p.get('image')}>" if p.get("type") == "image" else str(p.get("text", ""))
                    for p in parts if isinstance(p, dict))


def visible(text: Any, limit: int = CELL_CHARS) -> str:
    """A cell's text: prompts (chat messages) as their last message, control characters escaped (a tiny model
    writes them; a terminal would act on them), cut at `limit` characters."""
    if isinstance(text, list) and text and isinstance(text[-1], dict):
        text = text[-1].get("content", "")
    if isinstance(text, list):  # content parts (a vision-language prompt)
        text = parts_text(text)
    text = text if isinstance(text, str) else json.dumps(text, default=str)
    out = "".join(
        c if c == "\n" or not unicodedata.category(c).startswith("C") else c.encode("unicode_escape").decode()
        for c in text
    )
    return out if len(out) <= limit else out[:limit] + "…"


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # a torn last line while the run writes
    return row if isinstance(row, dict) and "step" in row else None


def latest_step_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of the last step in a completions log, read from its end (the log of a long run is large)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        pos, tail, rows, step = f.tell(), b"", [], None
        while pos > 0:
            size = min(TAIL_BLOCK, pos)
            pos -= size
            f.seek(pos)
            lines = (f.read(size) + tail).split(b"\n")
            tail = lines.pop(0) if pos > 0 else b""  # possibly the second half of a line: join with the next block
            for line in reversed(lines):
                row = _parse(line)
                if row is None:
                    continue
                if step is None:
                    step = row["step"]
                if row["step"] != step:
                    return rows[::-1]
                rows.append(row)
    return rows[::-1]


def step_rows(path: Path, step: int) -> list[dict[str, Any]]:
    rows = []
    with open(path, "rb") as f:
        for line in f:
            row = _parse(line)
            if row is not None and row["step"] == step:
                rows.append(row)
    return rows


def samples_table(rows: list[dict[str, Any]], *, title: str, limit: int = 0) -> Any:
    """A rich Table: #, prompt, completion, each reward's raw score, total, advantage (TRL's columns)."""
    from rich import box
    from rich.table import Table

    rewards = [k for k in rows[0] if k.startswith("rewards/")] if rows else []
    table = Table(title=title, box=box.HORIZONTALS, show_lines=True, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("prompt", ratio=2, overflow="fold")
    table.add_column("completion", ratio=3, overflow="fold")
    agentic = bool(rows) and "stop_reason" in rows[0]
    if agentic:
        table.add_column("stop")
    for k in rewards:
        table.add_column(k.split("/", 1)[1], justify="right")
    table.add_column("total", justify="right")
    table.add_column("advantage", justify="right")

    def num(v: Any) -> str:
        return "None" if v is None else f"{v:.3g}" if isinstance(v, (int, float)) else str(v)

    for i, r in enumerate(rows[:limit] if limit else rows):
        completion, limit_chars = r.get("completion"), CELL_CHARS
        if isinstance(completion, list) and completion and isinstance(completion[0], dict):
            limit_chars = CONVERSATION_CHARS if len(completion) > 1 else CELL_CHARS
            completion = conversation(completion)  # the whole conversation, tool calls and results marked
        extra = [str(r.get("stop_reason"))] if agentic else []
        table.add_row(str(i), visible(r.get("prompt")), visible(completion, limit_chars), *extra,
                      *(num(r.get(k)) for k in rewards), num(r.get("total")), num(r.get("advantage")))
    return table


def print_samples(run: str, *, logging_dir: str = "runs", step: int | None = None, limit: int = 16,
                  width: int | None = None) -> int:
    """The CLI command: 0, or 2 when the run has no samples (at that step)."""
    from rich.console import Console

    run_dir = find_run_dir(run, logging_dir)
    path = run_dir / COMPLETIONS_FILE
    if not path.exists():
        print(f"rayward samples: {run_dir} has no {COMPLETIONS_FILE} (logging.log_completions: false?)",
              file=sys.stderr)
        return 2
    rows = latest_step_rows(path) if step is None else step_rows(path, step)
    if not rows:
        print(f"rayward samples: no samples{'' if step is None else f' at step {step}'} in {path}", file=sys.stderr)
        return 2
    shown = min(limit, len(rows)) if limit else len(rows)
    title = (f"{run_dir.name}: step {rows[0]['step']} (policy version {rows[0].get('policy_version')}), "
             f"{shown} of {len(rows)} samples")
    Console(width=width, highlight=False).print(samples_table(rows, title=title, limit=limit))
    return 0
