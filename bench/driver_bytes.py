"""Bytes through the driver on a real run (issue 49): a config trained in this process on an embedded Ray cluster
(real vLLM generators, reward pool, learner), every object the driver process serializes or deserializes counted
by bench/scale_sim.py's hooks on Ray's serialization context, per sample trained.

    python bench/driver_bytes.py configs/demo.yaml grpo.max_steps=10
    python bench/driver_bytes.py configs/moe.yaml grpo.max_steps=6      # MoE with routing replay (R3)

It ends with one line: `CONFIG: driver bytes/sample B (received R, sent S over N samples)`. bench/README.md has
the results, before and after the data plane.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale_sim import Bytes, count_driver_bytes  # noqa: E402  (sets up the client's auth before Ray)
from orchestrator.config import load_config  # noqa: E402
from orchestrator.run.train import train  # noqa: E402


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    config, overrides = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(config, [f"logging.dir={tmp}", *overrides])
        counter = Bytes()
        count_driver_bytes(counter)
        history = train(cfg, name="driver-bytes", show_progress=False)
    steps = len([h for h in history if "reward" in h])
    samples = steps * cfg.generation.generation_batch_size
    total = counter.received + counter.sent
    print(f"{config}: driver bytes/sample {total / samples:.0f} (received {counter.received / 1e6:.1f} MB, sent "
          f"{counter.sent / 1e6:.1f} MB over {samples} samples, {steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
