"""A run directory read as the run writes it, for `rayward view`: each JSON-lines file is followed by its byte
offset (a poll reads only what was appended since the last, never the whole file again), metrics are parsed once
into compact rows, and the completions log and the token record are indexed by step (byte offsets per row), so a
step's samples are read on demand.

A file that shrank or was replaced (a new run in the same directory) is read again from its start, and its
`epoch` goes up so a client knows to drop what it had. A step logged again (a recovery rewound the run) replaces
the rows it had."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from orchestrator.telemetry.metrics import COMPLETIONS_FILE, METRICS_FILE
from orchestrator.view.records import TOKENS_FILE

# Bytes read at once while catching up with a file: a long run's completions log is read in pieces, not whole.
READ_BLOCK = 1 << 23
# Significant digits kept of a metric: beyond what a chart or a hover shows, and the payload stays compact.
METRIC_DIGITS = 6
# A line's step (and a token record's sample) from the line's first bytes: rayward writes `step` first, so the
# index needs no full parse of rows that may hold whole conversations. Anything else is parsed in full.
STEP_PREFIX = re.compile(rb'^\{"step": ?(-?\d+)[,}]')
STEP_SAMPLE_PREFIX = re.compile(rb'^\{"step": ?(-?\d+), ?"sample": ?(\d+)[,}]')


class JsonlTail:
    """A JSON-lines file followed by byte offset. `poll()` returns (reset, [(offset, line bytes)]) for the whole
    lines appended since the last poll; a torn last line (the writer is mid-line) waits for the next poll. reset:
    the file shrank or was replaced since, and the lines are read from its start again."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self._ident: tuple[int, int] | None = None
        self.mtime: float | None = None

    def poll(self) -> tuple[bool, list[tuple[int, bytes]]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            reset = self.offset > 0
            self.offset, self._ident = 0, None
            return reset, []
        ident, reset = (st.st_dev, st.st_ino), False
        if ident != self._ident or st.st_size < self.offset:
            reset = self._ident is not None
            self.offset, self._ident = 0, ident
        self.mtime = st.st_mtime
        lines: list[tuple[int, bytes]] = []
        if st.st_size <= self.offset:
            return reset, lines
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            pending = b""
            while True:
                block = f.read(READ_BLOCK)
                if not block:
                    break
                data = pending + block
                end = data.rfind(b"\n")
                if end < 0:
                    pending = data
                    continue
                pos = self.offset
                for line in data[:end].split(b"\n"):
                    lines.append((pos, line))
                    pos += len(line) + 1
                self.offset = pos
                pending = data[end + 1:]
        return reset, lines


def compact(value: Any) -> float | int | None:
    """A metric value as the page gets it: numbers to METRIC_DIGITS significant digits (ints as they are),
    NaN and infinities as None; anything else (strings, lists) is not charted: None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value
    if not math.isfinite(value):
        return None
    return float(f"{value:.{METRIC_DIGITS}g}")


class MetricsStore:
    """metrics.jsonl as rows of numbers: `rows` in file order (steps and eval rows alike), each {key: number},
    with `steps` beside them; `keys` every numeric key seen, in first-seen order."""

    def __init__(self, path: Path):
        self.tail = JsonlTail(path)
        self.epoch = 0
        self.steps: list[int] = []
        self.rows: list[dict[str, float | int]] = []
        self.keys: dict[str, None] = {}  # an ordered set

    def refresh(self) -> None:
        reset, lines = self.tail.poll()
        if reset:
            self.epoch += 1
            self.steps, self.rows, self.keys = [], [], {}
        for _, line in lines:
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                continue
            values = {}
            for k, v in row.items():
                if k != "step" and (c := compact(v)) is not None:
                    values[k] = c
                    self.keys.setdefault(k)
            self.steps.append(row["step"])
            self.rows.append(values)

    def payload(self, since: int = 0, epoch: int | None = None) -> dict[str, Any]:
        """The rows from `since` on, column by column (a key absent from a row is null in its column). A client
        whose `epoch` is not the current one gets every row."""
        if epoch != self.epoch:
            since = 0
        since = max(0, min(since, len(self.rows)))
        rows = self.rows[since:]
        keys = [k for k in self.keys if any(k in r for r in rows)]
        return {
            "epoch": self.epoch, "since": since, "total": len(self.rows), "mtime": self.tail.mtime,
            "steps": self.steps[since:], "cols": {k: [r.get(k) for r in rows] for k in keys},
        }


def _step_of(line: bytes) -> int | None:
    m = STEP_PREFIX.match(line)
    if m:
        return int(m.group(1))
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) else None


class CompletionsIndex:
    """completions.jsonl by step: each step's rows as (offset, length) in the file, in row order (a row's position
    is its `sample`). Built once, extended as the file grows."""

    def __init__(self, path: Path):
        self.tail = JsonlTail(path)
        self.epoch = 0
        self.rows: dict[int, list[tuple[int, int]]] = {}
        self._last: int | None = None  # the step of the last row read

    def refresh(self) -> None:
        reset, lines = self.tail.poll()
        if reset:
            self.epoch += 1
            self.rows, self._last = {}, None
        for offset, line in lines:
            step = _step_of(line)
            if step is None:
                continue
            if step != self._last:  # a step's rows are one block; that step seen again is a rewound run's
                self.rows[step] = []
            self.rows[step].append((offset, len(line)))
            self._last = step

    def steps(self) -> list[int]:
        return sorted(self.rows)

    def read(self, step: int) -> list[dict[str, Any]]:
        """The step's rows, parsed (a row that does not parse is left out)."""
        out = []
        with open(self.tail.path, "rb") as f:
            for offset, length in self.rows.get(step, []):
                f.seek(offset)
                try:
                    out.append(json.loads(f.read(length)))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue
        return out


class TokensIndex:
    """tokens.jsonl by (step, sample): each line's (offset, length); a sample recorded again (a rewound step)
    is the later line."""

    def __init__(self, path: Path):
        self.tail = JsonlTail(path)
        self.lines: dict[tuple[int, int], tuple[int, int]] = {}

    def refresh(self) -> None:
        reset, lines = self.tail.poll()
        if reset:
            self.lines = {}
        for offset, line in lines:
            m = STEP_SAMPLE_PREFIX.match(line)
            if m:
                key = (int(m.group(1)), int(m.group(2)))
            else:
                try:
                    row = json.loads(line)
                    key = (int(row["step"]), int(row["sample"]))
                except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
                    continue
            self.lines[key] = (offset, len(line))

    @property
    def exists(self) -> bool:
        return self.tail.path.exists()

    def samples(self, step: int) -> list[int]:
        return sorted(s for st, s in self.lines if st == step)

    def read(self, step: int, sample: int) -> dict[str, Any] | None:
        where = self.lines.get((step, sample))
        if where is None:
            return None
        with open(self.tail.path, "rb") as f:
            f.seek(where[0])
            try:
                return json.loads(f.read(where[1]))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None


class RunView:
    """One run directory as the page reads it."""

    def __init__(self, run_dir: Path, label: str):
        self.dir = Path(run_dir)
        self.label = label
        self.metrics = MetricsStore(self.dir / METRICS_FILE)
        self.completions = CompletionsIndex(self.dir / COMPLETIONS_FILE)
        self.tokens = TokensIndex(self.dir / TOKENS_FILE)

    def refresh_samples(self) -> None:
        """Read what the completions log and the token record gained since the last call (a stat per file when
        nothing). Apart from the metrics: the curves never wait for a long run's completions log to be indexed."""
        self.completions.refresh()
        self.tokens.refresh()

    def info(self) -> dict[str, Any]:
        return {"name": self.label, "dir": str(self.dir), "max_steps": max_steps(self.dir),
                "completions": self.completions.tail.path.exists(), "tokens": self.tokens.exists}

    def updated_s(self) -> float | None:
        """Seconds since the run last wrote a metrics row (None before it wrote one)."""
        return None if self.metrics.tail.mtime is None else max(0.0, time.time() - self.metrics.tail.mtime)


def max_steps(run_dir: Path) -> int | None:
    """grpo.max_steps from the run directory's config.yaml, where the run wrote one."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return None
    try:
        import yaml

        cfg = yaml.safe_load(path.read_text())
        value = cfg.get("grpo", {}).get("max_steps")
    except Exception:  # noqa: BLE001 - a config the page cannot read only loses the progress count
        return None
    return value if isinstance(value, int) else None
