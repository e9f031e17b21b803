"""orchestrator/build.py's pure choices: which cores and which environment each actor gets."""

from orchestrator.build import SHARED_CORES_ENV, generator_cpu_share, shared_cores_env
from orchestrator.config import parse_config

MINIMAL = {"rewards": [{"name": "r", "function": "letter_fraction"}]}


def cfg(loop: str, **cluster):
    return parse_config({**MINIMAL, "loop": {"mode": loop}, "cluster": cluster})


def test_sync_loop_binds_nothing_but_both_sides_wait_passively():
    """The phases take turns, but a weight sync runs the learner's sender and the engine's reload at once."""
    c = cfg("sync")
    assert generator_cpu_share(c) is None
    for res in (c.cluster.learner, c.cluster.generator):
        assert shared_cores_env(res) == {"runtime_env": {"env_vars": SHARED_CORES_ENV}}


def test_pipelined_cpu_binds_the_generator_and_makes_both_sides_wait_passively():
    c = cfg("pipelined", cpu_split=0.25)
    assert generator_cpu_share(c) == (0.25, 1.0)  # the learner is not bound: it borrows these cores when idle
    for res in (c.cluster.learner, c.cluster.generator):
        assert shared_cores_env(res) == {"runtime_env": {"env_vars": SHARED_CORES_ENV}}
    assert SHARED_CORES_ENV == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_pipelined_gpu_actors_keep_rays_defaults():
    c = cfg("pipelined", learner={"num_gpus": 1}, generator={"num_gpus": 1})
    assert generator_cpu_share(c) is None
    assert shared_cores_env(c.cluster.learner) == {} and shared_cores_env(c.cluster.generator) == {}
