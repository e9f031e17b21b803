"""EngineLoop on the real vLLM engine (tiny local model), in both of vLLM's layouts: the in-process engine the
Generator runs on CPU and the engine core in its own process (GPU's layout), where an exclusive section pauses
the core's scheduler.

- requests submitted at different times interleave (continuous batching),
- a weight load between two steps while requests decode: tokens before it carry the old version and the old
  weights' logprobs, tokens after it the new version and the new weights' logprobs (checked against
  transformers with each set of weights),
- aborts leave nothing in the engine,
- the Generator on the loop samples exactly what vLLM's offline `LLM.generate` samples, with the same
  logprobs, and `sequence_logprobs` is unchanged.

No Ray: the Generator is a plain class.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import CancelledError

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")

from safetensors.torch import save  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from actors.generation.engine import token_versions  # noqa: E402
from actors.generation.generator import Generator, _samples  # noqa: E402
from actors.types import Sampling  # noqa: E402

# Engine vs transformers, both float32: kernel summation orders differ by ~1e-5; the other weights' logprobs
# are > 0.1 away (NOISE_STD), so 1e-3 tells the two apart.
PARITY_TOL = 1e-3
NOISE_STD = 0.05
# Long enough that a request is still decoding when the test acts on it (the engine core in its own process
# does not wait for the test), within MAX_MODEL_LEN.
LONG_TOKENS = 900
# Bounds polling on the engine, so a loop that stopped fails the test instead of hanging it.
WAIT_S = 120


@pytest.fixture(scope="module")
def weights(tiny_model) -> dict[str, dict[str, torch.Tensor]]:
    """The tiny model's weights and a perturbed copy, HF-named, as the learner sends them: without the tied
    lm_head (an alias of the embeddings, which safetensors refuses)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert model.config.tie_word_embeddings
    original = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    g = torch.Generator().manual_seed(1)
    perturbed = {k: v + NOISE_STD * torch.randn(v.shape, generator=g) for k, v in original.items()}
    return {"original": original, "perturbed": perturbed}


def blob(state: dict[str, torch.Tensor]) -> bytes:
    return save({k: v.contiguous() for k, v in state.items()})


def hf_model(path, state: dict[str, torch.Tensor]):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: the embeddings are the lm_head
    return model.eval()


def completion_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax(logits) of each completion token given everything before it (temperature 1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return logp[len(prompt) - 1 :]


def split_at_load(completion, before: int, prompt: list[int], old, new
                  ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A completion a weight load (version `before` -> before + 1) cut in two: the cut (its tokens under `before`),
    the sampled log-probs, and the old and new models' log-probs of the same tokens; asserts the load landed
    mid-completion and every token's version is on its side of the cut."""
    ids = list(completion.token_ids)
    versions = token_versions(completion)
    cut = versions.count(before)
    assert 0 < cut < len(ids), f"the load did not land mid-completion: versions {versions}"
    assert versions == [before] * cut + [before + 1] * (len(ids) - cut)
    sampled = torch.tensor([step[t].logprob for t, step in zip(ids, completion.logprobs, strict=True)])
    return cut, sampled, completion_logprobs(old, prompt, ids), completion_logprobs(new, prompt, ids)


def prompt_ids(generator: Generator, text: str) -> list[int]:
    return generator.tokenizer.encode(text, add_special_tokens=False)


def long_params(n: int = 1, seed: int = 0) -> SamplingParams:
    return SamplingParams(n=n, max_tokens=LONG_TOKENS, temperature=1.0, seed=seed, logprobs=0, ignore_eos=True)


def wait_steps(generator: Generator, steps: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while generator.loop.steps < steps:
        assert time.monotonic() < deadline, f"the loop took {generator.loop.steps} steps, waited for {steps}"
        time.sleep(0.001)


def test_a_request_submitted_while_another_decodes_finishes_first(generator: Generator) -> None:
    loop = generator.loop
    start = loop.steps
    long = loop.submit(prompt_ids(generator, "Write the letter a:"), long_params())
    wait_steps(generator, start + 3)
    short = loop.submit(
        prompt_ids(generator, "Write the letter b:"),
        SamplingParams(max_tokens=4, temperature=1.0, seed=1, logprobs=0, ignore_eos=True),
    )
    out = short.result(WAIT_S)
    assert len(out.outputs[0].token_ids) == 4
    # It joined the running batch: the long request, LONG_TOKENS steps of work, is still decoding.
    assert not long.done()
    assert len(long.result(WAIT_S).outputs[0].token_ids) == LONG_TOKENS


def test_a_weight_load_between_steps_splits_each_completion_by_version(generator: Generator, weights,
                                                                      tiny_model) -> None:
    loop = generator.loop
    old, new = hf_model(tiny_model, weights["original"]), hf_model(tiny_model, weights["perturbed"])
    perturbed = blob(weights["perturbed"])
    before = loop.version
    prompt = prompt_ids(generator, "Write the letter c:")
    start = loop.steps
    request = loop.submit(prompt, long_params(n=2, seed=3))
    wait_steps(generator, start + 3)
    generator.load_weights(perturbed)
    assert loop.version == before + 1
    try:
        out = request.result(WAIT_S)
    finally:
        generator.load_weights(blob(weights["original"]), version=before)

    for completion in out.outputs:
        cut, sampled, ref_old, ref_new = split_at_load(completion, before, prompt, old, new)
        # Under the old weights before the load, under the new ones after it (KV recomputed).
        assert (sampled[:cut] - ref_old[:cut]).abs().max().item() < PARITY_TOL
        assert (sampled[cut:] - ref_new[cut:]).abs().max().item() < PARITY_TOL
        # Otherwise the split would not be visible in the logprobs.
        assert (ref_old[cut:] - ref_new[cut:]).abs().max().item() > 0.1
    # Back on the original weights: a fresh request is all old version and matches them.
    again = loop.submit(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=4, logprobs=0)).result(WAIT_S)
    assert set(token_versions(again.outputs[0])) == {before}


def test_an_aborted_request_leaves_nothing_in_the_engine(generator: Generator) -> None:
    loop = generator.loop
    start = loop.steps
    request = loop.submit(prompt_ids(generator, "Write the letter d:"), long_params(n=2))
    wait_steps(generator, start + 2)
    assert request.cancel()
    with pytest.raises(CancelledError):
        request.result(WAIT_S)
    assert loop.exclusive(generator.llm.llm_engine.has_unfinished_requests) is False
    out = loop.submit(prompt_ids(generator, "hi"), SamplingParams(max_tokens=3, ignore_eos=True)).result(WAIT_S)
    assert len(out.outputs[0].token_ids) == 3


def test_generator_on_the_loop_samples_what_offline_generate_samples(generator: Generator) -> None:
    """Same seeds, same samples and logprobs as vLLM's `LLM.generate` (the Generator's path before the loop),
    called directly while the loop is idle."""
    prompts = [prompt_ids(generator, f"Write the letter {c}:") for c in "abcdef"]
    sampling = Sampling(n=3, max_tokens=24, temperature=1.0)
    got = generator.generate(prompts, [11] * len(prompts), sampling)
    params = Generator._sampling_params(n=3, max_tokens=24, temperature=1.0, seed=11)
    direct = generator.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    want = [_samples(out) for out in direct]
    assert [[s.completion_ids for s in g] for g in got] == [[s.completion_ids for s in g] for g in want]
    for g_got, g_want in zip(got, want, strict=True):
        for a, b in zip(g_got, g_want, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
            assert (a.text, a.finish_reason) == (b.text, b.finish_reason)

    seq = prompts[0] + got[0][0].completion_ids
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    (out,) = generator.llm.generate([TokensPrompt(prompt_token_ids=seq)], params, use_tqdm=False)
    direct_lps = [step[t].logprob for t, step in zip(seq[1:], out.prompt_logprobs[1:], strict=True)]
    assert generator.sequence_logprobs(seq) == pytest.approx(direct_lps, abs=1e-5)
    assert all(math.isfinite(x) for x in direct_lps)
