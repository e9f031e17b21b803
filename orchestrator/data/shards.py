"""Prompt datasets read as a stream (`data.streaming: true`): shards of parquet or jsonl files (a directory, a glob, one
file) or a dataset saved with `datasets.save_to_disk`, read as drawn, so the driver's memory stays flat in the
dataset's size; the run's prompt stream over them (`StreamSource`, the twin of sources.py's PromptSource), its position
a `StreamPosition` that every checkpoint keeps, so a resume is exact.

**Order.** Each epoch reads the shards in an order shuffled from the run's seed (file order without
data.shuffle_dataset), each shard's rows in file order, through a shuffle buffer of data.shuffle_buffer_size rows,
as `datasets`' IterableDataset.shuffle does: the buffer fills first, then each draw takes a row at a random place in
it and puts the next row read there. Without data.shuffle_dataset, rows are drawn in file order. One random
generator (random.Random(seed)) shuffles the shards and picks in the buffer; its state is in the position.

**Position.** The shard being read and the rows read from it, the buffer as references to its rows ((shard, row
index within the shard): a few integers per row, not the rows), the generator's state, the draws made and the draws
to skip (a resumed pipelined run replays the batches it had generated but not trained: PromptSource's docstring).
Restoring re-reads the buffer's rows by reference (parquet: the row groups that hold them) and the shard from its
offset.

**Bad input** (data.on_bad_row): a parquet shard whose footer cannot be read, or whose columns (in its footer) are
not the first row's, stops the run before anything starts, named. A shard that fails while it is read, a jsonl line
that is not a JSON object, a row without the prompt column, a row whose columns are not the first row's (a batch's
columns are its first row's: a row without one of them cannot join it) or a row whose image does not decode is named
(file, row): `raise` (the default) stops the run with that message; `skip` leaves it out and counts it
(`StreamSource.skipped`, the step metric `data/skipped_rows`; the first few are named in the driver's log). A
dataset with no readable row stops the run either way.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from actors.vision import ImageError
from orchestrator.config import DataConfig, DataSource
from orchestrator.data.sources import (
    EVAL_DRAW,
    NAMED_BAD_ROWS,
    DataError,
    DataPosition,
    EpochOrder,
    Prompt,
    PromptEncoder,
    replay_skip,
)

# The file kinds a stream reads.
SUFFIXES = (".parquet", ".jsonl")
# Rows a saved `datasets` dataset is cut into, as shards (their order is shuffled per epoch): small enough that the
# shard order mixes the dataset, large enough that the order list is short for millions of rows.
ARROW_SHARD_ROWS = 100_000
# Rows read from the stream's start for the checks before anything starts (the prompt column, images, judge
# templates, environment routing): what data.py's checks read of an in-memory dataset's first rows.
PEEK_ROWS = 1000
# Rows a parquet reader decodes at a time.
PARQUET_BATCH = 1024


class Shard:
    """One file (or a range of a saved dataset): rows by index within it."""

    columns: list[str] | None = None  # its columns where the file says them before a row is read (parquet)

    name: str

    def read(self, start: int) -> Iterator[dict[str, Any]]:
        """Rows from the `start`-th on, in file order."""
        raise NotImplementedError

    def get(self, indices: list[int]) -> dict[int, dict[str, Any]]:
        """Rows by index (a restore's buffer). A buffer holds only good rows, so a bad row on the way (skipped and
        counted when the stream first read it) is stepped over, not raised: the checkpoint stays loadable."""
        wanted, out, start = set(indices), {}, 0
        while len(out) < len(wanted):
            try:
                for i, row in enumerate(self.read(start), start):
                    if i in wanted:
                        out[i] = row
                        if len(out) == len(wanted):
                            break
                break
            except BadRow as err:
                start = err.row + 1
        return out


class JsonlShard(Shard):
    def __init__(self, path: Path) -> None:
        self.path, self.name = path, str(path)

    def read(self, start: int) -> Iterator[dict[str, Any]]:
        with open(self.path, encoding="utf-8") as f:
            for i, line in enumerate(f):  # one line, one row: its index is the line's
                if i < start:
                    continue
                if not line.strip():
                    raise BadRow(self.name, i, "an empty line")
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise BadRow(self.name, i, f"not valid JSON ({err})") from None
                if not isinstance(row, dict):
                    raise BadRow(self.name, i, f"a {type(row).__name__}, not an object")
                yield row


class ParquetShard(Shard):
    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.path, self.name = path, str(path)
        try:
            self._file = pq.ParquetFile(path)
        except Exception as err:  # noqa: BLE001 - pyarrow's reason, with the file named
            raise BadShard(self.name, f"{type(err).__name__}: {err}") from None
        meta = self._file.metadata
        self.groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self.rows = meta.num_rows
        self.columns = list(self._file.schema_arrow.names)

    def _group_of(self, index: int) -> tuple[int, int]:
        """(row group, index of its first row) of a row."""
        first = 0
        for g, n in enumerate(self.groups):
            if index < first + n:
                return g, first
            first += n
        return len(self.groups), first

    def read(self, start: int) -> Iterator[dict[str, Any]]:
        g, first = self._group_of(start)
        skip = start - first
        for group in range(g, len(self.groups)):
            for batch in self._file.iter_batches(batch_size=PARQUET_BATCH, row_groups=[group]):
                rows = batch.to_pylist()
                if skip:
                    rows, skip = rows[skip:], max(skip - len(rows), 0)
                yield from rows

    def get(self, indices: list[int]) -> dict[int, dict[str, Any]]:
        by_group: dict[int, list[int]] = {}
        for i in indices:
            by_group.setdefault(self._group_of(i)[0], []).append(i)
        out = {}
        for g, wanted in by_group.items():
            first = sum(self.groups[:g])
            rows = self._file.read_row_group(g).to_pylist()
            out.update({i: rows[i - first] for i in wanted})
        return out


class ArrowShard(Shard):
    """Rows lo..hi of a saved `datasets` dataset (memory-mapped: rows are read as asked for)."""

    def __init__(self, dataset: Any, lo: int, hi: int, name: str) -> None:
        self.dataset, self.lo, self.hi, self.name = dataset, lo, hi, f"{name}[{lo}:{hi}]"

    def read(self, start: int) -> Iterator[dict[str, Any]]:
        for i in range(self.lo + start, self.hi, PARQUET_BATCH):
            yield from _rows_of(self.dataset[i: min(i + PARQUET_BATCH, self.hi)])

    def get(self, indices: list[int]) -> dict[int, dict[str, Any]]:
        return {i: dict(self.dataset[self.lo + i]) for i in indices}


def _rows_of(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


class BadRow(Exception):
    def __init__(self, shard: str, row: int, why: str) -> None:
        super().__init__(f"{shard} row {row}: {why}")
        self.shard, self.row, self.why = shard, row, why


class BadShard(Exception):
    def __init__(self, shard: str, why: str) -> None:
        super().__init__(f"{shard}: cannot be read ({why})")
        self.shard, self.why = shard, why


def column_mismatch(columns: list[str], stream: frozenset[str], prompt_column: str) -> str | None:
    """Why a row (or a shard) with `columns` cannot join a stream whose rows have `stream` (the first row's
    columns), or None: both the same, the prompt column aside (its absence is named on its own, and an environment
    may supply it)."""
    mine = set(columns) - {prompt_column}
    if mine == stream:
        return None
    return (f"its columns {sorted(columns)} are not the stream's {sorted(stream | {prompt_column})} (missing "
            f"{sorted(stream - mine)}, extra {sorted(mine - stream)})")


def stream_columns(row: dict[str, Any], prompt_column: str) -> frozenset[str]:
    """The columns every row of a stream must have: its first row's, the prompt column aside."""
    return frozenset(row) - {prompt_column}


def shards(cfg: DataSource, field: str = "data") -> list[Shard]:
    """The shards `cfg.path` names: a directory's parquet/jsonl files, a glob's, one file, or a saved dataset's
    rows in ARROW_SHARD_ROWS ranges; DataError naming the field when there are none."""
    path = cfg.path
    if path is None:
        raise DataError(f"{field}.streaming: give {field}.path (a directory, a glob or a file of parquet/jsonl "
                        "shards, or a dataset saved with datasets.save_to_disk)")
    p = Path(path)
    if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
        import datasets

        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[cfg.split]
        return [ArrowShard(ds, lo, min(lo + ARROW_SHARD_ROWS, len(ds)), str(p))
                for lo in range(0, len(ds), ARROW_SHARD_ROWS)]
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
    elif p.is_file():
        files = [p]
    else:
        files = sorted(Path(f) for f in glob.glob(path, recursive=True) if Path(f).suffix in SUFFIXES)
    if not files:
        raise DataError(f"{field}.path {path!r}: no {'/'.join(SUFFIXES)} files to stream (a directory, a glob or a "
                        "file of shards, or a dataset saved with datasets.save_to_disk)")
    kinds = {f.suffix for f in files}
    if not kinds <= set(SUFFIXES):
        raise DataError(f"{field}.path {path!r}: streams read {SUFFIXES}, not {sorted(kinds - set(SUFFIXES))}")
    try:
        return [ParquetShard(f) if f.suffix == ".parquet" else JsonlShard(f) for f in files]
    except BadShard as err:  # a parquet file whose footer cannot be read: known before anything starts
        raise DataError(f"{field}.path: {err}") from None


@dataclass(frozen=True)
class StreamPosition:
    """Where a stream is (see the module docstring); `to_json`/`from_json`: the checkpoint's `data`."""

    epoch: int
    shard_order: list[int]
    shard_cursor: int  # index into shard_order of the shard being read
    offset: int  # rows of that shard read into the buffer
    buffer: list[tuple[int, int]]  # the shuffle buffer's rows: (shard, row index within it)
    served: int
    rng: tuple[Any, ...]
    skip: tuple[int, ...] = ()
    skipped: int = 0  # bad rows left out so far (on_bad_row: skip)
    KIND = "stream"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "epoch": self.epoch, "shard_order": self.shard_order,
                "shard_cursor": self.shard_cursor, "offset": self.offset, "buffer": [list(b) for b in self.buffer],
                "served": self.served, "rng": self.rng, "skip": list(self.skip), "skipped": self.skipped}

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> StreamPosition:
        version, internal, gauss = state["rng"]
        return cls(state["epoch"], list(state["shard_order"]), state["shard_cursor"], state["offset"],
                   [(int(s), int(i)) for s, i in state["buffer"]], state["served"],
                   (version, tuple(internal), gauss), tuple(state["skip"]), state.get("skipped", 0))


@dataclass
class _Reader:
    """The shard being read: its index and the rows read so far."""

    shard: int
    offset: int
    rows: Iterator[dict[str, Any]] = field(repr=False)


class StreamSource:
    """Serves prompts `k` at a time from shards read as drawn (see the module docstring); PromptSource's interface:
    next_batch, state, restore, untrained_position, epoch_progress, encode, rows (the first PEEK_ROWS rows, for
    start-up checks)."""

    def __init__(self, shard_list: list[Shard], tokenizer: Any, cfg: DataConfig, seed: int = 0,
                 template_kwargs: dict[str, Any] | None = None, images: Any = None, *, prompt_optional: bool = False,
                 log: Callable[[str], None] = print) -> None:
        if not shard_list:
            raise DataError("data.path: no shards")
        self.shards, self.cfg, self.tokenizer = shard_list, cfg, tokenizer
        self.prompt_optional, self.log = prompt_optional, log
        self.encode = PromptEncoder(tokenizer, cfg.prompt_column, template_kwargs, images)
        self.buffer_size = cfg.shuffle_buffer_size if cfg.shuffle_dataset else 1
        self.order = EpochOrder(len(shard_list), cfg.shuffle_dataset, seed)  # its rng also draws from the buffer
        self.served, self.skipped = 0, 0
        self.curriculum = None  # a stream samples uniformly (DataConfig refuses a curriculum with streaming)
        self._skip: set[int] = set()
        self._buffer: list[tuple[tuple[int, int], dict[str, Any]]] = []
        self._reader: _Reader | None = None
        self.rows = peek(shard_list, PEEK_ROWS, cfg, prompt_optional=prompt_optional)
        self.columns = stream_columns(self.rows[0], cfg.prompt_column)

    @property
    def epoch(self) -> int:
        return self.order.epoch

    # --- reading ------------------------------------------------------------------------------------------

    def _new_epoch(self) -> None:
        self.order.new_epoch()
        self._reader = None

    def _open(self, offset: int = 0) -> _Reader | None:
        """The reader of the shard at the cursor (from `offset`), or None past the last shard."""
        if self.order.done:
            return None
        s = self.order.current()
        return _Reader(s, offset, self.shards[s].read(offset))

    def _next_row(self) -> tuple[tuple[int, int], dict[str, Any]] | None:
        """The next good row of this epoch in shard order, or None at its end (bad rows named or skipped)."""
        while True:
            if self._reader is None:
                self._reader = self._open()
                if self._reader is None:
                    return None
            r = self._reader
            try:
                row = next(r.rows)
            except StopIteration:
                self.order.cursor += 1
                self._reader = None
                continue
            except BadRow as err:
                r.offset += 1
                r.rows = self.shards[r.shard].read(r.offset)
                self._bad(str(err))
                continue
            except BadShard as err:
                self.order.cursor += 1
                self._reader = None
                self._bad(str(err))
                continue
            except Exception as err:  # noqa: BLE001 - the reader's own failure: the shard is unreadable from here
                self.order.cursor += 1
                self._reader = None
                self._bad(f"{self.shards[r.shard].name}: cannot be read ({type(err).__name__}: {err})")
                continue
            ref = (r.shard, r.offset)
            r.offset += 1
            if self.cfg.prompt_column not in row and not self.prompt_optional:
                self._bad(f"{self.shards[r.shard].name} row {ref[1]}: no prompt column {self.cfg.prompt_column!r} "
                          f"(columns: {sorted(row)})")
                continue
            why = column_mismatch(list(row), self.columns, self.cfg.prompt_column)
            if why is not None:
                self._bad(f"{self.shards[r.shard].name} row {ref[1]}: {why}")
                continue
            return ref, row

    def _bad(self, what: str) -> None:
        if self.cfg.on_bad_row == "raise":
            raise DataError(f"data: {what} (data.on_bad_row: skip leaves bad rows out, counted)")
        self.skipped += 1
        if self.skipped <= NAMED_BAD_ROWS:
            self.log(f"rayward: data: skipped {what}" + (" (further bad rows are only counted: data/skipped_rows)"
                                                          if self.skipped == NAMED_BAD_ROWS else ""))

    def _draw_row(self) -> tuple[tuple[int, int], dict[str, Any]]:
        """The next row of the stream: from the shuffle buffer (filled first), epochs on as they end."""
        empty_epochs = 0
        while True:
            while len(self._buffer) < self.buffer_size:
                item = self._next_row()
                if item is None:
                    break
                self._buffer.append(item)
            if self._buffer:
                if self.buffer_size == 1:
                    return self._buffer.pop()
                i = self.order.rng.randrange(len(self._buffer))
                item = self._buffer[i]
                self._buffer[i] = self._buffer[-1]
                self._buffer.pop()
                return item
            empty_epochs += 1
            if empty_epochs > 1:
                raise DataError(f"data.path {self.cfg.path!r}: no readable row with a prompt")
            self._new_epoch()

    def next_batch(self, k: int) -> list[Prompt]:
        """The next k prompts: each row, its token ids and its draw index."""
        out = []
        while len(out) < k:
            (shard, index), row = self._draw_row()
            draw = self.served
            self.served += 1
            if draw in self._skip:
                self._skip.discard(draw)
                continue
            try:
                out.append(self.encode(row, draw, where=f"{self.shards[shard].name} row {index}"))
            except ImageError as err:  # known only when drawn (the first rows' are checked before the run)
                self._bad(str(err))
        return out

    def observe(self, draws: list[int], totals: list[float], group_size: int, step: int) -> None:
        """A stream keeps no per-prompt statistics (data.sampler is uniform)."""

    def metrics(self) -> dict[str, float]:
        return {"data/skipped_rows": self.skipped}

    @property
    def epoch_progress(self) -> float:
        """Fractional epochs served: whole epochs, and the share of this epoch's shards read."""
        return self.epoch + self.order.cursor / len(self.shards)

    # --- position -----------------------------------------------------------------------------------------

    def state(self) -> StreamPosition:
        offset = self._reader.offset if self._reader is not None else 0
        o = self.order
        return StreamPosition(o.epoch, list(o.order), o.cursor, offset, [ref for ref, _ in self._buffer],
                              self.served, o.rng.getstate(), tuple(sorted(self._skip)), self.skipped)

    def untrained_position(self, mark: StreamPosition, untrained: list[range]) -> StreamPosition:
        """PromptSource.untrained_position's, for a stream."""
        return replace(mark, skip=replay_skip(mark.served, mark.skip, self.served, untrained))

    def restore(self, position: StreamPosition) -> None:
        if not isinstance(position, StreamPosition):
            raise DataError("data.streaming: the checkpoint's data position is an in-memory dataset's; resume it "
                            "with data.streaming false (or start the run afresh)")
        self.served, self.skipped = position.served, position.skipped
        self.order.restore(position.epoch, position.shard_order, position.shard_cursor, position.rng)
        self._skip = set(position.skip)
        by_shard: dict[int, list[int]] = {}
        for s, i in position.buffer:
            by_shard.setdefault(s, []).append(i)
        rows = {s: self.shards[s].get(indices) for s, indices in by_shard.items()}
        self._buffer = [((s, i), rows[s][i]) for s, i in position.buffer]
        self._reader = self._open(position.offset) if not self.order.done else None


def peek(shard_list: list[Shard], n: int, cfg: DataSource, *, prompt_optional: bool = False) -> list[dict[str, Any]]:
    """The first n rows in file order (the start-up checks' rows, an eval set's held-out rows); DataError naming the
    file when the first shard cannot be read, its first row has no prompt column, or a parquet shard's columns (its
    footer's) are not the first row's."""
    out: list[dict[str, Any]] = []
    for shard in shard_list:
        try:
            for row in shard.read(0):
                out.append(row)
                if len(out) >= n:
                    break
        except (BadRow, BadShard) as err:
            if not out:
                raise DataError(f"data: {err}") from None
            break
        if len(out) >= n:
            break
    if not out:
        raise DataError(f"data.path {cfg.path!r}: no rows")
    if cfg.prompt_column not in out[0] and not prompt_optional:
        raise DataError(f"data.prompt_column {cfg.prompt_column!r} not in {shard_list[0].name} (columns: "
                        f"{sorted(out[0])})")
    stream = stream_columns(out[0], cfg.prompt_column)
    for shard in shard_list:
        why = None if shard.columns is None else column_mismatch(shard.columns, stream, cfg.prompt_column)
        if why is not None:
            raise DataError(f"data.path {cfg.path!r}: {shard.name}: {why}; give every shard the same columns")
    return out


def stream_eval_prompts(cfg: DataSource, tokenizer: Any, *, max_samples: int | None, prompt_optional: bool = False,
                        template_kwargs: dict[str, Any] | None = None, images: Any = None) -> list[Prompt]:
    """A streamed eval set's held-out prompts: its first max_samples rows in file order (all if None: the eval set is
    then read whole)."""
    rows = peek(shards(cfg, "eval.data"), max_samples or 10**12, cfg, prompt_optional=prompt_optional)
    stream = stream_columns(rows[0], cfg.prompt_column)
    for i, r in enumerate(rows):  # read whole before anything starts: a row that cannot join a batch is named now
        why = column_mismatch(list(r), stream, cfg.prompt_column)
        if why is not None:
            raise DataError(f"eval.data row {i}: {why}")
    encode = PromptEncoder(tokenizer, cfg.prompt_column, template_kwargs, images)
    return [encode(r, EVAL_DRAW, where=f"eval.data row {i}") for i, r in enumerate(rows)]


def position_from_json(state: dict[str, Any]) -> DataPosition | StreamPosition:
    """A checkpoint's `data`: a stream's position, or an in-memory dataset's."""
    if state.get("kind") == StreamPosition.KIND:
        return StreamPosition.from_json(state)
    return DataPosition.from_json(state)


__all__ = ["StreamSource", "position_from_json", "StreamPosition", "shards", "peek", "stream_eval_prompts", "BadRow",
           "BadShard"]
