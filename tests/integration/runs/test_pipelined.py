"""The pipelined loop on a local Ray cluster, with real vLLM, learner and reward pool: the demo learns with one batch
generated ahead. (Its accounting and the max_staleness rule: tests/unit/orchestrator/loop/test_loops.py, on fakes; its
on-policy parity with max_staleness 0: the pipelined generator-kill run in tests/integration/actors/weights.)"""


from orchestrator.config import load_config
from orchestrator.run.train import train
from tests.conftest import ROOT


def test_pipelined_learns(ray_cluster, tmp_path):
    cfg = load_config(ROOT / "configs" / "pipelined.yaml", [f"logging.dir={tmp_path}"])
    history = train(cfg, name="pipe-learn", show_progress=False)
    assert len(history) == cfg.grpo.max_steps
    assert [h["policy_staleness"] for h in history[1:]] == [cfg.loop.max_staleness] * (len(history) - 1)  # overlapped
    letter = [h["rewards/letter/mean"] for h in history]
    first, last = sum(letter[:5]) / 5, sum(letter[-5:]) / 5
    print(f"pipelined letter reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.1 and last > 3 * first, (first, last)
