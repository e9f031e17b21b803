"""The run's first lines (orchestrator/run/train.py `_announce`) and which cluster it uses (cluster.ray_address):
what a newcomer sees before anything starts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.config import load_config
from orchestrator.run import train as train_mod
from orchestrator.run.cluster import ray_address
from tests.conftest import ROOT

DEMO = ROOT / "configs" / "demo.yaml"


def announce(tmp_path, overrides=(), monkeypatch=None) -> list[str]:
    cfg = load_config(DEMO, list(overrides))
    said: list[str] = []
    p = SimpleNamespace(cfg=cfg, name="r", run_dir=tmp_path / "r", agent=None)
    train_mod._announce(p, None, said.append)
    return said


def test_the_demo_starts_without_a_warning_about_defaults_it_did_not_choose(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert announce(tmp_path) == [f"rayward run 'r': logs and checkpoints in {tmp_path / 'r'}",
                                  f"rayward: watch its samples and curves: rayward view {tmp_path / 'r'}"]


def test_a_recovery_budget_asked_for_without_checkpoints_is_noted(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    said = announce(tmp_path, ["cluster.max_failures=2"])
    assert said[2].startswith("rayward: cluster.max_failures is 2 but grpo.save_steps is unset"), said
    assert len(announce(tmp_path, ["cluster.max_failures=2", "grpo.save_steps=5"])) == 2  # no note


def test_ray_address_joins_only_what_is_asked_and_the_first_line_says_so(tmp_path, monkeypatch):
    cfg = load_config(DEMO)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(cfg.cluster) == (None, "embedded")
    monkeypatch.setenv("RAY_ADDRESS", "")
    assert ray_address(cfg.cluster) == (None, "embedded")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert ray_address(cfg.cluster) == ("10.0.0.5:6379", "RAY_ADDRESS")
    assert announce(tmp_path)[0].endswith("; joining the Ray cluster at 10.0.0.5:6379 (RAY_ADDRESS)")
    joined = load_config(DEMO, ["cluster.address=auto"])
    assert ray_address(joined.cluster) == ("auto", "cluster.address")


@pytest.mark.parametrize("mode, token, expected", [
    ("disabled", None, ""),
    (None, "RAY_AUTH_TOKEN", " (sign in with the cluster's token: `ray get-auth-token`; it is in RAY_AUTH_TOKEN)"),
])
def test_the_dashboard_line_says_how_to_sign_in(monkeypatch, mode, token, expected):
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    if mode is not None:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    if token is not None:
        monkeypatch.setenv(token, "secret-token-value")
    line = train_mod._sign_in()
    assert line == expected and "secret-token-value" not in line


def test_a_parity_gap_above_the_limit_stops_the_run_before_its_first_step():
    """The documented limits: 1e-3 nats in float32, 0.5 in bfloat16, or logging.max_logprob_parity_gap."""
    from orchestrator.config import ConfigError, parse_config

    minimal = {"rewards": [{"name": "r", "function": "letter_fraction"}]}
    fp32 = parse_config(minimal)
    train_mod.check_parity(5e-6, fp32)  # the dense tiny model's, and the MoE's after the fix
    with pytest.raises(ConfigError, match=r"parity after the first weight sync is 3.10e-02 nats, above "
                                          r"logging.max_logprob_parity_gap = 0.001 \(float32\)"):
        train_mod.check_parity(3.1e-2, fp32)  # the MoE before the fix
    bf16 = parse_config({**minimal, "model": {"dtype": "bfloat16"}})
    train_mod.check_parity(0.1, bf16)
    with pytest.raises(ConfigError, match="bfloat16"):
        train_mod.check_parity(0.6, bf16)
    loose = parse_config({**minimal, "logging": {"max_logprob_parity_gap": 0.05}})
    train_mod.check_parity(3.1e-2, loose)
