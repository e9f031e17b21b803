"""Stop by signal and exact resume on the tiny model (sync loop, the demo's defaults: the logprob parity check
on), on the real CLI, with an embedded Ray cluster: a run stopped by SIGTERM checkpoints at the step boundary,
however the signal arrives, and a run resumed from that checkpoint, in a fresh driver, a fresh Ray and a fresh
run directory, trains the next steps exactly as the uninterrupted run did: the same prompts, the same completions
(per-request sampling seeds from the run seed, step and draw: no engine's global RNG), the same rewards, losses
equal within float tolerance. Everything that decides it comes from the checkpoint: the learner's weights,
optimizer, scheduler and RNGs, the prompt stream, the reward pool's trainer_state.

Three legs, one engine start-up each, each stopped by SIGTERM sent another way (three times: the demo's dataset in
memory, the same rows streamed from parquet shards through a shuffle buffer (data.streaming), and drawn by the
difficulty sampler (data.sampler)):
    straight   past step N, SIGTERM to its whole process group, as `timeout` sends it (the Ray processes of the
               embedded cluster are in that group: they must not die before the driver checkpoints)
    first      past step K, SIGTERM to every process of the run one by one, as SLURM signals a job's processes
    resumed    a new run directory seeded with `first`'s checkpoint alone, `--resume`d (what a stopped run's next
               start does), past step N SIGTERM to the driver alone, as `ray job stop` sends it
Each stop leaves a checkpoint at its last step and says so in one line (exit 143, no traceback)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

K, N = 2, 5
COMPARED = ("loss", "reward", "grad_norm", "entropy", "learning_rate", "reward_global_step", "policy_version")
START_S = 240  # the run's start-up and its first N steps, on a loaded 2-core machine


@dataclass
class Leg:
    run_dir: Path
    rc: int
    out: str


def _processes_of(pid: int) -> list[int]:
    """`pid` and every process below it (the embedded cluster's GCS, raylet, actors' workers and their children)."""
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [pid, *(q for c in children.split() for q in _processes_of(int(c)))]


def _every_process(proc: subprocess.Popen) -> None:
    for pid in _processes_of(proc.pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:  # it ended meanwhile
            pass


STOPS = {
    "group": lambda proc: os.killpg(proc.pid, signal.SIGTERM),  # its own session: the test is not in the group
    "every process": _every_process,
    "driver": lambda proc: proc.send_signal(signal.SIGTERM),
}


def _run_then_sigterm(logdir: Path, name: str, past: int, stop: str, *extra: str) -> Leg:
    """The demo (its 40 steps, so every leg shares the learning-rate schedule; its defaults otherwise),
    SIGTERMed (`stop`: how) once it has logged step `past`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", f"logging.dir={logdir}", "loop.mode=sync",
         "--name", name, *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    metrics = logdir / name / "metrics.jsonl"
    deadline = time.monotonic() + START_S
    while not (metrics.exists() and any(json.loads(x)["step"] >= past for x in metrics.read_text().splitlines())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{name}: no step {past} (rc {proc.poll()}):\n{proc.communicate()[0][-4000:]}")
        time.sleep(0.2)
    STOPS[stop](proc)
    out, _ = proc.communicate(timeout=120)
    return Leg(logdir / name, proc.returncode, out)


def _by_step(path: Path, key: str = "step") -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row[key], []).append(row)
    return out


def _last_step(leg: Leg) -> int:
    return json.loads((leg.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]


def _toy_shards(out: Path) -> Path:
    """The demo's letter task as 4 parquet shards of small row groups, for the streamed legs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.builtin.tasks.letters import toy_dataset

    out.mkdir()
    rows = toy_dataset(seed=0)
    for k in range(4):
        pq.write_table(pa.Table.from_pylist(rows[k::4]), out / f"part-{k}.parquet", row_group_size=16)
    return out


# in-memory: the demo's dataset; streamed: the same rows as parquet shards read as a stream through a shuffle buffer
# smaller than the dataset (its rows, the shard being read and the random state are what the checkpoint restores);
# difficulty: the demo's dataset drawn by the difficulty sampler (its per-prompt statistics and random state)
@pytest.fixture(scope="module", params=["in-memory", "streamed", "difficulty"])
def legs(request, tmp_path_factory) -> tuple[Leg, Leg, Leg]:
    logdir = tmp_path_factory.mktemp("resume")
    data = {
        "in-memory": [],
        "streamed": [f"data.path={_toy_shards(logdir / 'shards')}", "data.streaming=true",
                     "data.shuffle_buffer_size=24"],
        "difficulty": ["data.sampler=difficulty", "data.difficulty.pass_threshold=0.05"],
    }[request.param]
    straight = _run_then_sigterm(logdir, "straight", N, "group", *data)
    first = _run_then_sigterm(logdir, "first", K, "every process", *data)
    stopped_at = first.run_dir / f"checkpoint-{_last_step(first)}"
    assert stopped_at.is_dir(), first.out[-3000:]
    (logdir / "resumed").mkdir()
    shutil.copytree(stopped_at, logdir / "resumed" / stopped_at.name)
    return straight, first, _run_then_sigterm(logdir, "resumed", N, "driver", "--resume", *data)


def test_sigterm_checkpoints_and_says_how_to_continue_however_it_arrives(legs):
    for leg, past in zip(legs, (N, K, N), strict=True):
        name = leg.run_dir.name
        assert leg.rc == 143 and "Traceback" not in leg.out, leg.out[-3000:]
        last = _last_step(leg)
        ckpt = leg.run_dir / f"checkpoint-{last}"
        assert last >= past and leg.out.rstrip().splitlines()[-1] == (
            f"rayward: stopped at step {last} (SIGTERM); checkpoint {ckpt} (continue with --name {name} --resume)"
        ), leg.out[-3000:]
        assert json.loads((ckpt / "rayward_state.json").read_text())["global_step"] == last


def test_the_resumed_run_trains_the_same_steps_as_the_uninterrupted_one(legs):
    straight, first, resumed = legs
    s = _last_step(first)
    assert f"resumed from {resumed.run_dir / f'checkpoint-{s}'} at step {s}" in resumed.out, resumed.out[-3000:]
    assert "logprob parity after sync" in resumed.out  # the demo's defaults: the check runs at the resume
    a, b = _by_step(straight.run_dir / "metrics.jsonl"), _by_step(resumed.run_dir / "metrics.jsonl")
    assert min(b) == s + 1 and sorted(b) == list(range(s + 1, max(b) + 1)), sorted(b)
    assert max(b) > s  # it trained steps to compare
    for step in range(s + 1, min(max(a), max(b)) + 1):  # N at least: both legs were stopped past it
        (ra,), (rb,) = a[step], b[step]
        for key in COMPARED:
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (step, key, ra[key], rb[key])


def test_the_same_prompts_completions_and_rewards(legs):
    straight, first, resumed = legs
    a, b = _by_step(straight.run_dir / "completions.jsonl"), _by_step(resumed.run_dir / "completions.jsonl")
    keep = ("prompt_index", "prompt", "completion", "total", "advantage")
    for step in range(_last_step(first) + 1, min(max(a), max(b)) + 1):
        sa = [tuple(r[k] for k in keep[:4]) for r in a[step]]
        sb = [tuple(r[k] for k in keep[:4]) for r in b[step]]
        assert sa and sa == sb, step
        adv_a, adv_b = [r["advantage"] for r in a[step]], [r["advantage"] for r in b[step]]
        assert adv_b == pytest.approx(adv_a, rel=1e-5, abs=1e-6), step
