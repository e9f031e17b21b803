import json
import os

from orchestrator.view.store import CompletionsIndex, JsonlTail, MetricsStore, TokensIndex, compact

from .synthetic import SyntheticRun


def test_tail_reads_only_what_was_appended_and_waits_for_a_torn_line(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == (False, [])  # no file yet
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c"')
    reset, lines = tail.poll()
    assert not reset and lines == [(0, b'{"a": 1}'), (9, b'{"b": 2}')]
    assert tail.poll() == (False, [])
    with open(path, "ab") as f:
        f.write(b': 3}\n')
    assert tail.poll() == (False, [(18, b'{"c": 3}')])


def test_tail_reads_a_replaced_or_shrunk_file_again(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    tail = JsonlTail(path)
    tail.poll()
    path.write_bytes(b'{"z": 9}\n')  # shorter: a new run in the same directory
    assert tail.poll() == (True, [(0, b'{"z": 9}')])
    os.replace(tmp_path / "m.jsonl", tmp_path / "old")
    (tmp_path / "new").write_bytes(b'{"y": 8}\n{"x": 7}\n')
    os.replace(tmp_path / "new", path)
    assert tail.poll() == (True, [(0, b'{"y": 8}'), (9, b'{"x": 7}')])


def test_tail_lines_across_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("orchestrator.view.store.READ_BLOCK", 7)
    path = tmp_path / "m.jsonl"
    lines = [json.dumps({"step": i, "text": "x" * (i * 3)}).encode() for i in range(6)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    _, got = JsonlTail(path).poll()
    assert [line for _, line in got] == lines
    assert [off for off, _ in got] == [sum(len(x) + 1 for x in lines[:i]) for i in range(6)]


def test_compact_numbers():
    assert compact(0.123456789) == 0.123457 and compact(12345678.9) == 12345700.0
    assert compact(3) == 3 and compact(float("nan")) is None and compact(float("inf")) is None
    assert compact("generator") is None and compact(True) is None and compact(None) is None


def test_metrics_payload_since_and_epoch(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward": 0.5, "loss": NaN, "roles/bottleneck": "learner"}\n'
                    '{"step": 1, "eval/reward": 0.25}\n{"step": 2, "reward": 0.75}\n')
    store = MetricsStore(path)
    store.refresh()
    p = store.payload(since=0, epoch=None)
    assert p["steps"] == [1, 1, 2] and p["total"] == 3 and p["epoch"] == 0
    assert p["cols"] == {"reward": [0.5, None, 0.75], "eval/reward": [None, 0.25, None]}  # loss NaN: no column
    with open(path, "a") as f:
        f.write('{"step": 3, "reward": 1.0, "kl": 0.01}\n')
    store.refresh()
    p = store.payload(since=3, epoch=0)
    assert p["since"] == 3 and p["steps"] == [3] and p["cols"] == {"reward": [1.0], "kl": [0.01]}
    path.write_text('{"step": 1, "reward": 0.1}\n')  # a new run: everything again, a new epoch
    store.refresh()
    p = store.payload(since=4, epoch=0)
    assert p["epoch"] == 1 and p["since"] == 0 and p["steps"] == [1] and p["cols"] == {"reward": [0.1]}


def test_completions_index_by_step_and_a_rewound_step(tmp_path):
    path = tmp_path / "completions.jsonl"
    rows = [{"step": s, "completion": f"{s}-{i}"} for s in (1, 2, 3) for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = CompletionsIndex(path)
    index.refresh()
    assert index.steps() == [1, 2, 3]
    assert [r["completion"] for r in index.read(2)] == ["2-0", "2-1"]
    with open(path, "a") as f:  # a recovery went back to step 1: steps 2 and 3 are trained and logged again
        f.write(json.dumps({"step": 2, "completion": "again"}) + "\n")
        f.write('{"completion": "no step first", "step": 4}\n')
    index.refresh()
    assert [r["completion"] for r in index.read(2)] == ["again"]
    assert [r["completion"] for r in index.read(4)] == ["no step first"]
    assert index.read(99) == []


def test_tokens_index_from_a_synthetic_run(tmp_path):
    SyntheticRun(tmp_path, groups=4, group_size=4, token_samples=2).write(range(1, 4))
    index = TokensIndex(tmp_path / "tokens.jsonl")
    index.refresh()
    assert index.samples(2) == [0, 8]
    rec = index.read(2, 8)
    assert rec["step"] == 2 and rec["sample"] == 8 and len(rec["ids"]) == len(rec["tokens"]) == 12
    assert index.read(2, 1) is None
