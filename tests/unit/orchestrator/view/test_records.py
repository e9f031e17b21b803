import json

import pytest

from orchestrator.view.records import TOKENS_FILE, TokenRecorder, pick_samples, token_line


def test_token_line_keys_rounding_and_nan():
    line = token_line(step=3, sample=5, prompt_index=7, ids=[10, 11, 12], tokens=["a", " b", "\n"],
                      logprobs=[-0.12345, float("nan"), -0.00001], learner_logprobs=[-0.1236, None, -2.5],
                      mask=[1, 0, 1], versions=[2, -1, 3])
    assert line.startswith('{"step":3,"sample":5,')  # the reader's index reads these from the line's start
    rec = json.loads(line)
    assert list(rec) == ["step", "sample", "prompt_index", "ids", "tokens", "logprobs", "learner_logprobs", "mask",
                         "versions"]
    assert rec["logprobs"] == [-0.123, None, 0.0]
    assert "-0.0" not in line
    assert rec["learner_logprobs"] == [-0.124, None, -2.5]
    assert rec["mask"] == [1, 0, 1] and rec["versions"] == [2, -1, 3] and rec["tokens"] == ["a", " b", "\n"]


def test_token_line_defaults_null_learner_and_all_in_loss():
    rec = json.loads(token_line(step=1, sample=0, prompt_index=None, ids=[1, 2], tokens=["x", "é"],
                                logprobs=[-1.0, -2.0]))
    assert rec["learner_logprobs"] is None and rec["versions"] is None
    assert rec["mask"] == [1, 1]
    assert rec["tokens"][1] == "é"


def test_token_line_cuts_long_completions_and_says_how_long():
    n = 10
    rec = json.loads(token_line(step=1, sample=0, prompt_index=0, ids=list(range(n)), tokens=["t"] * n,
                                logprobs=[-1.0] * n, learner_logprobs=[-1.0] * n, mask=[1] * n, versions=[0] * n,
                                max_tokens=4))
    assert rec["ids"] == [0, 1, 2, 3] and len(rec["logprobs"]) == len(rec["mask"]) == len(rec["versions"]) == 4
    assert rec["length"] == n


def test_token_line_refuses_lists_of_other_lengths():
    with pytest.raises(ValueError, match="2 logprobs for 3 ids"):
        token_line(step=1, sample=0, prompt_index=0, ids=[1, 2, 3], tokens=["a", "b", "c"], logprobs=[-1.0, -1.0])


@pytest.mark.parametrize(("n", "k", "want"), [(64, 4, [0, 16, 32, 48]), (3, 8, [0, 1, 2]), (10, 0, []), (0, 4, []),
                                              (10, 3, [0, 3, 6])])
def test_pick_samples_spreads_over_the_step(n, k, want):
    assert pick_samples(n, k) == want


def rows_of(ids, logprobs, **per_row):
    """TrainResult.token_records for rows 0..n-1 (as the learner returns the picked ones)."""
    return {i: {"ids": ids[i], "logprobs": logprobs[i], **{k: v[i] for k, v in per_row.items()}}
            for i in range(len(ids))}


def test_recorder_bounds_samples_per_step_and_decodes_only_those(tmp_path):
    decoded = []

    def decode(ids):
        decoded.append(list(ids))
        return [f"<{i}>" for i in ids]

    rec = TokenRecorder(tmp_path, 2, decode=decode)
    assert rec.picks(8) == (0, 4)  # the rows the learner is asked to return
    ids = [[i, i + 1, i + 2] for i in range(8)]
    everything = rows_of(ids, [[-0.5] * 3] * 8)
    written = rec.record(4, {i: everything[i] for i in rec.picks(8)}, prompt_index=[0] * 4 + [1] * 4)
    lines = (tmp_path / TOKENS_FILE).read_bytes()
    assert written == len(lines)
    rows = [json.loads(x) for x in lines.splitlines()]
    assert [(r["step"], r["sample"]) for r in rows] == [(4, 0), (4, 4)]
    assert rows[1]["ids"] == [4, 5, 6] and rows[1]["tokens"] == ["<4>", "<5>", "<6>"]
    assert rows[1]["prompt_index"] == 1
    assert decoded == [[0, 1, 2], [4, 5, 6]]
    assert rows[0]["learner_logprobs"] is None


def test_recorder_off_writes_nothing(tmp_path):
    rec = TokenRecorder(tmp_path, 0, decode=lambda ids: ["x"] * len(ids))
    assert rec.picks(10) == () and rec.record(1, {}) == 0
    assert not (tmp_path / TOKENS_FILE).exists()


def test_recorder_decodes_no_more_than_max_tokens(tmp_path):
    seen = []
    rec = TokenRecorder(tmp_path, 1, decode=lambda ids: seen.append(len(ids)) or ["x"] * len(ids), max_tokens=5)
    rec.record(1, rows_of([list(range(50))], [[-1.0] * 50], mask=[[1] * 50], versions=[[0] * 50]))
    row = json.loads((tmp_path / TOKENS_FILE).read_text())
    assert seen == [5] and len(row["tokens"]) == 5 and row["length"] == 50


def test_record_sizes_per_step(tmp_path):
    """What a step costs on disk (numbers for the report): the demo's four 16-token completions, and one 4k-token
    completion, learner log-probs and versions included."""
    import random

    rng = random.Random(0)
    demo = TokenRecorder(tmp_path / "demo", 4, decode=lambda ids: [" ab"] * len(ids))
    rows = rows_of([[rng.randrange(512) for _ in range(16)] for _ in range(64)],
                   [[-rng.random() * 5 for _ in range(16)] for _ in range(64)],
                   learner_logprobs=[[-rng.random() * 5 for _ in range(16)] for _ in range(64)])
    demo_bytes = demo.record(1, {i: rows[i] for i in demo.picks(64)})
    long = TokenRecorder(tmp_path / "long", 1, decode=lambda ids: [" word"] * len(ids))
    n = 4096
    ids, logps = [[rng.randrange(150_000) for _ in range(n)]], [[-rng.random() * 5 for _ in range(n)]]
    long_bytes = long.record(1, rows_of(ids, logps, learner_logprobs=[[-rng.random() * 5 for _ in range(n)]],
                                        versions=[[7] * n]))
    print(f"token record: demo step (4 x 16 tokens) {demo_bytes} B; one 4096-token completion {long_bytes} B")
    assert demo_bytes < 4 * 16 * 40 and long_bytes < n * 40  # every value a few characters, not a float's repr


def test_an_empty_completion_is_recorded_as_an_empty_line_of_tokens(tmp_path):
    """A trajectory lost before its first turn has no completion ids (the agent runs saw it): recorded empty, the
    run goes on. The tokenizer here decodes [] as [''], as some real ones do."""
    from orchestrator.view.records import TokenRecorder, decode_tokens

    class Tok:
        def batch_decode(self, sequences, **kw):
            return [str(s) for s in sequences] or [""]

    rec = TokenRecorder(tmp_path, 2, decode=lambda ids: decode_tokens(Tok(), ids))
    assert rec.record(1, rows_of([[], [5, 6]], [[], [-0.5, -1.0]])) > 0
    lines = [json.loads(x) for x in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert [(x["ids"], x["tokens"]) for x in lines] == [([], []), ([5, 6], ["[5]", "[6]"])]
