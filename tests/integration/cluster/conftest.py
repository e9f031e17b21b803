"""One multi-node cluster (cluster/local_cluster.sh: a head, two reward nodes, a generator node) for the cluster tests
that need one: starting its nodes one at a time is the slow part, and each test's runs have their own names."""

from __future__ import annotations

import pytest

from tests.fixtures.cluster import Cluster


@pytest.fixture(scope="package")
def multinode(request: pytest.FixtureRequest):
    """The running cluster; its logs are kept (the path printed) when a test that used it failed."""
    failed_before = request.session.testsfailed
    cluster = Cluster()
    try:
        cluster.up(reward_nodes=2, generator_node=True)
    except BaseException:
        cluster.down(keep_logs=True)
        raise
    try:
        yield cluster
    finally:
        cluster.down(keep_logs=request.session.testsfailed > failed_before)
