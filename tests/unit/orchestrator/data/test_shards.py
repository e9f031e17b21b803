"""Streamed prompt datasets (orchestrator/data/shards.py): parquet and jsonl shards, a saved `datasets` dataset; every
row once per epoch through the shuffle buffer, seeded; the position through JSON and back, exactly (the buffer's rows
re-read by reference); a pipelined run's replay; bad rows and shards named or skipped by the policy."""

import json

import datasets
import pytest
from transformers import AutoTokenizer

from orchestrator.config import DataConfig
from orchestrator.data.shards import StreamPosition, StreamSource, peek, position_from_json, shards
from orchestrator.data.sources import DataError, DataPosition, load_rows


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def write_shards(tmp_path, n_rows=60, per_shard=13, kind="parquet"):
    """n_rows rows {prompt, i} in shards of per_shard rows (parquet: row groups of 5)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "shards"
    out.mkdir()
    for k, lo in enumerate(range(0, n_rows, per_shard)):
        rows = [{"prompt": f"p{i}", "i": i} for i in range(lo, min(lo + per_shard, n_rows))]
        if kind == "parquet":
            pq.write_table(pa.Table.from_pylist(rows), out / f"part-{k:03d}.parquet", row_group_size=5)
        else:
            (out / f"part-{k:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def source(path, tok, **kw):
    cfg = DataConfig(path=str(path), streaming=True, **{"shuffle_buffer_size": 8, **kw})
    return StreamSource(shards(cfg), tok, cfg, seed=3)


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_every_row_once_per_epoch_seeded_and_shuffled(tmp_path, tok, kind):
    path = write_shards(tmp_path, kind=kind)
    a, b = source(path, tok), source(path, tok)
    first = [p.row["i"] for p in a.next_batch(60)]
    assert sorted(first) == list(range(60)) and first != list(range(60))
    assert [p.row["i"] for p in b.next_batch(60)] == first  # seeded
    second = [p.row["i"] for p in a.next_batch(60)]
    assert sorted(second) == list(range(60)) and second != first and a.epoch == 1
    plain = source(path, tok, shuffle_dataset=False)
    assert [p.row["i"] for p in plain.next_batch(70)] == list(range(60)) + list(range(10))  # file order
    assert [p.draw for p in plain.next_batch(2)] == [70, 71]


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_restored_position_draws_what_the_stream_would_have(tmp_path, tok, kind):
    path = write_shards(tmp_path, kind=kind)
    a = source(path, tok)
    a.next_batch(23)  # mid-shard, mid-epoch, the buffer full
    saved = json.loads(json.dumps(a.state().to_json()))  # as a checkpoint keeps it
    position = position_from_json(saved)
    # refilled at the next draw
    assert isinstance(position, StreamPosition) and position == a.state() and len(position.buffer) == 7
    expected = [(p.row, p.draw) for p in a.next_batch(100)]  # into the next epoch
    b = source(path, tok)
    b.restore(position)
    assert [(p.row, p.draw) for p in b.next_batch(100)] == expected
    assert isinstance(position_from_json(DataPosition(0, 0, [0], 0, (3, (1,), None)).to_json()), DataPosition)


def test_a_checkpoint_of_a_stream_with_bad_rows_restores_under_skip(tmp_path, tok):
    """A truncated line sits before rows the checkpoint's shuffle buffer holds: restoring reads past it (it was
    skipped and counted when first read) instead of failing the checkpoint (bench/chaos.py found every checkpoint of
    such a run refused, the run started afresh)."""
    path = write_shards(tmp_path, kind="jsonl")
    for shard in path.glob("*.jsonl"):
        lines = shard.read_text().splitlines()
        shard.write_text("\n".join([*lines[:2], lines[2][:20], *lines[2:]]) + "\n")  # row 2 of each: truncated
    a = source(path, tok, on_bad_row="skip", shuffle_buffer_size=4)
    a.next_batch(3)
    position = position_from_json(json.loads(json.dumps(a.state().to_json())))
    assert any(i > 2 for _, i in position.buffer) and a.skipped == 1  # buffered rows past the bad line
    expected = [(p.row, p.draw) for p in a.next_batch(20)]
    b = source(path, tok, on_bad_row="skip", shuffle_buffer_size=4)
    b.restore(position)
    assert [(p.row, p.draw) for p in b.next_batch(20)] == expected and b.skipped == a.skipped


def test_a_pipelined_resume_replays_the_untrained_batches(tmp_path, tok):
    a = source(write_shards(tmp_path), tok)
    a.next_batch(4)
    mark = a.state()
    untrained = a.next_batch(4)  # generated ahead, not trained
    a.next_batch(2)  # a refill a trained step used
    position = a.untrained_position(mark, [range(4, 8)])
    b = source(a.shards[0].path.parent, tok)
    b.restore(position)
    again = b.next_batch(6)
    assert [p.row for p in again[:4]] == [p.row for p in untrained] and [p.draw for p in again] == [4, 5, 6, 7, 10, 11]


def test_a_saved_dataset_streams_in_ranges(tmp_path, tok, monkeypatch):
    import orchestrator.data.shards as stream

    monkeypatch.setattr(stream, "ARROW_SHARD_ROWS", 7)
    datasets.Dataset.from_list([{"prompt": f"p{i}", "i": i} for i in range(30)]).save_to_disk(str(tmp_path / "saved"))
    a = source(tmp_path / "saved", tok)
    assert len(a.shards) == 5
    assert sorted(p.row["i"] for p in a.next_batch(30)) == list(range(30))
    a.next_batch(3)
    position = a.state()
    expected = [p.row for p in a.next_batch(20)]
    b = source(tmp_path / "saved", tok)
    b.restore(position)
    assert [p.row for p in b.next_batch(20)] == expected


def test_bad_rows_and_shards_are_named_or_skipped_and_counted(tmp_path, tok):
    path = write_shards(tmp_path, n_rows=20, per_shard=10, kind="jsonl")
    with open(path / "part-000.jsonl", "a") as f:
        f.write('{"i": 99}\n{not json\n')
    (path / "part-009.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(DataError, match=r"part-009.parquet: cannot be read"):
        shards(DataConfig(path=str(path), streaming=True))
    (path / "part-009.parquet").unlink()
    with pytest.raises(DataError, match=r"part-000.jsonl row 10: no prompt column 'prompt'"):
        source(path, tok, shuffle_dataset=False).next_batch(25)
    logged = []
    cfg = DataConfig(path=str(path), streaming=True, on_bad_row="skip", shuffle_dataset=False)
    s = StreamSource(shards(cfg), tok, cfg, log=logged.append)
    assert [p.row["i"] for p in s.next_batch(22)] == [*range(20), 0, 1]
    assert s.skipped == 2 and "part-000.jsonl row 11: not valid JSON" in logged[1]


def test_the_first_rows_are_peeked_and_the_field_named(tmp_path, tok):
    path = write_shards(tmp_path, n_rows=30, per_shard=13)
    cfg = DataConfig(path=str(path), streaming=True)
    assert [r["i"] for r in peek(shards(cfg), 20, cfg)] == list(range(20))
    with pytest.raises(DataError, match="data.prompt_column 'question' not in"):
        peek(shards(cfg), 5, DataConfig(path=str(path), streaming=True, prompt_column="question"))
    with pytest.raises(DataError, match="no .parquet/.jsonl files to stream"):
        shards(DataConfig(path=str(tmp_path / "nothing-*.parquet"), streaming=True))
    assert len(shards(DataConfig(path=str(path / "part-00[01].parquet"), streaming=True))) == 2  # a glob
    assert [r["i"] for r in load_rows(DataConfig(path=str(path)))] == list(range(30))  # the same shards, in memory


def test_a_stream_has_the_prompt_sources_interface():
    import inspect

    from orchestrator.data.sources import PromptSource

    def public(cls):
        return {n: inspect.signature(f) for n, f in inspect.getmembers(cls, inspect.isfunction)
                if not n.startswith("_")}

    ours, theirs = public(StreamSource), public(PromptSource)
    assert set(theirs) <= set(ours)
    for name in theirs:
        assert list(ours[name].parameters) == list(theirs[name].parameters), name
    assert isinstance(StreamSource.epoch_progress, property)


def test_a_streamed_run_is_prepared_with_a_stream_and_its_first_rows_checked(tmp_path):
    from orchestrator.config import parse_config
    from orchestrator.run.build import prepare

    path = write_shards(tmp_path, n_rows=30, per_shard=13)
    tree = {"data": {"path": str(path), "streaming": True}, "rewards": [{"name": "r", "function": "brevity"}]}
    p = prepare(parse_config(tree), "streamed")
    assert isinstance(p.prompts, StreamSource) and [r["i"] for r in p.prompts.rows] == list(range(30))
    from orchestrator.config import ConfigError

    with pytest.raises((DataError, ConfigError), match="data.prompt_column 'question'"):
        prepare(parse_config({**tree, "data": {**tree["data"], "prompt_column": "question"}}), "streamed")
