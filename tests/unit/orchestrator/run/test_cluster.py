"""orchestrator/run/cluster.py: the actors' `.options()` from their resource sections, and the spread-placement check
against a cluster's nodes (as `ray.nodes()` lists them)."""

import os

import pytest

from orchestrator.config import ConfigError, parse_config
from orchestrator.run.cluster import actor_options, check_learner_placement, generator_options

MINIMAL = {"rewards": [{"name": "r", "function": "letter_fraction"}]}


def cluster(**kw):
    return parse_config({**MINIMAL, "cluster": {"num_learners": 2, "learner_strategy": "fsdp", **kw}}).cluster


def node(alive=True, **resources):
    return {"NodeID": "x", "Alive": alive, "Resources": {"CPU": 2.0, "memory": 1e9, **resources}}


def test_spread_needs_a_node_per_rank():
    spread = cluster(learner_placement="spread")
    check_learner_placement(spread, [node(), node()])
    with pytest.raises(ConfigError, match=r"cluster\.learner_placement: spread puts each of the 2 learner ranks on its "
                                          r"own node, but the cluster has 1 live node\(s\) with room for one rank "
                                          r"\(\{'CPU': 0\.5\}\) of 1 node\(s\)"):
        check_learner_placement(spread, [node()])
    with pytest.raises(ConfigError, match="has 1 live node"):
        check_learner_placement(spread, [node(), node(alive=False)])  # a dead node holds no rank
    check_learner_placement(cluster(), [node()])  # pack: one node is what it wants


def test_spread_counts_nodes_that_can_hold_a_rank():
    gpus = cluster(learner_placement="spread", learner={"num_cpus": 4, "num_gpus": 1})
    with pytest.raises(ConfigError, match=r"has 1 live node\(s\) with room for one rank "
                                          r"\(\{'CPU': 4\.0, 'GPU': 1\.0\}\) of 3 node\(s\)"):
        check_learner_placement(gpus, [node(CPU=8.0, GPU=8.0), node(CPU=8.0), node(CPU=2.0, GPU=1.0)])
    check_learner_placement(gpus, [node(CPU=8.0, GPU=8.0), node(CPU=4.0, GPU=1.0)])
    custom = cluster(learner_placement="spread", learner={"num_cpus": 1, "resources": {"learner_node": 1}})
    with pytest.raises(ConfigError, match="has 1 live node"):
        check_learner_placement(custom, [node(learner_node=1.0), node()])


def test_actor_options_carry_the_resources_section_and_extras():
    c = parse_config({**MINIMAL,
                      "cluster": {"learner": {"num_cpus": 2, "num_gpus": 1, "resources": {"big": 1}}}}).cluster
    assert actor_options(c.learner, name="x") == {"num_cpus": 2.0, "num_gpus": 1.0, "resources": {"big": 1.0},
                                                  "name": "x"}
    plain = actor_options(parse_config(MINIMAL).cluster.reward_worker)
    assert "resources" not in plain and set(plain) == {"num_cpus", "num_gpus"}


def test_a_generator_holds_the_gpus_of_its_tensor_parallel_workers():
    c = parse_config({**MINIMAL, "cluster": {"generator": {"num_gpus": 1}}}).cluster
    opts = generator_options(c.generator, tensor_parallel_size=4, max_restarts=2)
    assert opts["num_gpus"] == 4 and opts["max_restarts"] == 2


@pytest.mark.parametrize("where, user_value, expected", [
    (None, None, "10000"),  # an embedded cluster: its GCS keeps at most the dashboard's 10,000 tasks' events
    (None, "500", "500"),  # the user's own value wins
    ("10.0.0.1:6379", None, None),  # a joined cluster keeps its own setting
])
def test_an_embedded_cluster_caps_the_task_events_its_gcs_keeps(monkeypatch, where, user_value, expected):
    """Ray's GCS keeps every task's events up to 100,000 tasks, and an agentic run submits thousands of tasks a step:
    the gcs_server grew ~0.7 MB a step over a 400-step run (bench/README.md "The long runs")."""
    import ray

    from orchestrator.run import cluster

    seen = {}
    monkeypatch.setenv(cluster.TASK_EVENTS_ENV, "recorded")  # so that monkeypatch restores the environment after
    monkeypatch.delenv(cluster.TASK_EVENTS_ENV)
    if user_value is not None:
        monkeypatch.setenv(cluster.TASK_EVENTS_ENV, user_value)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw, env=os.environ.get(cluster.TASK_EVENTS_ENV)))
    cluster.init_ray(parse_config({**MINIMAL, "cluster": {"address": where}}).cluster, "r")
    assert seen["env"] == expected
    assert seen["address"] == (where or "local")
