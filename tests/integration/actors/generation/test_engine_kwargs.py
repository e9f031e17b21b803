"""generation.engine_kwargs reach the generators' vLLM engine (the tiny model, in process, no Ray): vLLM's own
logits-processor API (a class given by its `module:Class` name, as a user's plug-in is) through them, here
bench/long_tail.py's LogNormalLengths, which imposes each sequence's length from its seed. Each sample of each
prompt must come out at its seed's length: the argument reached the engine, vLLM gave each of a request's n
samples its own seed (seed + j), and the processor kept its rows straight as sequences joined and left the batch.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

pytest.importorskip("vllm")

from actors.generation.generator import Generator  # noqa: E402
from actors.types import Sampling  # noqa: E402
from bench.long_tail import MAX_TOKENS, target_length  # noqa: E402
from tests.integration.actors.generation.conftest import CLOSE_WAIT_S, MAX_MODEL_LEN  # noqa: E402

SEEDS = [11, 23, 37, 41, 53, 67]
GROUP = 4


def test_a_logits_processor_given_by_name_imposes_every_samples_length(tiny_model, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    gen = Generator(str(tiny_model), seed=0, max_model_len=MAX_MODEL_LEN, kv_cache_gib=1.0,
                    extra_engine_kwargs={"logits_processors": ["bench.long_tail:LogNormalLengths"]})
    try:
        prompt = gen.tokenizer("Write the letter a:")["input_ids"]
        groups = gen.generate([prompt] * len(SEEDS), SEEDS, Sampling(n=GROUP, max_tokens=MAX_TOKENS, temperature=1.0))
    finally:
        gen.close(CLOSE_WAIT_S)
    eos = gen.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for seed, group in zip(SEEDS, groups, strict=True):
        want = sorted(target_length(seed + j) for j in range(GROUP))  # tokens, its end of turn the last
        assert sorted(len(s.completion_ids) for s in group) == want, seed
        assert all(s.completion_ids[-1] == eos and s.finish_reason == "stop" for s in group)
