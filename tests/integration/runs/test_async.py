"""The async loop on a local Ray cluster, with real vLLM, learner and reward pool: the demo learns while the
generators never wait for a batch boundary, and weight loads land in the running engine between its steps. (Its
accounting, the staleness bound and the resume's replay: tests/unit/orchestrator/loop/test_feed.py, on fakes.)"""

from orchestrator.config import load_config
from orchestrator.run.train import train
from tests.conftest import ROOT


def test_async_learns_with_weights_loaded_in_flight(ray_cluster, tmp_path):
    cfg = load_config(ROOT / "configs" / "pipelined.yaml", [f"logging.dir={tmp_path}", "loop.mode=async",
                                                             "loop.max_staleness=2"])
    history = train(cfg, name="async-learn", show_progress=False)
    assert [h["step"] for h in history] == list(range(1, cfg.grpo.max_steps + 1))
    groups = cfg.generation.generation_batch_size // cfg.generation.num_generations
    assert all(h["batch/groups"] == groups for h in history)  # every step a whole batch
    assert max(h["async/version_lag/max"] for h in history) <= cfg.loop.max_staleness
    assert sum(h["async/loads_in_flight"] for h in history) > 0  # syncs landed while calls were sampling
    letter = [h["rewards/letter/mean"] for h in history]
    first, last = sum(letter[:5]) / 5, sum(letter[-5:]) / 5
    print(f"async letter reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.1 and last > 3 * first, (first, last)
