"""Where a run's completions logs are written (actors/runtime/completions.py fills in the completions from the
payloads): by the writer actor beside the driver in a run (`ActorCompletions`: the driver sends rows and payload
references, never text), or in this process (`LocalCompletions`: the loop tests' fakes hold their payloads
in-process). Chosen when the run is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from actors.runtime.completions import CompletionsWriter


class Completions(Protocol):
    """Where the completions logs are written: rows without their completions, and their groups' payloads."""

    def write(self, file: str, rows: list[dict[str, Any]], payloads: list[Any], group_size: int,
              table_rows: int = 0) -> list[dict[str, Any]]:
        """Append the rows, their completions filled in from the payloads; the first `table_rows` as written."""

    def drain(self) -> None:
        """Wait for the writes sent."""

    def kill(self) -> None:
        """The last write lands, then the writer goes."""


class LocalCompletions:
    def __init__(self, run_dir: Path) -> None:
        self.writer = CompletionsWriter(run_dir)

    def write(self, file: str, rows: list[dict[str, Any]], payloads: list[Any], group_size: int,
              table_rows: int = 0) -> list[dict[str, Any]]:
        return self.writer.write(file, rows, payloads, group_size, table_rows)

    def drain(self) -> None:
        pass

    def kill(self) -> None:
        pass


class ActorCompletions:
    """The writer actor `NAME/completions`: a step's write runs while the next step works; each write first waits
    for the one before (the log stays in step order, and at most one step's rows wait in the actor). A tracker's
    table waits for its rows."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._pending: Any = None

    def write(self, file: str, rows: list[dict[str, Any]], payloads: list[Any], group_size: int,
              table_rows: int = 0) -> list[dict[str, Any]]:
        import ray

        self.drain()
        ref = self.handle.write.remote(file, rows, payloads, group_size, table_rows)
        if table_rows:
            return ray.get(ref)
        self._pending = ref
        return []

    def drain(self) -> None:
        """Wait for the last write (the end of a run, a checkpoint's log)."""
        import ray

        if self._pending is not None:
            ray.get(self._pending)
            self._pending = None

    def kill(self) -> None:
        import ray

        try:
            self.drain()
        finally:
            ray.kill(self.handle, no_restart=True)
