"""`rayward samples`: the latest (or a given) step of a run's completions log as a table."""

from __future__ import annotations

import json

from orchestrator.cli.main import main
from orchestrator.cli.samples import TAIL_BLOCK, latest_step_rows, step_rows, visible


def completions(path, steps: int, per_step: int, pad: int = 0) -> None:
    with open(path, "w") as f:
        for step in range(1, steps + 1):
            for i in range(per_step):
                f.write(json.dumps({"step": step, "policy_version": step - 1, "prompt": f"Write the letter {i}:",
                                    "completion": f"s{step}-{i}" + "x" * pad, "total": 0.5, "advantage": -0.25,
                                    "rewards/letter": 0.5, "gated/letter": 0.5}) + "\n")


def test_latest_step_read_from_the_end_across_blocks(tmp_path):
    path = tmp_path / "completions.jsonl"
    completions(path, steps=3, per_step=40, pad=TAIL_BLOCK // 50)  # a step spans several read blocks
    rows = latest_step_rows(path)
    assert [r["completion"].rstrip("x") for r in rows] == [f"s3-{i}" for i in range(40)]
    with open(path, "a") as f:
        f.write('{"step": 4, "prom')  # the run is writing its next step
    assert len(latest_step_rows(path)) == 40 and [r["step"] for r in step_rows(path, 2)] == [2] * 40


def test_samples_command_prints_the_table(tmp_path, capsys):
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    completions(run / "completions.jsonl", steps=2, per_step=4)
    assert main(["samples", "demo", "--dir", str(tmp_path / "runs"), "-n", "3", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "demo: step 2 (policy version 1), 3 of 4 samples" in out
    assert "Write the letter 2:" in out and "s2-2" in out and "s2-3" not in out and "s1-" not in out
    assert "letter" in out and "-0.25" in out
    assert main(["samples", str(run), "--step", "9"]) == 2
    assert "no samples at step 9" in capsys.readouterr().err


def test_cells_escape_control_characters_and_show_a_conversation_s_last_message():
    assert visible("ab\x02c\nd\x1b[31m") == "ab\\x02c\nd\\x1b[31m"
    assert visible([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    assert visible("x" * 10, limit=4) == "xxxx…"


def test_a_conversation_shows_its_tool_calls_and_results():
    from orchestrator.cli.samples import conversation

    messages = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "open_box", "arguments": {"box": 2}}}]},
        {"role": "tool", "name": "open_box", "content": "417"},
        {"role": "assistant", "content": "Done."},
    ]
    assert conversation(messages) == 'open_box({"box": 2})'.join(["→ ", ""]) + "\n← open_box: 417\nDone."
    assert conversation([{"role": "assistant", "content": "hi"}]) == "hi"  # one plain turn: as before tools


def test_a_tools_image_shows_as_the_file_the_log_wrote_it_to(tmp_path):
    """A multimodal tool result as the completions log holds it (orchestrator/telemetry/metrics.py image_files: each
    image written once, named by its file) shows which picture the model was shown."""
    from PIL import Image

    from orchestrator.cli.samples import conversation
    from orchestrator.telemetry.metrics import image_files

    picture = Image.new("RGB", (8, 8), (220, 30, 30))
    messages = [{"role": "tool", "name": "look", "content": [{"type": "image", "image": picture},
                                                             {"type": "text", "text": "The card."}]}]
    logged = image_files(messages, tmp_path)
    (path,) = [p["image"] for p in logged[0]["content"] if p["type"] == "image"]
    assert (tmp_path / path).exists() and path.startswith("images/") and path.endswith(".png")
    assert conversation(logged) == f"← look: <image {path}> The card."
