"""The vLLM Generator on the tiny local model: sampling outputs, logprob conventions and weight sync.

One engine serves the whole package (conftest.py: shared with test_engine.py). Tests that compare with
transformers use `engine_weights`, a HF model kept equal to whatever weights the engine currently holds, so the
tests do not depend on their order.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")

from safetensors.torch import save  # noqa: E402

from actors.generation.generator import Generator  # noqa: E402
from actors.types import Sampling  # noqa: E402

# Both sides run float32; differing kernel summation orders give ~1e-5 differences. A layer that
# failed to sync (e.g. a stale lm_head) shifts logprobs by > 0.1, so 1e-3 separates the two cleanly.
PARITY_TOL = 1e-3
# Perturbation relative to the tiny model's init std (0.2): large enough to move logprobs clearly.
NOISE_STD = 0.05


@pytest.fixture(scope="module")
def engine_weights(tiny_model: Path):
    """A transformers copy of the weights the engine holds (updated by the sync test)."""
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def chat_prompt(tokenizer, text: str) -> list[int]:
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    # transformers 5 returns a BatchEncoding here; older versions return the id list.
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def hf_logprobs(model, token_ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of tokens[1:] given their prefixes: the learner's convention."""
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, ids[0, 1:, None])[:, 0]


def sync_state(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """HF-named weights as the learner sends them: without the tied lm_head (an alias of
    embed_tokens, which safetensors refuses to serialize)."""
    return {k: v.detach().contiguous() for k, v in state.items() if not (tied and k == "lm_head.weight")}


def load_reference(model, state: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}


def fixed_sequence(generator: Generator) -> list[int]:
    prompt = chat_prompt(generator.tokenizer, "Write the letter a:")
    answer = generator.tokenizer.encode("the letter a is a letter", add_special_tokens=False)
    return prompt + answer


def test_checkpoint_loads_in_transformers(tiny_model: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    cfg = model.config
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # vLLM CPU attention needs head_dim 64
    assert model.dtype == torch.float32
    assert len(tok) == cfg.vocab_size
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == cfg.eos_token_id
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    ids = chat_prompt(tok, "Write the letter a:")
    assert tok.decode(ids) == "<|im_start|>user\nWrite the letter a:<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode("What is 7 + 13? Answer: 20")) == "What is 7 + 13? Answer: 20"
    logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg.vocab_size)


def test_checkpoint_loads_in_vllm(generator: Generator, tiny_model: Path) -> None:
    hf_tok = transformers.AutoTokenizer.from_pretrained(tiny_model)
    assert generator.tokenizer.eos_token_id == hf_tok.eos_token_id
    assert chat_prompt(generator.tokenizer, "hi") == chat_prompt(hf_tok, "hi")
    assert "Generator(" in repr(generator)


def test_generate_returns_aligned_samples(generator: Generator) -> None:
    letters = "abcdefgh"
    prompts = [chat_prompt(generator.tokenizer, f"Write the letter {c}:") for c in letters]
    n, max_tokens = 4, 32
    t0 = time.perf_counter()
    sampling = Sampling(n=n, max_tokens=max_tokens, temperature=1.0)
    out = generator.generate(prompts, [123] * len(prompts), sampling)
    dt = time.perf_counter() - t0
    n_tokens = sum(len(s.completion_ids) for samples in out for s in samples)
    print(f"\ngenerate 8x{n}x{max_tokens}: {dt:.2f}s, {n_tokens} tokens, {n_tokens / dt:.0f} tok/s")

    assert len(out) == len(prompts)
    for samples in out:
        assert len(samples) == n
        for s in samples:
            ids, lps = s.completion_ids, s.logprobs
            assert 0 < len(ids) <= max_tokens and len(lps) == len(ids)
            assert all(isinstance(t, int) and 0 <= t < len(generator.tokenizer) for t in ids)
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in lps)
            assert s.finish_reason in ("stop", "length")
            if s.finish_reason == "length":
                assert len(ids) == max_tokens
            assert isinstance(s.text, str)
    # A random model samples diverse completions; identical ones would mean n was ignored.
    assert len({tuple(s.completion_ids) for s in out[0]}) > 1
    # Same request seed -> same samples (what makes rollouts reproducible).
    again = generator.generate(prompts[:2], [123] * 2, sampling)
    assert [[s.completion_ids for s in p] for p in again] == [
        [s.completion_ids for s in p] for p in out[:2]
    ]


def test_seeds_per_prompt_tell_repeated_prompts_apart(generator: Generator) -> None:
    """Eval's seeds: one per prompt, n apart, so a repeated prompt gets other samples, and the same call again
    draws the same ones."""
    prompt = chat_prompt(generator.tokenizer, "Write the letter a:")
    sampling = Sampling(n=2, max_tokens=16, temperature=1.0)
    out = generator.generate([prompt, prompt], [5, 7], sampling)
    ids = [[s.completion_ids for s in group] for group in out]
    assert ids[0] != ids[1]
    assert [[s.completion_ids for s in g] for g in generator.generate([prompt, prompt], [5, 7], sampling)] == ids
    with pytest.raises(ValueError, match="1 seeds for 2 prompts"):
        generator.generate([prompt, prompt], [5], sampling)


def test_generate_stream_yields_every_group_once_as_generate_would(generator: Generator) -> None:
    """The pipelined loop's stream: each prompt's group exactly once, under its own index, equal to what
    `generate` samples with the same request seed (so the index mapping cannot mix groups up)."""
    prompts = [chat_prompt(generator.tokenizer, f"Write the letter {c}:") for c in "abcdef"]
    seeds, sampling = [7] * len(prompts), Sampling(n=3, max_tokens=24, temperature=1.0)
    expected = generator.generate(prompts, seeds, sampling)
    pieces = list(generator.generate_stream(prompts, seeds, sampling))
    seen = [i for piece in pieces for i, _ in piece.groups]
    assert sorted(seen) == list(range(len(prompts)))
    streamed = {i: samples for piece in pieces for i, samples in piece.groups}
    for i, samples in enumerate(expected):
        assert [s.completion_ids for s in streamed[i]] == [s.completion_ids for s in samples]
        for got, want in zip(streamed[i], samples, strict=True):
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    seconds = [piece.seconds for piece in pieces]
    assert seconds == sorted(seconds) and seconds[0] > 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_transformers(
    generator: Generator, engine_weights, temperature: float
) -> None:
    """Sampling logprobs are after temperature: equal to log_softmax(logits / T) of the HF model."""
    prompt = chat_prompt(generator.tokenizer, "Write the letter b:")
    (samples,) = generator.generate([prompt], [7], Sampling(n=2, max_tokens=16, temperature=temperature))
    for s in samples:
        ref = hf_logprobs(engine_weights, prompt + s.completion_ids, temperature)[len(prompt) - 1 :]
        diff = (ref - torch.tensor(s.logprobs)).abs().max().item()
        print(f"\nsampled logprobs T={temperature}: max abs diff vs transformers {diff:.2e}")
        assert diff < PARITY_TOL


def test_weight_sync_matches_transformers(generator: Generator, engine_weights) -> None:
    seq = fixed_sequence(generator)
    tied = bool(engine_weights.config.tie_word_embeddings)
    original = {k: v.clone() for k, v in engine_weights.state_dict().items()}
    before = torch.tensor(generator.sequence_logprobs(seq))
    assert before.shape == (len(seq) - 1,)
    assert (before - hf_logprobs(engine_weights, seq)).abs().max().item() < PARITY_TOL

    gen = torch.Generator().manual_seed(1)
    perturbed = {k: v + NOISE_STD * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    blob = save(sync_state(perturbed, tied))
    t0 = time.perf_counter()
    generator.load_weights(blob)
    print(f"\nweight sync: {time.perf_counter() - t0:.3f}s for {len(blob) / 1e6:.2f} MB")
    load_reference(engine_weights, sync_state(perturbed, tied))

    for temperature in (1.0, 0.7):
        after = torch.tensor(generator.sequence_logprobs(seq, temperature=temperature))
        ref = hf_logprobs(engine_weights, seq, temperature)
        diff = (after - ref).abs().max().item()
        print(f"post-sync sequence logprobs T={temperature}: max abs diff vs transformers {diff:.2e}")
        assert diff < PARITY_TOL
        if temperature == 1.0:
            # Otherwise the test would pass with a no-op sync.
            assert (after - before).abs().max().item() > 0.1

    # Sync back: repeated in-place reloads must keep working (kernel tensors are reused).
    generator.load_weights(save(sync_state(original, tied)))
    load_reference(engine_weights, sync_state(original, tied))
    restored = torch.tensor(generator.sequence_logprobs(seq))
    assert (restored - before).abs().max().item() < PARITY_TOL
