"""Prompt datasets: local files, saved or hub `datasets`, or the built-in toy task; chat templates; the run's
prompt stream (`PromptSource`: `Prompt` records, its position a `DataPosition`); and generated completions joined
back to their prompts (`to_rollouts`)."""

from __future__ import annotations

import glob
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from actors.types import EMPTY_PROMPT, GroupOut, Rollouts
from actors.vision import ImageError, Images, to_image
from orchestrator.builtin.tasks.boxes import boxes_dataset
from orchestrator.builtin.tasks.cards import cards_dataset
from orchestrator.builtin.tasks.code import code_dataset
from orchestrator.builtin.tasks.colors import colors_dataset
from orchestrator.builtin.tasks.letters import mixed_dataset, toy_dataset
from orchestrator.config import ConfigError, DataConfig, DataSource, RunConfig

# data.path names of the built-in tasks (boxes: the tool task, with environment_factory BoxEnv; colors: the
# vision task, with an `image` column; cards: the vision tool task, with environment_factory CardEnv, whose tool
# returns the image)
BUILTIN_DATASETS = {"toy": toy_dataset, "toy-mixed": mixed_dataset, "code": code_dataset, "boxes": boxes_dataset,
                    "colors": colors_dataset, "cards": cards_dataset}
# TRL's image columns (GRPOTrainer): `images`, a list per row, or `image`, one per row (None: none).
IMAGE_COLUMNS = ("images", "image")
# Rows whose images are decoded when the run starts (a broken one stops it there, named); later rows' images are
# decoded as they are drawn, and a broken one is named then.
CHECKED_IMAGE_ROWS = 1000
# Bad rows named in the driver's log (the rest only counted) under data.on_bad_row: skip.
NAMED_BAD_ROWS = 5
# data.path null (but for an environment that owns its data: `training_rows`)
DEFAULT_DATASET = "toy"
# The draw index of a held-out prompt: it is no part of the run's prompt stream (Rollouts.prompt_index says so).
EVAL_DRAW = -1


@dataclass(frozen=True)
class Prompt:
    """One prompt as the driver serves it. `row` is the dataset's row itself, untouched: what an environment's
    reset() and the reward functions' columns receive. The driver's own facts about it travel beside the row."""

    row: dict[str, Any]  # the dataset row, every column as the dataset has it
    prompt_ids: list[int]  # the prompt column's token ids (through the chat template for chat prompts)
    draw: int = EVAL_DRAW  # its place in the run's prompt stream (0, 1, ... across epochs): it names the prompt's
    # samples (Rollouts.prompt_index) and seeds them (request_seed); EVAL_DRAW for a held-out prompt
    images: tuple[Any, ...] = ()  # vision-language models: its images (RGB PIL), in the order of their
    # placeholders in prompt_ids (each placeholder repeated its image's vision tokens times: actors/vision.py)
    messages: Any = None  # with images: the prompt as TRL passes it to reward functions (`prompts`), its messages
    # with image parts holding the images (prepare_multimodal_messages); None: the row's prompt column as it is


@dataclass(frozen=True)
class DataPosition:
    """Where a prompt stream is: the position of its next draw, which every checkpoint keeps (`to_json`,
    `from_json`: the checkpoint's `data`)."""

    epoch: int
    cursor: int  # the next draw's index into `order`
    order: list[int]  # this epoch's row order (shared with the stream, never changed in place)
    served: int  # draws made so far
    rng: tuple[Any, ...]  # the state of the random generator that shuffles the next epoch (random.Random)
    skip: tuple[int, ...] = ()  # draws at or after `served` that are not served again (PromptSource's docstring)
    # A curriculum sampler (data.sampler, orchestrator/data/curriculum.py): its statistics and random state, and the
    # draws to serve again first, (draw, row) each (the batches generated ahead, not trained); None / () otherwise.
    curriculum: dict[str, Any] | None = None
    replay: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "order": self.order, "served": self.served,
                "rng": self.rng, "skip": list(self.skip), "curriculum": self.curriculum,
                "replay": [list(r) for r in self.replay]}

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> DataPosition:
        version, internal, gauss = state["rng"]  # JSON made the state's tuples lists
        return cls(epoch=state["epoch"], cursor=state["cursor"], order=list(state["order"]), served=state["served"],
                   rng=(version, tuple(internal), gauss), skip=tuple(state["skip"]),
                   curriculum=state.get("curriculum"), replay=tuple((d, r) for d, r in state.get("replay", ())))


class DataError(ValueError):
    """The dataset cannot serve prompts; the message names the path or column."""


def load_rows(cfg: DataSource, seed: int = 0, field: str = "data", *, prompt_optional: bool = False
              ) -> list[dict[str, Any]]:
    """All rows as dicts. Prompt datasets for RL are small (thousands of rows), so they live in memory.
    `field`: the config path of `cfg` (`data`, `eval.data`), named in errors. prompt_optional: rows may lack the
    prompt column (an agentic run's environments supply the prompt: EMPTY_PROMPT stands in, as in TRL)."""
    cfg = cfg if cfg.path is not None else cfg.model_copy(update={"path": DEFAULT_DATASET})
    if cfg.path in BUILTIN_DATASETS:
        rows = BUILTIN_DATASETS[cfg.path](seed=seed)
    else:
        rows = _load_datasets(cfg, field)
    if not rows:
        raise DataError(f"{field}.path {cfg.path!r}: no rows")
    if cfg.prompt_column not in rows[0] and not prompt_optional:
        raise DataError(
            f"{field}.prompt_column {cfg.prompt_column!r} not in dataset {cfg.path!r} (columns: {sorted(rows[0])})"
        )
    return rows


def agentic(cfg: RunConfig) -> bool:
    """Whether the run's samples are multi-turn rollouts with tools (its prompts are chat messages, or none)."""
    return bool(cfg.tools) or cfg.environment_factory is not None or cfg.agent_function is not None


def training_rows(cfg: RunConfig) -> list[dict[str, Any]]:
    """The training data's rows. A run whose environment_factory is one environment and whose data.path is null
    trains, as TRL's GRPOTrainer without a train_dataset does, on placeholder rows: one generation batch's worth
    of prompts (generation_batch_size / num_generations), each an empty user message, cycled over the steps;
    the environment's reset() supplies each prompt. A mapping needs a dataset whose `environment` column routes
    each row (TRL's rule)."""
    if cfg.data.path is None and isinstance(cfg.environment_factory, str):
        g = cfg.generation
        return [{cfg.data.prompt_column: list(EMPTY_PROMPT)}
                for _ in range(g.generation_batch_size // g.num_generations)]
    if cfg.data.path is None and isinstance(cfg.environment_factory, dict):
        raise ConfigError("data.path: environment_factory is a mapping, so the rows' `environment` column routes "
                          "each to its environment: give a dataset with that column (it may hold nothing else), or "
                          "one environment that owns its data (TRL requires a train_dataset here too)")
    return load_rows(cfg.data, seed=cfg.seed, prompt_optional=agentic(cfg))


def _load_datasets(cfg: DataSource, field: str) -> list[dict[str, Any]]:
    import datasets

    p = Path(cfg.path)
    try:
        if p.is_file():
            kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(p.suffix)
            if kind is None:
                raise DataError(f"{field}.path {cfg.path!r}: unsupported file type {p.suffix!r} "
                                "(jsonl, json, parquet, csv)")
            ds = datasets.load_dataset(kind, data_files=str(p), split="train")
        elif p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[cfg.split]
        elif p.is_dir() or any(c in cfg.path for c in "*?["):  # shards: a directory's or a glob's files
            files = sorted(p.rglob("*") if p.is_dir() else (Path(f) for f in glob.glob(cfg.path, recursive=True)))
            by_kind = {k: [str(f) for f in files if f.suffix == s] for s, k in ((".parquet", "parquet"),
                                                                                (".jsonl", "json"))}
            kinds = [k for k, fs in by_kind.items() if fs]
            if len(kinds) != 1:
                raise DataError(f"{field}.path {cfg.path!r}: shards are all .parquet or all .jsonl files "
                                f"({'none found' if not kinds else 'both found'})")
            ds = datasets.load_dataset(kinds[0], data_files=by_kind[kinds[0]], split="train")
        else:
            ds = datasets.load_dataset(cfg.path, split=cfg.split)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - surface any loader failure with the field named
        raise DataError(f"{field}.path {cfg.path!r}: cannot load ({type(err).__name__}: {err})") from err
    return [dict(r) for r in ds]


def request_seed(run_seed: int, step: int, draw: int) -> int:
    """The sampling seed of a prompt's request: a stable hash of the run's seed, the policy step that generates it
    and the prompt's draw index, so a resumed run draws the same completions (vLLM seeds sample j of the request
    with this + j; no engine's global random state is involved). 62 bits: + j stays within torch's seed range."""
    digest = hashlib.blake2b(f"{run_seed}:{step}:{draw}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def is_conversational(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def to_rollouts(
    prompts: list[Prompt], outs: list[GroupOut], policy_version: int, *, prompt_column: str, group_size: int,
) -> Rollouts:
    """The driver's record of generator answers (per prompt, its group's GroupOut): per sample its prompt, the
    row's other columns (a prompt's draw index as its prompt_index: EVAL_DRAW for eval prompts) and SampleInfo, per
    group the reference to its token data. policy_version: the version the call was made under (its min_version);
    where the samples record per-token versions, the batch's is their oldest model token's (the staleness rule: a
    weight load may land while a batch samples).

    A prompt is the dataset's (with images, its messages with the image parts); an agentic sample's prompt as the
    engine rendered it (tool schemas, reset()'s text) is in its payload, where the reward workers read it."""
    cols = [c for c in prompts[0].row if c != prompt_column]
    out = Rollouts([], [], [], {c: [] for c in cols}, policy_version, group_size, prompt_index=[])
    for prompt, o in zip(prompts, outs, strict=True):
        row = prompt.row
        shown = row.get(prompt_column) if prompt.messages is None else prompt.messages
        out.payloads.append(o.payload)
        for info in o.infos:
            out.prompts.append(shown)
            out.infos.append(info)
            out.prompt_index.append(prompt.draw)
            for c in cols:
                out.columns[c].append(row[c])
    if len({i.agentic for i in out.infos}) > 1:
        raise ValueError("to_rollouts: the batch mixes agentic samples with one-turn ones (one rollout kind a run)")
    out.policy_version = min((i.version for i in out.infos if i.version is not None), default=policy_version)
    return out


def encode_prompt(tokenizer: Any, prompt: Any, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of a prompt: chat messages through the chat template (with the generation prompt and
    generation.chat_template_kwargs), text as is."""
    if is_conversational(prompt):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                            **(template_kwargs or {}))
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def row_images(row: dict[str, Any], where: str) -> list[Any]:
    """A row's images from TRL's columns (`images`: a list; `image`: one, or None), decoded (actors/vision.py
    to_image); [] for a row without them. where: the row, named in errors."""
    if "images" in row and row["images"] is not None:
        values = row["images"] if isinstance(row["images"], (list, tuple)) else [row["images"]]
        return [to_image(v, f"{where} column 'images'[{i}]") for i, v in enumerate(values)]
    if row.get("image") is not None:
        return [to_image(row["image"], f"{where} column 'image'")]
    return []


def multimodal_prompt(prompt: Any, images: list[Any], where: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """The prompt's messages with image parts (TRL's prepare_multimodal_messages: the column's images go before the
    first user message's text, or fill its `{"type": "image"}` parts), and every image they hold, in order."""
    from trl.data_utils import prepare_multimodal_messages

    if not is_conversational(prompt):
        raise ImageError(f"{where}: a row with images needs a conversational prompt (a list of messages), as TRL's "
                         "GRPOTrainer does; got plain text")
    try:
        messages = prepare_multimodal_messages(list(prompt), images=images)
    except ValueError as err:
        raise ImageError(f"{where}: {err}") from err
    found = []
    for m, msg in enumerate(messages):  # the images decoded, in place of what the row held (paths, bytes)
        if not isinstance(msg.get("content"), list):
            continue
        parts = []
        for part in msg["content"]:
            if isinstance(part, dict) and part.get("type") == "image":
                part = {**part, "image": to_image(part.get("image"), f"{where} message {m} image part")}
                found.append(part["image"])
            parts.append(part)
        messages[m] = {**msg, "content": parts}
    return messages, found


class PromptEncoder:
    """Turns a dataset row into its Prompt: the prompt column through the chat template (chat prompts, with
    generation.chat_template_kwargs and the generation prompt) or as text; with a vision-language model
    (`images`, the model's processor) the row's images too, their placeholders expanded to their vision tokens."""

    def __init__(self, tokenizer: Any, column: str, template_kwargs: dict[str, Any] | None = None,
                 images: Images | None = None):
        self.tokenizer, self.column, self.template_kwargs, self.images = tokenizer, column, template_kwargs, images

    def __call__(self, row: dict[str, Any], draw: int = EVAL_DRAW, where: str = "row") -> Prompt:
        prompt = row_prompt(row, self.column)
        pictures = row_images(row, where) if self.images is not None or _has_images(row) else []
        if not pictures and not _image_parts(prompt):
            return Prompt(row, encode_prompt(self.tokenizer, prompt, self.template_kwargs), draw)
        if self.images is None:
            raise ImageError(f"{where}: the row has images but the model has no image processor (not a "
                             "vision-language model)")
        messages, pictures = multimodal_prompt(prompt, pictures, where)
        try:
            ids = encode_prompt(self.tokenizer, messages, self.template_kwargs)
        except Exception as err:  # noqa: BLE001 - a template error, named with the row and what it means
            raise ImageError(f"{where}: the chat template cannot render a message with image parts "
                             f"({type(err).__name__}: {err}); a vision-language model's template (its processor's "
                             "chat_template) renders them as image placeholders") from err
        try:
            ids = self.images.expand(ids, pictures)
        except ImageError as err:
            raise ImageError(f"{where}: {err}") from err
        return Prompt(row, ids, draw, tuple(pictures), messages)

    def check(self, rows: list[dict[str, Any]], field: str) -> None:
        """Decode the first CHECKED_IMAGE_ROWS rows' images and render them, so a broken image or a chat template
        that drops image parts stops the run before anything starts (the error names the row)."""
        if self.images is None and not any(_has_images(r) for r in rows[:CHECKED_IMAGE_ROWS]):
            return
        for i, row in enumerate(rows[:CHECKED_IMAGE_ROWS]):
            self(row, where=f"{field} row {i}")


def _has_images(row: dict[str, Any]) -> bool:
    return any(row.get(c) is not None for c in IMAGE_COLUMNS)


def _image_parts(prompt: Any) -> bool:
    return is_conversational(prompt) and any(
        isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image"
                                                   for p in m["content"]) for m in prompt)


def row_prompt(row: dict[str, Any], column: str) -> Any:
    """A row's prompt; EMPTY_PROMPT for a row without the column (allowed only where an environment supplies it:
    load_rows' prompt_optional)."""
    return row.get(column, list(EMPTY_PROMPT))


def eval_prompts(cfg: DataSource, tokenizer: Any, *, max_samples: int | None, seed: int = 0,
                 prompt_optional: bool = False, template_kwargs: dict[str, Any] | None = None,
                 images: Images | None = None) -> list[Prompt]:
    """The held-out prompts: the first `max_samples` rows (file order, all if None), tokenized (images: the vision
    model's processor). The same prompts every eval, so the evals of a run are comparable."""
    rows = load_rows(cfg, seed=seed, field="eval.data", prompt_optional=prompt_optional)[:max_samples]
    encode = PromptEncoder(tokenizer, cfg.prompt_column, template_kwargs, images)
    return [encode(r, where=f"eval.data row {i}") for i, r in enumerate(rows)]


def replay_skip(mark: int, skip: tuple[int, ...], served: int, untrained: list[range]) -> tuple[int, ...]:
    """The draws a stream restored at `mark` (its draws made, `skip` its skips then) must not serve again: every
    draw made since (up to `served`) that is not one of the `untrained` batches' (a refill some trained step used)."""
    replay = {d for r in untrained for d in r}
    return tuple(sorted(set(skip) | {d for d in range(mark, served) if d not in replay}))


class EpochOrder:
    """A pass over `n` items (a dataset's rows, a stream's shards) epoch after epoch, shuffled per epoch if asked:
    this epoch's order, the cursor into it, the epoch, and the random generator that shuffles the next one (all of
    it in every checkpoint, so a resumed run draws what the stopped one would have)."""

    def __init__(self, n: int, shuffle: bool, seed: int) -> None:
        self.n, self.shuffle = n, shuffle
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.cursor = 0
        self.epoch = 0
        self.new_epoch(first=True)

    def new_epoch(self, first: bool = False) -> None:
        self.order = list(range(self.n))
        if self.shuffle:
            self.rng.shuffle(self.order)
        self.cursor = 0
        if not first:
            self.epoch += 1

    @property
    def done(self) -> bool:
        """This epoch's order is used up."""
        return self.cursor >= len(self.order)

    def current(self) -> int:
        return self.order[self.cursor]

    def restore(self, epoch: int, order: list[int], cursor: int, rng: tuple[Any, ...]) -> None:
        self.epoch, self.order, self.cursor = epoch, list(order), cursor
        self.rng.setstate(rng)


class PromptStream(Protocol):
    """What the loop draws prompts from, in memory (`PromptSource`) or streamed from shards
    (orchestrator/data/shards.py `StreamSource`): batches of Prompts, each a new draw; the scored groups shown back
    (a curriculum's statistics); a position in every checkpoint, and the position that replays untrained batches."""

    encode: PromptEncoder  # rows -> Prompts (the tokenizer, the chat template, images)
    rows: list[dict[str, Any]]  # the rows the start-up checks read (a stream: its first ones)
    served: int  # draws so far
    curriculum: Any  # a data.sampler's curriculum, or None

    @property
    def epoch_progress(self) -> float: ...

    def next_batch(self, k: int) -> list[Prompt]: ...

    def observe(self, draws: list[int], totals: list[float], group_size: int, step: int) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def state(self) -> Any: ...

    def untrained_position(self, mark: Any, untrained: list[range]) -> Any: ...

    def restore(self, position: Any) -> None: ...


class PromptSource:
    """Serves prompts `k` at a time, epoch after epoch, shuffled per epoch if asked; tokenizes them as it serves
    them. Every draw has an index (`served` counts them): its Prompt's `draw`.

    Its state (`state()`, a DataPosition, in every checkpoint) is the position of the next draw. `skip`: draws at
    or after it that are not served again (a resumed pipelined run replays the batches it had generated but not
    trained, and skips the refill draws that later steps already trained on); `untrained_position` makes such a
    position."""

    def __init__(self, rows: list[dict[str, Any]], tokenizer: Any, cfg: DataConfig, seed: int = 0,
                 template_kwargs: dict[str, Any] | None = None, images: Images | None = None,
                 curriculum: Any = None):
        """template_kwargs: generation.chat_template_kwargs, for chat prompts; images: a vision-language model's
        processor (rows with images: actors/vision.py); curriculum: a data.sampler that is not uniform
        (orchestrator/data/curriculum.py Curriculum): it picks each batch's rows, from the scores `observe` feeds it."""
        self.rows, self.cfg, self.tokenizer, self.template_kwargs = rows, cfg, tokenizer, template_kwargs
        self.curriculum = curriculum
        self._row_of: dict[int, int] = {}  # curriculum: draw -> its row, until the draw is observed
        self._replay: list[tuple[int, int]] = []  # curriculum: (draw, row) to serve first (a resumed run's)
        self.encode = PromptEncoder(tokenizer, cfg.prompt_column, template_kwargs, images)
        self.order = EpochOrder(len(rows), cfg.shuffle_dataset, seed)
        self._skip: set[int] = set()
        self.served = 0
        self.skipped = 0  # rows whose images did not decode when drawn, left out (data.on_bad_row: skip)
        self.log: Callable[[str], None] = print

    @property
    def epoch(self) -> int:
        return self.order.epoch

    @property
    def epoch_progress(self) -> float:
        """Fractional epochs served (TRL's trainer_state.epoch)."""
        return self.served / len(self.rows)

    def next_batch(self, k: int) -> list[Prompt]:
        """The next k prompts: each row, its token ids and its draw index."""
        if self.curriculum is not None:
            return self._curriculum_batch(k)
        out = []
        while len(out) < k:
            if self.order.done:
                self.order.new_epoch()
            i, draw = self.order.current(), self.served
            self.order.cursor += 1
            self.served += 1
            if draw in self._skip:
                self._skip.discard(draw)
                continue
            prompt = self._encoded(i, draw)
            if prompt is not None:
                out.append(prompt)
        return out

    def _encoded(self, i: int, draw: int) -> Prompt | None:
        """Row i as draw `draw`; None when its images do not decode and data.on_bad_row is skip (counted; the
        first CHECKED_IMAGE_ROWS rows were decoded before the run, later ones are known only when drawn)."""
        try:
            return self.encode(self.rows[i], draw, where=f"data row {i}")
        except ImageError as err:
            if self.cfg.on_bad_row == "raise":
                raise DataError(f"data: {err} (data.on_bad_row: skip leaves bad rows out, counted)") from err
            self.skipped += 1
            if self.skipped <= NAMED_BAD_ROWS:
                self.log(f"rayward: data: skipped {err}" + (" (further bad rows are only counted: data/skipped_rows)"
                                                             if self.skipped == NAMED_BAD_ROWS else ""))
            return None

    def _curriculum_batch(self, k: int) -> list[Prompt]:
        """k rows the curriculum chooses (after any to replay), each a new draw; a row left out (on_bad_row: skip)
        is replaced by another choice."""
        out: list[Prompt] = []
        for _ in range(k * len(self.rows) + 1):  # bounded: a dataset of only bad rows ends in the DataError below
            if len(out) == k:
                return out
            picked = self._replay[:k - len(out)]
            del self._replay[:len(picked)]
            for row in self.curriculum.choose(k - len(out) - len(picked)):
                picked.append((self.served, row))
                self.served += 1
            self._row_of.update(picked)
            for draw, row in picked:
                prompt = self._encoded(row, draw)
                if prompt is None:
                    del self._row_of[draw]  # never generated: nothing to observe or replay
                else:
                    out.append(prompt)
        raise DataError(f"data.path {self.cfg.path!r}: the curriculum chose only rows left out as bad")

    def observe(self, draws: list[int], totals: list[float], group_size: int, step: int) -> None:
        """Scored groups (draw indices and weighted totals, group_size contiguous per draw) for the curriculum's
        statistics; nothing without one."""
        if self.curriculum is None:
            return
        for g in range(0, len(draws), group_size):
            row = self._row_of.pop(draws[g], None)
            if row is not None:
                self.curriculum.observe(row, totals[g: g + group_size], step)

    def metrics(self) -> dict[str, float]:
        skipped = {"data/skipped_rows": self.skipped} if self.skipped else {}
        return {**(self.curriculum.metrics() if self.curriculum is not None else {}), **skipped}

    def state(self) -> DataPosition:
        """The position of the next draw."""
        o = self.order
        return DataPosition(o.epoch, o.cursor, o.order, self.served, o.rng.getstate(), tuple(sorted(self._skip)),
                            None if self.curriculum is None else self.curriculum.state(), tuple(self._replay))

    def untrained_position(self, mark: DataPosition, untrained: list[range]) -> DataPosition:
        """Where to resume when the draws in `untrained` (batches generated ahead, not trained yet) must be served
        again: `mark`, the position taken before the first of them, with every draw made since that is not
        theirs (a refill some trained step used) skipped."""
        if self.curriculum is not None:  # the untrained draws' rows, served again first; the sampler as it is now
            again = [(d, self._row_of[d]) for r in untrained for d in r if d in self._row_of]
            return replace(self.state(), replay=tuple(again) + tuple(self._replay))
        return replace(mark, skip=replay_skip(mark.served, mark.skip, self.served, untrained))

    def restore(self, position: DataPosition) -> None:
        self.order.restore(position.epoch, position.order, position.cursor, position.rng)
        self.served = position.served
        self._skip = set(position.skip)
        if self.curriculum is not None:
            if position.curriculum is None:
                raise DataError("data.sampler: the checkpoint has no curriculum state (its run sampled uniformly)")
            self.curriculum.restore(position.curriculum)
            self._replay = list(position.replay)
            self._row_of = dict(position.replay)
