"""The run on the driver's terminal: a live bar on a terminal, one line per step otherwise, a summary at the end.

On a terminal (`rich`): `step 12/40 ━━━━━━━━╺━━━━━━━ reward 0.213 | 0.31 s/step | ETA 0:00:09`, with the
driver's messages printed above it. Not on a terminal (Ray Jobs logs, CI, `| tee`): the step lines
`step   12/40 | reward 0.213 | ...` that tools and tests grep. Either way the run ends with a table of the
main metrics at its start and end, and where its files are.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

# Metrics of the per-step line, in order (the last path part names them: rewards/x/mean -> mean).
STEP_LINE_KEYS = (
    "reward", "reward_std", "loss", "kl", "entropy", "completions/mean_length",
    "sampling/sampling_logp_difference/max",
)
# Steps whose wall time the ETA averages: recent enough to follow a change of pace (a curriculum lengthening
# completions), long enough not to jump with one slow step.
ETA_WINDOW = 10
# Steps averaged for the summary's "start" and "end" columns (a single step's reward is noisy).
SUMMARY_WINDOW = 5


def step_line(step: int, max_steps: int, row: dict[str, Any]) -> str:
    """`step   12/40 | reward 0.213 | ... | time generate 0.11s reward 0.03s ...` (the non-terminal display)."""
    parts = [f"step {step:>4}/{max_steps}"]
    for k in STEP_LINE_KEYS:
        if isinstance(row.get(k), (int, float)):
            parts.append(f"{k.split('/')[-1] if k.count('/') < 2 else 'logp_gap'} {row[k]:.4g}")
    t = {k[5:]: v for k, v in row.items() if k.startswith("time/") and k != "time/step"}
    parts.append("time " + " ".join(f"{k} {v:.2f}s" for k, v in t.items()))
    return " | ".join(parts)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class StepClock:
    """Wall seconds per step (between consecutive step reports) and the ETA from the recent ones."""

    def __init__(self, window: int = ETA_WINDOW):
        self._times: deque[float] = deque(maxlen=window)
        self._last: float | None = None

    def start(self) -> None:
        self._last = time.monotonic()

    def tick(self) -> float | None:
        now = time.monotonic()
        dt = now - self._last if self._last is not None else None
        if dt is not None:
            self._times.append(dt)
        self._last = now
        return dt

    @property
    def seconds_per_step(self) -> float | None:
        return sum(self._times) / len(self._times) if self._times else None

    def eta(self, remaining: int) -> float | None:
        per = self.seconds_per_step
        return per * max(remaining, 0) if per is not None else None


class Display:
    """Messages only (logging.progress: false): the base of the two step displays."""

    def __init__(self, max_steps: int, stream: TextIO | None = None):
        self.max_steps = max_steps
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout  # looked up late: pytest's capture, rich's redirection

    def start(self, done: int) -> None:
        """The loop begins with `done` steps already trained (resume)."""

    def step(self, step: int, row: dict[str, Any]) -> None:
        """A step was logged."""

    def message(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Stop any live output (idempotent)."""

    def summary(self, table: Any, footer: list[str]) -> None:
        """The end of the run: its table, then lines that may be long (the terminal wraps them, not rich)."""
        from rich.console import Console

        Console(file=self.stream, highlight=False).print(table)
        for line in footer:
            self.message(line)


class StepLines(Display):
    """One line per step (not a terminal)."""

    def step(self, step: int, row: dict[str, Any]) -> None:
        print(step_line(step, self.max_steps, row), file=self.stream, flush=True)


class LiveBar(Display):
    """A rich progress bar on a terminal: step/total, reward, seconds per step, ETA; messages print above it."""

    def __init__(self, max_steps: int, console: Any = None):
        from rich.console import Console

        super().__init__(max_steps)
        self.console = console or Console()
        self.clock = StepClock()
        self._progress: Any = None
        self._task: Any = None

    def start(self, done: int) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.clock.start()
        self._progress = Progress(
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("| {task.fields[per_step]}"),
            TextColumn("| ETA {task.fields[eta]}"),
            TextColumn("| elapsed"),
            TimeElapsedColumn(),
            console=self.console,
            redirect_stdout=True,  # the driver's prints and rayward's actor lines go above the bar
            redirect_stderr=True,
        )
        self._task = self._progress.add_task(
            "train", total=self.max_steps, completed=done, reward="-", per_step="- s/step", eta=format_duration(None)
        )
        self._progress.start()

    def step(self, step: int, row: dict[str, Any]) -> None:
        if self._progress is None:
            self.start(step - 1)
        self.clock.tick()
        reward = row.get("reward")
        per = self.clock.seconds_per_step
        self._progress.update(
            self._task,
            completed=step,
            reward=f"{reward:.4g}" if isinstance(reward, (int, float)) else "-",
            per_step=f"{per:.2f} s/step" if per is not None else "- s/step",
            eta=format_duration(self.clock.eta(self.max_steps - step)),
        )

    def message(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)  # the terminal wraps, not rich

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def summary(self, table: Any, footer: list[str]) -> None:
        self.console.print(table)
        for line in footer:
            self.message(line)


def is_terminal(stream: TextIO | None = None) -> bool:
    """A live display fits: an interactive terminal that is not `TERM=dumb`."""
    from rich.console import Console

    console = Console(file=stream or sys.stdout)
    return console.is_terminal and not console.is_dumb_terminal


def open_display(progress: bool, max_steps: int, *, live: bool | None = None) -> Display:
    """The run's display: a live bar on a terminal, step lines elsewhere, messages only without progress."""
    if not progress:
        return Display(max_steps)
    if live if live is not None else is_terminal():
        return LiveBar(max_steps)
    return StepLines(max_steps)


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return sum(vals) / len(vals) if vals else None


def _is_eval(row: dict[str, Any]) -> bool:
    return "eval/reward" in row


def summary_rows(history: list[dict[str, Any]],
                 window: int = SUMMARY_WINDOW) -> list[tuple[str, float | None, float | None]]:
    """(metric, mean over the first `window` steps, mean over the last `window`) for the end-of-run table:
    reward, each reward function, eval reward, KL and entropy, completion length, step and phase times. `history`
    holds step rows and eval rows (logged in between); the eval reward's columns are the first and the last eval."""
    steps = [r for r in history if not _is_eval(r)]
    evals = [r for r in history if _is_eval(r)]
    first, last = steps[:window], steps[-window:]
    rewards = ["reward", *sorted({k for r in steps for k in r if k.startswith("rewards/") and k.endswith("/mean")})]
    rest = [k for k in ("kl", "entropy", "completions/mean_length", "time/step") if any(k in r for r in steps)]
    rest += sorted({k for r in steps for k in r if k.startswith("time/") and k not in ("time/step",)})
    out = [(k, _mean(first, k), _mean(last, k)) for k in rewards]
    if evals:
        out.append(("eval/reward (first, last eval)", evals[0]["eval/reward"], evals[-1]["eval/reward"]))
    out += [(k, _mean(first, k), _mean(last, k)) for k in rest]
    return [row for row in out if row[1] is not None or row[2] is not None]


def summary_table(
    history: list[dict[str, Any]], *, name: str, elapsed_s: float, window: int = SUMMARY_WINDOW,
) -> Any:
    """The table printed when a run ends: the main metrics over its first and its last steps (the eval reward:
    its first and its last eval)."""
    from rich import box
    from rich.table import Table

    steps = [r["step"] for r in history if not _is_eval(r)]
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "no steps"
    table = Table(
        title=f"rayward run {name!r}: {span} in {format_duration(elapsed_s)}", box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column(f"first {min(window, len(steps))} steps", justify="right")
    table.add_column(f"last {min(window, len(steps))} steps", justify="right")
    for key, a, b in summary_rows(history, window):
        table.add_row(key, "-" if a is None else f"{a:.4g}", "-" if b is None else f"{b:.4g}")
    return table


def summary_footer(run_dir: Path, checkpoint: Path | None = None) -> list[str]:
    """The lines after the summary table: the run's files and the commands that look into them."""
    files = [p.name for p in (run_dir / "metrics.jsonl", run_dir / "completions.jsonl", run_dir / "actors.log")
             if p.exists()]
    if checkpoint is not None:
        files.append(checkpoint.name)
    return [f"in {run_dir}: {', '.join(files) or 'nothing yet'}", f"see the samples: rayward samples {run_dir}",
            f"plot the run:    rayward plot {run_dir}"]
