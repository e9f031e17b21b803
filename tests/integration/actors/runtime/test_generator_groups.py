"""The generator actor's concurrency groups on a real Ray actor (actors/runtime/group.py GeneratorGroup with
actors/generation/generator.py GENERATOR_GROUPS and GENERATOR_METHOD_GROUPS): a weight load runs while a
streaming generation call is in flight on the same actor. A stand-in class with the generator's methods (as the
group calls them) and a generation that cannot go on until a load arrives (what a pipelined rollout waiting on
min_version does);
the engine side of a load mid-rollout is tests/integration/actors/generation/test_agent_engine.py."""

from __future__ import annotations

import threading

import pytest

from actors.generation.generator import GENERATOR_GROUPS, GENERATOR_METHOD_GROUPS
from actors.runtime.group import GeneratorGroup
from actors.types import Sampling

pytestmark = pytest.mark.integration

WAIT_S = 60  # a generation that never sees its load ends (and fails the test) instead of hanging it


class HeldGenerator:
    def __init__(self) -> None:
        self.loaded: list[int | None] = []
        self.load = threading.Event()

    def generate_groups_stream(self, prompt_token_ids, seeds, sampling, *, min_version=None):
        for i in range(len(prompt_token_ids)):
            if not self.load.wait(WAIT_S):
                raise TimeoutError("no weight load reached the actor while it generated")
            yield (i, list(self.loaded))

    def load_weights(self, blob: bytes, version: int | None = None) -> int | None:
        self.loaded.append(version)
        self.load.set()
        return version


def test_a_weight_load_runs_beside_a_generation_call_in_flight(ray_cluster) -> None:
    group = GeneratorGroup(HeldGenerator, 1, run_name="groups", role="generator", options={"num_cpus": 0.1},
                           concurrency_groups=GENERATOR_GROUPS, method_groups=GENERATOR_METHOD_GROUPS)
    try:
        stream = group.stream_generate(0, [[1], [2]], [0, 1], Sampling(n=1, max_tokens=1, temperature=1.0),
                                       min_version=None)
        (load,) = group.submit_load_weights(b"weights", 7)  # submitted after the stream, runs during it
        assert load.result() == 7
        assert stream.next() == (0, [7]) and stream.next() == (1, [7])
    finally:
        group.kill()
