"""One multi-node cluster (cluster/local_cluster.sh: a head, two reward nodes, a generator node) for the cluster tests
that need one: starting its nodes one at a time is the slow part, and each test's runs have their own names."""

from __future__ import annotations

from pathlib import Path

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This package's tests that need no `multinode` cluster run before those that do, so that the cluster (a
    package fixture: it lives until the package's last test) is down again while the others run."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == here]
    ordered = sorted((items[i] for i in slots), key=lambda item: "multinode" in getattr(item, "fixturenames", ()))
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item
