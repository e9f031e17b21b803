"""TeacherEngine on a real vLLM engine (CPU) with the tiny teacher (orchestrator/builtin/models/teacher.py): the
log-probs it answers for the student's completion tokens are the teacher's own, as transformers computes them from the
same ids (one forward, no sampling), the same alone as in a batch; the teacher knows the task (it prefers the letter
asked for), which is what distillation pulls a student towards."""

from __future__ import annotations

import random

import pytest
import torch

from actors.engines.teacher import TeacherEngine, TeacherRequest, TeacherSpec
from orchestrator.builtin.models.teacher import ensure_tiny_teacher, letter_id, prompt_ids
from orchestrator.builtin.tasks.letters import LETTERS

# vLLM's CPU kernels and transformers' eager attention agree to this in float32 on the tiny model.
LOGPROB_ATOL = 2e-4


@pytest.fixture(scope="module")
def path():
    return str(ensure_tiny_teacher())


@pytest.fixture(scope="module")
def engine(path):
    teacher = TeacherEngine(TeacherSpec(model=path, timeout_s=120.0), max_model_len=64, kv_cache_gib=0.5)
    yield teacher
    teacher.close(120)


def samples(tokenizer, n: int, seed: int = 3) -> list[TeacherRequest]:
    """What a student writes on the letter task: its prompt's ids, then random tokens or letters."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        want = rng.choice(LETTERS)
        body = [rng.randrange(3, 512) if rng.random() < 0.5 else letter_id(tokenizer, want)
                for _ in range(rng.randint(1, 16))]
        out.append(TeacherRequest(prompt_ids(tokenizer, want), body))
    return out


def test_the_teachers_log_probs_are_its_own_the_same_alone_and_in_a_batch(engine, path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    requests = samples(tokenizer, 24)
    together = engine.logprobs(requests)
    assert [a.status for a in together] == ["ok"] * len(requests)
    for r, a in zip(requests, together, strict=True):
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            lp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        ref = lp[torch.arange(len(r.prompt_ids) - 1, ids.shape[1] - 1), torch.tensor(r.completion_ids)]
        torch.testing.assert_close(torch.tensor(a.logprobs), ref, rtol=0, atol=LOGPROB_ATOL)
    alone = [engine.logprobs([r])[0] for r in requests[:6]]
    for a, b in zip(alone, together[:6], strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=LOGPROB_ATOL)
    # it knows the task: the letter asked for is likelier than any other first token
    firsts = engine.logprobs([TeacherRequest(prompt_ids(tokenizer, c), [letter_id(tokenizer, x)])
                              for c in LETTERS for x in LETTERS])
    for i, c in enumerate(LETTERS):
        row = [firsts[i * len(LETTERS) + j].logprobs[0] for j in range(len(LETTERS))]
        assert max(range(len(LETTERS)), key=row.__getitem__) == i and row[i] > -0.1, (c, row)
