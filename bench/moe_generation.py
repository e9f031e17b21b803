"""Generator tokens/s: a mixture of experts against the dense model of the same active size (CPU, vLLM).

    python bench/moe_generation.py                       # moe100m (~114M, 26M active) vs its dense twin (~26M)
    python bench/moe_generation.py --prompts 32 --n 8 --tokens 128 --repeats 3

Each model runs in its own subprocess, one after the other (no competition for the cores): rayward's Generator
(an in-process vLLM engine on every core, as a run's generator), one warm-up batch, then --repeats batches of
--prompts toy prompts x --n samples x --tokens new tokens each (EOS ignored, so every batch decodes the same number
of tokens); prints the median decode tokens/s of each model and their ratio. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("moe", "dense")


def worker(which: str, size: str, prompts: int, n: int, tokens: int, repeats: int) -> dict[str, float]:
    from vllm import SamplingParams

    from actors.generation.generator import Generator
    from bench.models import MOE_SHAPES, build_active_twin, build_moe_model
    from orchestrator.builtin.tasks.letters import toy_dataset
    from orchestrator.data.sources import encode_prompt

    path = build_moe_model(size) if which == "moe" else build_active_twin(size)
    gen = Generator(str(path), max_model_len=512, kv_cache_gib=2)
    ids = [encode_prompt(gen.tokenizer, r["prompt"]) for r in toy_dataset()[:prompts]]
    params = SamplingParams(n=n, max_tokens=tokens, temperature=1.0, ignore_eos=True, seed=0)
    rates = []
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        outs = [r.result() for r in gen.loop.submit_batch(ids, params)]
        seconds = time.perf_counter() - t0
        made = sum(len(c.token_ids) for o in outs for c in o.outputs)
        if k:  # the first batch warms the engine up
            rates.append(made / seconds)
    gen.loop.close(60)
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        total = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    h, layers, experts, top_k, inter, *_ = MOE_SHAPES[size]
    inactive = layers * (experts - top_k) * 3 * h * inter if which == "moe" else 0
    return {"tokens_per_s": statistics.median(rates), "params": total, "active_params": total - inactive}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="moe100m", help="a bench/models.py MOE_SHAPES entry (default moe100m)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per sample (default 64)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", choices=MODELS, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.worker:
        print(json.dumps(worker(ns.worker, ns.size, ns.prompts, ns.n, ns.tokens, ns.repeats)))
        return
    results = {}
    for which in MODELS:
        cmd = [sys.executable, __file__, "--worker", which, "--size", ns.size, "--prompts", str(ns.prompts),
               "--n", str(ns.n), "--tokens", str(ns.tokens), "--repeats", str(ns.repeats)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
        results[which] = json.loads(out.stdout.strip().splitlines()[-1])
    for which, r in results.items():
        print(f"{which:>5}: {r['tokens_per_s']:8.0f} tokens/s  ({r['params'] / 1e6:.0f}M parameters, "
              f"{r['active_params'] / 1e6:.0f}M active per token)")
    ratio = results["moe"]["tokens_per_s"] / results["dense"]["tokens_per_s"]
    print(f"MoE / dense of the same active size: {ratio:.2f}x the tokens/s "
          f"({ns.prompts} prompts x {ns.n} samples x {ns.tokens} tokens, median of {ns.repeats})")


if __name__ == "__main__":
    main()
