"""CPU an idle vLLM engine burns after a call: the rayward plugin caps vLLM's 1 s busy-spin (actors/generation/
vllm_plugin.py). Prints CPU-seconds of the engine processes over an idle window, with and without the cap.

    python bench/engine_idle.py            # multiprocess engine (as on GPUs), tiny model
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDLE_WINDOW_S = 0.5


def engine_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children (vLLM's engine core and worker)."""
    import psutil

    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def measure() -> None:
    sys.path.insert(0, str(ROOT))
    from actors.generation.generator import Generator
    from actors.types import Sampling
    from orchestrator.builtin.models.tiny import ensure_tiny_model

    gen = Generator(str(ensure_tiny_model()))
    for _ in range(3):
        gen.generate([[1, 2, 3]], None, Sampling(n=4, max_tokens=8, temperature=1.0))
        time.sleep(0.2)
        before = engine_cpu_seconds()
        time.sleep(IDLE_WINDOW_S)
        print(f"idle engine: {engine_cpu_seconds() - before:.3f} CPU-s in {IDLE_WINDOW_S} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    if ap.parse_args().child:
        measure()
        return
    for label, spin in (("spin cap 5 ms (rayward default)", "0.005"), ("stock vLLM (1 s spin)", "1")):
        print(f"--- {label}", flush=True)
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "RAYWARD_VLLM_SPIN_S": spin}
        subprocess.run([sys.executable, __file__, "--child"], env=env, check=True)


if __name__ == "__main__":
    main()
