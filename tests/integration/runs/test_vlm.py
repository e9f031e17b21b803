"""A vision-language model end to end, as a user runs it: `rayward run configs/vlm.yaml` (the tiny Qwen2.5-VL on the
`colors` task, TRL's `image` column), its own embedded Ray, real vLLM (its Qwen2.5-VL with images), reward pool and
learner; a held-out eval on image prompts; the completions log and `rayward samples` naming each sample's image; a
broken image named before anything starts. And `rayward run configs/vlm-tools.yaml`: a TRL environment class whose
tool returns the image (TRL's multimodal tool responses), multi-turn, with its eval, logs and learning run.

The runs (the short ones and the learning runs) are in the scenario tier (CI time: minutes of 2 cores each); CI runs
the bad input, the engine with images (tests/integration/actors/generation/test_vlm_engine.py), with a tool's images
(test_vlm_agent_engine.py) and the learner (unit tier)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.builtin.tasks.cards import CARDS_BLIND_BOUND
from orchestrator.builtin.tasks.colors import COLORS_BLIND_BOUND, colors_dataset
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(900)

PARITY = re.compile(r"logprob parity after sync: max abs diff ([0-9.e+-]+)")
PARITY_TOL = 1e-4  # float32, with a vision tower (tests/integration/actors/generation/test_vlm_engine.py)
EVAL = "eval={data: {path: colors}, every_n_steps: %d, at_start: true, max_samples: %d, num_generations: 2}"


def cli(*args: str, timeout: int = 800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_ADDRESS": ""})


def run(tmp_path: Path, name: str, *overrides: str, config: str = "configs/vlm.yaml"
        ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    r = cli("run", config, f"logging.dir={tmp_path}", "logging.progress=false", *overrides, "--name", name)
    metrics = tmp_path / name / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return r, rows


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def test_a_short_vlm_run_evaluates_and_logs_which_image_each_sample_saw(tmp_path):
    r, rows = run(tmp_path, "vlm", "grpo.max_steps=3", EVAL % (3, 8))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert float(PARITY.search(out).group(1)) <= PARITY_TOL  # checked on an image prompt (train.py _resume)
    assert [x["step"] for x in rows if "eval/reward" in x] == [0, 3]
    assert len([x for x in rows if "eval/reward" not in x]) == 3
    run_dir = tmp_path / "vlm"
    for log in ("completions.jsonl", "eval_completions.jsonl"):
        samples = [json.loads(x) for x in (run_dir / log).read_text().splitlines()]
        parts = [part for s in samples for part in s["prompt"][-1]["content"] if part["type"] == "image"]
        assert len(parts) == len(samples)  # one image each, logged as the file written beside the log
        assert all((run_dir / part["image"]).is_file() for part in parts)
    shown = cli("samples", str(run_dir), "--limit", "4", timeout=120)
    # each prompt's image by its file (the table may fold the cell between "<image" and the path)
    assert shown.returncode == 0 and "<image" in shown.stdout, shown.stdout + shown.stderr
    assert re.search(r"images/[0-9a-f]{16}\.png>", shown.stdout), shown.stdout


def test_a_broken_image_stops_the_run_before_it_starts_naming_the_row(tmp_path):
    rows = colors_dataset(4)
    data = tmp_path / "shapes.jsonl"
    lines = []
    for i, row in enumerate(rows):
        image = tmp_path / f"{i}.png"
        row["image"].save(image)
        if i == 2:
            image.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
        lines.append(json.dumps({"prompt": row["prompt"], "image": str(image), "letter": row["letter"]}))
    data.write_text("\n".join(lines))
    r, metrics = run(tmp_path, "broken", f"data.path={data}")
    assert r.returncode == 2 and not metrics
    assert "data row 2 column 'image': cannot decode the image" in r.stdout + r.stderr
    assert "Ray" not in r.stdout.split("data row 2")[0]  # before the cluster started


def test_the_vlm_config_learns_what_only_the_image_tells(tmp_path):
    """configs/vlm.yaml: the prompt's text is the same on every row, so a policy past COLORS_BLIND_BOUND (0.25:
    always one letter) reads the image; the reward rises over the run and ends well past it."""
    r, all_rows = run(tmp_path, "vlm-learn", EVAL % (20, 32))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    rows = [x for x in all_rows if "eval/reward" not in x]
    evals = [x for x in all_rows if "eval/reward" in x]
    first, last = mean(rows[:5], "rewards/letter/mean"), mean(rows[-5:], "rewards/letter/mean")
    print(f"colors reward: first 5 steps {first:.3f}, last 5 steps {last:.3f} (blind bound {COLORS_BLIND_BOUND}); "
          f"eval {[round(e['eval/reward'], 3) for e in evals]}")
    assert len(rows) == 40 and last >= first + 0.15 and last >= 2 * COLORS_BLIND_BOUND
    assert evals[-1]["eval/reward"] > max(evals[0]["eval/reward"], 2 * COLORS_BLIND_BOUND)
    assert max(row["sampling/sampling_logp_difference/mean"] for row in rows) < 1e-3


TOOLS = "configs/vlm-tools.yaml"
CARDS_EVAL = "eval={data: {path: cards}, every_n_steps: %d, at_start: true, max_samples: %d, num_generations: 2}"


def test_a_short_run_whose_tool_returns_images_evaluates_and_logs_each_image(tmp_path):
    r, rows = run(tmp_path, "cards", "grpo.max_steps=3", CARDS_EVAL % (3, 8), config=TOOLS)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert float(PARITY.search(out).group(1)) <= PARITY_TOL
    train = [x for x in rows if "eval/reward" not in x]
    assert [x["step"] for x in rows if "eval/reward" in x] == [0, 3] and len(train) == 3
    # The whole trajectory (the tool's image inside it) scored by the learner as the engine sampled it.
    assert max(x["sampling/sampling_logp_difference/mean"] for x in train) < 1e-3
    assert (min(x["tools/call_frequency"] for x in train) > 0.9
            and max(x["tools/failure_frequency"] for x in train) < 0.1)
    run_dir = tmp_path / "cards"
    for log in ("completions.jsonl", "eval_completions.jsonl"):
        samples = [json.loads(x) for x in (run_dir / log).read_text().splitlines()]
        results = [m for s in samples for m in s["completion"] if m["role"] == "tool"]
        images = [p["image"] for m in results if isinstance(m["content"], list)  # (a malformed call's error: text)
                  for p in m["content"] if p["type"] == "image"]
        assert len(images) >= len(samples) - 1 and all((run_dir / i).is_file() for i in images)
    shown = cli("samples", str(run_dir), "--limit", "4", timeout=120)
    assert shown.returncode == 0 and "← look: <image" in shown.stdout, shown.stdout + shown.stderr


def test_the_vlm_tools_config_learns_what_only_the_tools_image_tells(tmp_path):
    """configs/vlm-tools.yaml: the picture is only in the `look` tool's result, so a policy past CARDS_BLIND_BOUND
    (0.25: always one letter) reads the image a tool returned; the reward rises over the run and ends well past it."""
    r, rows = run(tmp_path, "cards-learn", config=TOOLS)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    first, last = mean(rows[:5], "rewards/card/mean"), mean(rows[-5:], "rewards/card/mean")
    print(f"cards reward: first 5 steps {first:.3f}, last 5 steps {last:.3f} (blind bound {CARDS_BLIND_BOUND})")
    assert len(rows) == 60 and last >= first + 0.15 and last >= 2 * CARDS_BLIND_BOUND
    assert max(row["sampling/sampling_logp_difference/mean"] for row in rows) < 1e-3
