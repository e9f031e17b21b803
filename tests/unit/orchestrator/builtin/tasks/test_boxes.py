"""The box task as a TRL environment: reset is a function of the row (a GRPO group starts from one state),
tools have JSON schemas, the reward needs the right box's code, and guessing without the tool scores ~nothing."""

from __future__ import annotations

import inspect

import pytest
from transformers.utils import get_json_schema

from orchestrator.builtin.tasks.boxes import (
    CODES,
    NO_TOOL_BOUND,
    NUM_BOXES,
    BoxEnv,
    SlowBoxEnv,
    boxes_dataset,
)


@pytest.fixture
def row():
    return boxes_dataset(size=1, seed=3)[0]


def fresh(row) -> BoxEnv:
    env = BoxEnv()
    env.reset(**row)
    return env


def test_rows_carry_what_reset_needs():
    rows = boxes_dataset(size=64, seed=0)
    assert len(rows) == 64 and rows == boxes_dataset(size=64, seed=0)
    for r in rows:
        assert r["prompt"][-1]["role"] == "user" and f"box {r['box']} " in r["prompt"][-1]["content"]
        assert 1 <= r["box"] <= NUM_BOXES
        assert fresh(r).codes  # every row resets
    assert {r["box"] for r in rows} == set(range(1, NUM_BOXES + 1))
    assert len({r["seed"] for r in rows}) == len(rows)


def test_reset_is_a_function_of_the_row(row):
    """The G samples of a group get the same row, hence the same boxes, whatever instance they land on and
    whatever it did before."""
    used = fresh(boxes_dataset(size=1, seed=99)[0])
    used.open_box(1)
    used.submit(123)
    assert used.reset(**row) is None  # the row's prompt already asks the question
    assert used.codes == fresh(row).codes and used.box == row["box"]
    assert used.opened == [] and used.submitted is None
    other = fresh({**row, "seed": row["seed"] + 1})
    assert other.codes != used.codes


def test_codes_are_distinct_three_digit_numbers(row):
    codes = list(fresh(row).codes.values())
    assert len(set(codes)) == NUM_BOXES and all(c in CODES for c in codes)


def test_reward_needs_the_asked_boxs_code(row):
    env = fresh(row)
    assert env.get_reward() == 0.0  # nothing submitted
    right = env.open_box(row["box"])
    assert env.submit(int(right)) == "Submitted."
    assert env.get_reward() == 1.0 and env.opened == [row["box"]]

    env = fresh(row)
    wrong_box = row["box"] % NUM_BOXES + 1
    assert env.submit(int(env.open_box(wrong_box))) == "Submitted."
    assert env.get_reward() == 0.0


def test_only_the_first_submission_counts(row):
    env = fresh(row)
    env.submit(100 if env.codes[row["box"]] != 100 else 101)
    assert env.submit(env.codes[row["box"]]) == "Already submitted."
    assert env.get_reward() == 0.0


def test_a_wrong_box_is_an_error_the_model_can_read(row):
    env = fresh(row)
    with pytest.raises(ValueError, match=f"no box 9; the boxes are 1 to {NUM_BOXES}"):
        env.open_box(9)
    assert env.opened == []
    with pytest.raises(ValueError, match="box 0 is not one of"):
        env.reset(**{**row, "box": 0})


def test_tools_are_the_public_methods_with_schemas():
    """What TRL does with an environment class: every public method but reset/get_reward is a tool, and
    transformers builds its JSON schema from the type hints and docstring."""
    tools = [n for n, _ in inspect.getmembers(BoxEnv, predicate=inspect.isfunction)
             if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert tools == ["open_box", "submit"]
    schemas = {n: get_json_schema(getattr(BoxEnv(), n))["function"] for n in tools}
    assert schemas["open_box"]["parameters"]["properties"]["box"]["type"] == "integer"
    assert schemas["submit"]["parameters"]["properties"]["code"]["type"] == "integer"
    assert all(s["description"] and s["parameters"]["required"] for s in schemas.values())


def test_guessing_without_the_tool_scores_about_the_bound():
    """The asked box's code does not depend on anything the prompt shows: a fixed guess wins about 1/900."""
    rows = boxes_dataset(size=9000, seed=1)
    wins = 0
    for r in rows:
        env = fresh(r)
        env.submit(500)
        wins += env.get_reward()
    assert NO_TOOL_BOUND == 1 / 900
    assert wins / len(rows) < 4 * NO_TOOL_BOUND  # ~10 expected; a leak (e.g. code tied to the box) gives hundreds


def test_slow_env_sleeps_per_tool_call(row, monkeypatch):
    slept = []
    monkeypatch.setattr("orchestrator.builtin.tasks.boxes.time.sleep", slept.append)
    env = SlowBoxEnv()
    env.reset(**row)
    env.submit(int(env.open_box(1)))
    assert slept == [0.1, 0.1]
    fresh(row).open_box(1)
    assert slept == [0.1, 0.1]  # the plain env never sleeps
