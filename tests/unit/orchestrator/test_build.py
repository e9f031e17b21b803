"""orchestrator/build.py's pure choices, from the config: each actor's cores and environment, the reward pool's
autoscaling settings."""

from actors.cpus import SHARED_CORES_ENV, shared_cores_env
from orchestrator.build import autoscale_settings, generator_cpu_share
from orchestrator.config import parse_config

MINIMAL = {"rewards": [{"name": "r", "function": "letter_fraction"}]}


def cfg(loop: str, **cluster):
    return parse_config({**MINIMAL, "loop": {"mode": loop}, "cluster": cluster})


def test_sync_loop_binds_nothing_but_both_sides_wait_passively():
    """The phases take turns, but a weight sync runs the learner's sender and the engine's reload at once."""
    c = cfg("sync")
    assert generator_cpu_share(c) is None
    for res in (c.cluster.learner, c.cluster.generator):
        assert shared_cores_env(res.num_gpus) == {"runtime_env": {"env_vars": SHARED_CORES_ENV}}


def test_pipelined_cpu_binds_the_generator_to_its_split():
    c = cfg("pipelined", cpu_split=0.25)
    assert generator_cpu_share(c) == (0.25, 1.0)  # the learner is not bound: it borrows these cores when idle


def test_pipelined_gpu_generators_keep_every_core():
    c = cfg("pipelined", learner={"num_gpus": 1}, generator={"num_gpus": 1})
    assert generator_cpu_share(c) is None


def test_autoscale_settings_are_the_config_section():
    s = autoscale_settings(parse_config({**MINIMAL, "cluster": {"reward_autoscale": {"min_workers": 2, "max_workers": 6,
                                                                                       "target_utilization": 0.3}}}))
    assert (s.min_workers, s.max_workers, s.target_utilization) == (2, 6, 0.3)
    assert autoscale_settings(parse_config(MINIMAL)) is None
