"""A streamed dataset of 10 million rows against one of 10 thousand: the driver's memory and the run's start (a script,
not a test: it writes the shards, then runs the demo on each, data.streaming true).

    python bench/data_stream.py                       # 10M rows (20 parquet shards), then 10k; ~4 min on 2 cores
    python bench/data_stream.py --rows 1000000 --steps 5

Both datasets are the letter task's prompts (`Write the letter x:` and its `letter` column) in parquet shards of
500k rows (the small one: one shard), written once into --dir. Each run is `rayward run configs/demo.yaml` for
--steps steps on its shards, streamed through the default shuffle buffer (10k rows). Printed per dataset: the
shards' size on disk, the seconds until the driver had its prompt stream (opening the shards and reading the first
rows: `StreamSource` built in this process, as the driver builds it), the run's seconds to its first step, and the
driver's peak resident memory (its own process, polled every 0.1 s; the Ray actors are other processes).
The goal: the 10M-row run's driver within 200 MB of the 10k-row run's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARD_ROWS = 500_000
GOAL_MB = 200
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def write(out: Path, rows: int) -> Path:
    """`rows` letter-task rows as parquet shards of SHARD_ROWS (skipped if written before)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = out / "DONE"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for k, lo in enumerate(range(0, rows, SHARD_ROWS)):
        n = min(SHARD_ROWS, rows - lo)
        letters = [LETTERS[(lo + i) % 26] for i in range(n)]
        table = pa.table({"prompt": [f"Write the letter {c}:" for c in letters], "letter": letters,
                          "id": pa.array(range(lo, lo + n), pa.int64())})
        pq.write_table(table, out / f"part-{k:05d}.parquet", row_group_size=10_000)
    done.write_text(str(rows))
    return out


def open_seconds(path: Path) -> float:
    """Seconds to build the driver's prompt stream over the shards and draw its first batch."""
    from transformers import AutoTokenizer

    from orchestrator.builtin.models.tiny import ensure_tiny_model
    from orchestrator.config import DataConfig
    from orchestrator.data.shards import StreamSource, shards

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    t0 = time.perf_counter()
    cfg = DataConfig(path=str(path), streaming=True)
    StreamSource(shards(cfg), tok, cfg).next_batch(4)
    return time.perf_counter() - t0


def run(path: Path, steps: int, logdir: Path, name: str) -> tuple[float, float]:
    """(seconds to the first step, the driver's peak RSS in MB) of a streamed demo run."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", "--name", name, f"logging.dir={logdir}",
         f"grpo.max_steps={steps}", f"data.path={path}", "data.streaming=true", "logging.progress=false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "RAY_ADDRESS": ""})
    me, peak, first = psutil.Process(proc.pid), 0, None
    metrics = logdir / name / "metrics.jsonl"
    while proc.poll() is None:
        try:
            peak = max(peak, me.memory_info().rss)
        except psutil.Error:
            break
        if first is None and metrics.exists() and metrics.stat().st_size > 0:
            first = time.perf_counter() - t0
        time.sleep(0.1)
    out = proc.communicate()[0]
    if proc.returncode:
        raise SystemExit(f"{name}: rc {proc.returncode}\n{out[-3000:]}")
    return first or float("nan"), peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/rayward-bench-data"))
    args = ap.parse_args()
    results = {}
    for rows in (args.rows, args.small):
        path = write(args.dir / f"rows-{rows}", rows)
        size = sum(f.stat().st_size for f in path.glob("*.parquet")) / 2**20
        opened = open_seconds(path)
        first, peak = run(path, args.steps, args.dir / "runs", f"stream-{rows}")
        results[rows] = peak
        print(f"{rows:>11,} rows  {len(list(path.glob('*.parquet'))):>3} shards {size:>8.1f} MB on disk  stream ready "
              f"{opened:6.2f} s  first step {first:6.1f} s  driver peak RSS {peak:7.1f} MB", flush=True)
    gap = results[args.rows] - results[args.small]
    print(f"driver memory, {args.rows:,} rows - {args.small:,} rows: {gap:+.1f} MB (goal <= {GOAL_MB} MB: "
          f"{'met' if gap <= GOAL_MB else 'NOT met'})")


if __name__ == "__main__":
    main()
