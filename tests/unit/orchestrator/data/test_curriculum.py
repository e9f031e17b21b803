"""The curriculum over prompts (orchestrator/data/curriculum.py): per-prompt statistics from scored groups, the
difficulty sampler's pools, weights (and schedules) and resting, a user's sampler, and the prompt stream's exact
position with a curriculum (the loops' resume with it: test_loop.py)."""

import json
import math

import pytest

from orchestrator.config import ConfigError, DataConfig
from orchestrator.data.curriculum import Curriculum, make_curriculum
from orchestrator.data.sources import DataPosition, PromptSource
from tests.fixtures.fakes import ByteTokenizer

G = 4


def cfg(**difficulty):
    return DataConfig(sampler="difficulty", difficulty=difficulty)


def test_pools_follow_the_last_pass_rate_and_extremes_rest_then_return():
    c = Curriculum(4, cfg(rest_after=2, rest_steps=5))
    assert c.pools()["unseen"] == [0, 1, 2, 3]
    c.observe(0, [1.0, 1.0, 1.0, 0.0], step=1)  # 3/4: easy
    c.observe(1, [1.0, 0.0, 0.0, 0.0], step=1)  # 1/4: hard
    c.observe(2, [1.0, 1.0, 0.0, 0.0], step=1)  # learnable
    c.observe(3, [0.0, 0.0, 0.0, math.nan], step=1)  # 0/3 (NaN: no opinion)
    assert {p: v for p, v in c.pools().items() if v} == {"easy": [0], "hard": [1, 3], "learnable": [2]}
    assert (c.stats[2].reward_mean, c.stats[2].reward_std, c.stats[3].pass_rate) == (0.5, 0.5, 0.0)
    c.observe(3, [0.0] * G, step=2)  # 0/G twice in a row: rested until step 7
    assert c.pool(3) is None and c.stats[3].rested_until == 7 and c.metrics()["curriculum/rested"] == 1
    c.observe(2, [0.0] * G, step=7)
    assert c.pool(3) == "hard"  # back, in its pool


def test_draws_follow_the_weights_and_their_schedule():
    c = Curriculum(40, cfg(weights={"learnable": 1.0, "unseen": {"type": "piecewise", "steps": [[0, 0.0],
                                                                                            [10, 1.0]]}}))
    for r in range(10):
        c.observe(r, [1.0, 0.0, 1.0, 0.0], step=1)
    assert set(c.choose(8)) <= set(range(10))  # unseen weighs 0 until step 10: learnable only
    assert len(set(c.choose(8))) == 8  # no row twice in a batch while the pool has others
    c.observe(0, [1.0, 0.0, 1.0, 0.0], step=10)
    drawn = c.choose(200)
    assert any(r >= 10 for r in drawn) and c.metrics()["curriculum/draws/unseen"] > 0


def test_a_users_sampler_gets_the_statistics_and_is_checked():
    c = make_curriculum(DataConfig(sampler="tests.fixtures.samplers:least_drawn"), 5, 0)
    assert c.choose(3) == [0, 1, 2] and c.choose(3) == [3, 4, 0]
    with pytest.raises(ConfigError, match="returned list of length 1, not 2 row indices"):
        make_curriculum(DataConfig(sampler="tests.fixtures.samplers:too_few"), 5, 0).choose(2)
    with pytest.raises(ConfigError, match=r"takes no \['stats', 'trainer_state', 'num_rows'\]"):
        make_curriculum(DataConfig(sampler="tests.fixtures.samplers:no_kwargs"), 5, 0)
    with pytest.raises(ConfigError, match="data.sampler"):
        make_curriculum(DataConfig(sampler="tests.fixtures.samplers:missing"), 5, 0)
    assert make_curriculum(DataConfig(), 5, 0) is None


def test_config_rejects_bad_samplers():
    from orchestrator.config import parse_config

    for tree, message in [({"sampler": "hardest"}, "is `uniform`, `difficulty` or module:function"),
                          ({"sampler": "difficulty", "streaming": True, "path": "x"}, "not with streaming"),
                          ({"difficulty": {"hard_below": 0.8, "easy_above": 0.5}}, "must be below easy_above")]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"data": tree, "rewards": [{"name": "r", "function": "letter_fraction"}]})


@pytest.mark.parametrize("weights, message", [
    ({"learnable": -1.0}, r"data.difficulty.weights: learnable is -1 at step 0: a pool's share of the draws cannot "
                          "be negative"),
    ({"unseen": 1.0, "easy": {"type": "linear", "start": 1.0, "end": -0.5, "end_step": 30}},
     "easy is -0.45 at step 29"),  # crosses 0 between its ends
    ({"hard": {"type": "piecewise", "steps": [[0, 1.0], [50, -2.0]]}}, "hard is -2 at step 50"),
    ({"learnable": 0.0, "unseen": 0}, "every pool weighs 0 at step 0"),
    ({"unseen": {"type": "linear", "start": 1.0, "end": 0.0, "end_step": 10},
      "learnable": {"type": "cosine", "start": 0.0, "end": 1.0, "start_step": 12, "end_step": 20}},
     "every pool weighs 0 at step 10"),
    ({}, "every pool weighs 0 at step 0"),
])
def test_sampling_weights_are_refused_at_load_unless_a_distribution_at_every_step(weights, message):
    from orchestrator.config import parse_config

    with pytest.raises(ConfigError, match=message) as err:
        parse_config({"data": {"sampler": "difficulty", "difficulty": {"weights": weights}},
                      "rewards": [{"name": "r", "function": "letter_fraction"}]})
    assert str(err.value).count("\n") == 1  # one message: the header and the field


def test_the_stream_with_a_curriculum_resumes_exactly_and_replays_untrained_batches():
    rows = [{"prompt": f"p{i}", "i": i} for i in range(12)]

    def source():
        return PromptSource(rows, ByteTokenizer(), cfg(rest_steps=3), seed=5,
                            curriculum=Curriculum(len(rows), cfg(rest_steps=3), seed=5))

    def score(src, batch, step):
        draws = [p.draw for p in batch for _ in range(G)]
        totals = [float((p.row["i"] + j) % 3 == 0) for p in batch for j in range(G)]
        src.observe(draws, totals, G, step)

    a = source()
    for step in range(3):
        score(a, a.next_batch(3), step)
    ahead = a.next_batch(3)  # generated ahead, not trained
    position = DataPosition.from_json(json.loads(json.dumps(a.untrained_position(a.state(), [range(9, 12)])
                                                            .to_json())))
    score(a, ahead, 3)
    expected = [(p.row["i"], p.draw) for p in a.next_batch(3)]
    b = source()
    b.restore(position)
    again = b.next_batch(3)
    assert [(p.row["i"], p.draw) for p in again] == [(p.row["i"], p.draw) for p in ahead]
    score(b, again, 3)
    assert [(p.row["i"], p.draw) for p in b.next_batch(3)] == expected
    assert b.curriculum.stats == a.curriculum.stats and b.metrics()["curriculum/pool/unseen"] >= 0


def test_a_run_observes_every_scored_group_dropped_and_refilled_ones_too(tmp_path):
    from orchestrator.loop.loops import run_sync
    from tests.fixtures.fakes import fake_run, rows

    flags = ["grpo.max_steps=4", "data.sampler=difficulty", "grpo.dynamic_sampling=true", "grpo.max_refill_rounds=3"]
    run = fake_run(tmp_path / "r", flags, prompt_rows=rows(flat=lambda i: i % 2 == 0))
    history = run_sync(run)
    c = run.prompts.curriculum
    assert sum(s.scored for s in c.stats.values()) == run.prompts.served  # every draw, kept or dropped, observed
    assert not run.prompts._row_of  # nothing left waiting for its scores
    assert all(f"curriculum/pool/{p}" in h and f"curriculum/draws/{p}" in h for h in history
               for p in ("unseen", "learnable", "easy", "hard"))


def test_the_mixed_letter_task_has_unanswerable_rows():
    from orchestrator.builtin.tasks.letters import mixed_dataset

    data = mixed_dataset()
    broken = [r for r in data if not r["answerable"]]
    assert len(data) == 64 and len(broken) == 40 and all(r["letter"] == "" for r in broken)
    assert all(r["letter"] in "abcd" and r["letter"] for r in data if r["answerable"])


@pytest.mark.parametrize("loop", ["sync", "pipelined"])
def test_the_agentic_path_draws_from_the_curriculum(tmp_path, loop):
    from orchestrator.loop.loops import run_pipelined, run_sync
    from tests.fixtures.fakes import fake_run

    run = fake_run(tmp_path / "r", ["grpo.max_steps=3", "data.sampler=difficulty", f"loop.mode={loop}"],
                   agentic=True)
    history = (run_sync if loop == "sync" else run_pipelined)(run)
    c = run.prompts.curriculum
    assert [h["step"] for h in history] == [1, 2, 3] and c.stats
    assert sum(s.scored for s in c.stats.values()) == 3 * run.prompts_per_step  # the trained batches, observed
