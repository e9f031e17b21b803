"""One local Ray cluster for the whole integration session (fixed logical CPUs; actors ask for fractions)."""

import os

import pytest

from tests.conftest import ROOT

# Logical CPUs of the test cluster: more than the 2 physical cores so a run's actors (generator, learner,
# pool, up to 6 reward workers at fractional CPUs) all fit; the work itself is light.
TEST_CLUSTER_CPUS = 8


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from orchestrator.run.cluster import ACTOR_ENV

    env = {**ACTOR_ENV, "PYTHONPATH": str(ROOT)}
    os.environ.update(env)
    ray.init(
        num_cpus=TEST_CLUSTER_CPUS, include_dashboard=False, namespace="rayward-tests", log_to_driver=False,
        configure_logging=False, runtime_env={"env_vars": env},
    )
    yield ray
    ray.shutdown()
