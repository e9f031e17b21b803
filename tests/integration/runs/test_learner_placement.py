"""`cluster.learner_placement: spread` on a one-node cluster fails when Ray starts, before any actor, naming the field
(the multi-node case that works: tests/integration/cluster/test_multinode_learner.py)."""

import os
import subprocess
import sys

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.run.train import train
from tests.conftest import ROOT

SPREAD = ["cluster.num_learners=2", "cluster.learner_strategy=fsdp", "cluster.learner_placement=spread"]
MESSAGE = "cluster.learner_placement: spread puts each of the 2 learner ranks on its own node, but the cluster has 1"


def test_spread_on_one_node_fails_before_any_actor(ray_cluster, tmp_path):
    import ray

    cfg = load_config(ROOT / "configs" / "demo.yaml", [*SPREAD, f"logging.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=MESSAGE):
        train(cfg, name="spread-one-node", show_progress=False)
    assert ray.is_initialized()  # the caller's session is left as it was
    named = ray.util.list_named_actors(all_namespaces=True)
    assert not [a for a in named if a["name"].startswith("spread-one-node/")], named


def test_spread_on_the_embedded_cluster_is_one_line_from_the_cli(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", *SPREAD, f"logging.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"rayward: {MESSAGE}" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
