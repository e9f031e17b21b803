"""Prompt datasets: jsonl / parquet / saved datasets, plain and chat prompts, columns, epochs, the stream's position."""

import json

import datasets
import pytest
from transformers import AutoTokenizer

from orchestrator.config import DataConfig
from orchestrator.data.sources import EVAL_DRAW, DataError, DataPosition, Prompt, PromptSource, load_rows

ROWS = [
    {"prompt": [{"role": "user", "content": "Write the letter a:"}], "letter": "a", "id": 0},
    {"prompt": [{"role": "user", "content": "Write the letter b:"}], "letter": "b", "id": 1},
    {"prompt": [{"role": "user", "content": "Write the letter c:"}], "letter": "c", "id": 2},
]


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def test_jsonl_chat_prompts_use_the_chat_template(tmp_path, tok):
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in ROWS))
    rows = load_rows(DataConfig(path=str(f)))
    src = PromptSource(rows, tok, DataConfig(path=str(f), shuffle_dataset=False))
    batch = src.next_batch(2)
    want = tok.apply_chat_template(ROWS[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert tok.decode(batch[0].prompt_ids) == want and want.endswith("<|im_start|>assistant\n")
    assert [b.row for b in batch] == ROWS[:2]  # the dataset's rows, exactly: nothing of the driver's in them
    assert [b.draw for b in batch] == [0, 1]


def test_parquet_and_saved_dataset_with_plain_prompts(tmp_path, tok):
    plain = [{"prompt": f"Write the letter {c}:", "letter": c} for c in "abcd"]
    ds = datasets.Dataset.from_list(plain)
    ds.to_parquet(str(tmp_path / "p.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in (tmp_path / "p.parquet", tmp_path / "saved"):
        rows = load_rows(DataConfig(path=str(path)))
        assert rows == plain
    src = PromptSource(plain, tok, DataConfig(shuffle_dataset=False))
    assert tok.decode(src.next_batch(1)[0].prompt_ids) == "Write the letter a:"


def test_epochs_shuffle_and_resume_state(tok):
    rows = [{"prompt": f"p{i}", "i": i} for i in range(5)]
    cfg = DataConfig(shuffle_dataset=True)
    a = PromptSource(rows, tok, cfg, seed=1)
    first = [p.row["i"] for p in a.next_batch(5)]
    assert sorted(first) == list(range(5))  # one epoch = every row once
    a.next_batch(2)
    position = DataPosition.from_json(json.loads(json.dumps(a.state().to_json())))  # survives JSON, as in a checkpoint
    assert position == a.state()
    expected = a.next_batch(6)
    b = PromptSource(rows, tok, cfg, seed=1)
    b.restore(position)
    assert b.next_batch(6) == expected and [p.draw for p in expected] == list(range(7, 13))
    assert a.epoch_progress == pytest.approx(13 / 5)


def test_errors_name_the_field(tmp_path):
    with pytest.raises(DataError, match="data.prompt_column 'question'"):
        load_rows(DataConfig(prompt_column="question"))
    bad = tmp_path / "x.txt"
    bad.write_text("hi")
    with pytest.raises(DataError, match="unsupported file type"):
        load_rows(DataConfig(path=str(bad)))


def test_eval_rows_are_the_first_max_samples_tokenized(tmp_path, tok):
    from orchestrator.config import DataSource
    from orchestrator.data.sources import eval_prompts

    f = tmp_path / "held_out.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in ROWS))
    prompts = eval_prompts(DataSource(path=str(f)), tok, max_samples=2)
    assert [p.row for p in prompts] == ROWS[:2]  # file order, every time
    assert all(p.draw == EVAL_DRAW for p in prompts)  # no part of the run's prompt stream
    want = tok.apply_chat_template(ROWS[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert tok.decode(prompts[0].prompt_ids) == want
    assert len(eval_prompts(DataSource(path=str(f)), tok, max_samples=None)) == 3
    with pytest.raises(DataError, match=r"eval\.data\.prompt_column 'question' not in dataset"):
        eval_prompts(DataSource(path=str(f), prompt_column="question"), tok, max_samples=None)


def outs(groups, prompt_ids=None):
    """Generator answers for these groups of samples (their payloads in-process, as a generator used in-process
    keeps them)."""
    from actors.payloads import group_out, keep

    return [group_out(i, g, keep, prompt_ids=None if prompt_ids is None else prompt_ids[i])
            for i, g in enumerate(groups)]


def resolved(r):
    """The rollouts' reward batch as a worker reads it (fetched from the payloads)."""
    from actors.payloads import resolve_rewards
    from orchestrator.loop.rollout import by_reference

    return resolve_rewards(by_reference(r, with_prompt_ids=True))


def test_to_rollouts_joins_samples_to_their_rows():
    from actors.types import Sample
    from orchestrator.data.sources import to_rollouts

    prompts = [Prompt({"prompt": ROWS[0]["prompt"], "letter": "a"}, [1, 2], draw=4),
               Prompt({"prompt": "plain", "letter": "b"}, [3], draw=5)]
    groups = [[Sample([5], [-0.1], "a", "stop"), Sample([6, 7], [-0.2, -0.3], "aa", "length")],
              [Sample([8], [-0.4], "b", "stop"), Sample([9], [-0.5], "c", "stop")]]
    r = to_rollouts(prompts, outs(groups, [p.prompt_ids for p in prompts]), 3, prompt_column="prompt", group_size=2)
    assert len(r) == 4 and r.num_groups == 2 and r.policy_version == 3 and r.lengths() == [1, 2, 1, 1]
    rb = resolved(r)
    assert rb.completions[0] == [{"role": "assistant", "content": "a"}] and rb.completions[2] == "b"  # chat stays chat
    assert r.columns == {"letter": ["a", "a", "b", "b"]} and rb.prompt_ids[3] == [3]
    assert r.prompt_index == [4, 4, 5, 5]
    assert r.truncated == [False, True, False, False]


def test_a_batch_is_as_old_as_its_oldest_model_token():
    """A weight load landed while it sampled: per-token versions (-1: not the model's) set the batch's version."""
    from actors.types import Sample
    from orchestrator.data.sources import to_rollouts

    rows = [Prompt({"prompt": "p"}, [1])]
    groups = [[Sample([5, 6], [-0.1, -0.1], "a", "stop", versions=[4, 5]),
               Sample([7, 8], [-0.1, -0.1], "b", "stop", versions=[-1, 5])]]
    r = to_rollouts(rows, outs(groups), 3, prompt_column="prompt", group_size=2)
    assert r.policy_version == 4 and [i.version for i in r.infos] == [4, 5] and not r.agentic
    later = to_rollouts(rows, outs([[Sample([5], [-0.1], "a", "stop", versions=[6])] * 2]), 6,
                        prompt_column="prompt", group_size=2)
    assert r.concat(later).policy_version == later.concat(r).policy_version == 4  # the older piece's


def test_agentic_samples_bring_their_prompt_and_conversation():
    from actors.payloads import resolve_training
    from actors.types import Sample, TrainBatch, Trajectory
    from orchestrator.data.sources import to_rollouts

    chat = [{"role": "user", "content": "open box 2"}]
    t = Trajectory(prompt_ids=[9, 1], prompt=[{"role": "user", "content": "open box 2 (reset)"}],
                   messages=[{"role": "assistant", "content": "x"}], turn_ids=[0, -1, 1], stop_reason="length")
    sample = Sample([5, 6, 7], [-0.1, float("nan"), -0.2], "x", "length", versions=[2, -1, 2], trajectory=t)
    r = to_rollouts([Prompt({"prompt": chat, "box": 2}, [1])], outs([[sample, sample]]), 2, prompt_column="prompt",
                    group_size=2)
    rb = resolved(r)
    assert rb.prompt_ids[0] == [9, 1] and rb.prompts[0] == t.prompt and rb.completions[0] == t.messages
    assert r.prompts[0] == chat  # the driver holds the dataset's prompt; the rendered one stays in the payload
    train = resolve_training(TrainBatch([], [], [], [0.0, 0.0], r.truncated, payloads=r.payloads, group_size=2))
    assert train.completion_mask == [[1, 0, 1]] * 2 and train.prompt_ids == [[9, 1]] * 2
    assert r.truncated == [True, True] and r.columns == {"box": [2, 2]} and r.lengths() == [2, 2]
    assert r.agentic and r.infos[0].turns == t.turns
    with pytest.raises(ValueError, match="mixes agentic samples with one-turn"):
        to_rollouts([Prompt({"prompt": chat}, [1])], outs([[sample, Sample([5], [-0.1], "a", "stop")]]), 2,
                    prompt_column="prompt", group_size=2)


def test_boxes_is_a_builtin_dataset():
    from orchestrator.config import DataSource

    rows = load_rows(DataSource(path="boxes"))
    assert {"prompt", "box", "seed"} <= set(rows[0])


# --- data an environment owns, and rows without a prompt (TRL's environment_factory cases) ----------------------


def run_config(**tree):
    from orchestrator.config import parse_config

    tree.setdefault("rewards", [{"name": "r", "function": "letter_fraction"}])
    return parse_config(tree)


def test_an_environment_that_owns_its_data_gets_trls_placeholder_rows():
    """No data.path and one environment_factory: TRL's GRPOTrainer without a train_dataset builds
    generation_batch_size // num_generations rows of an empty user message and lets reset() supply each prompt.
    rayward trained on its built-in letter task instead."""
    from actors.types import EMPTY_PROMPT
    from orchestrator.data.sources import training_rows

    cfg = run_config(environment_factory="tests.fixtures.envs:CounterEnv",
                     generation={"num_generations": 4, "generation_batch_size": 12},
                     grpo={"per_device_train_batch_size": 4})
    rows = training_rows(cfg)
    assert rows == [{"prompt": list(EMPTY_PROMPT)}] * 3
    assert training_rows(run_config())[0]["prompt"].startswith("Write the letter")  # no environment: the toy task
    boxes = run_config(environment_factory="tests.fixtures.envs:CounterEnv", data={"path": "boxes"})
    assert "box" in training_rows(boxes)[0]  # a dataset given is the dataset


def test_a_mapping_of_environments_needs_a_dataset_to_route_rows():
    from orchestrator.config import ConfigError
    from orchestrator.data.sources import training_rows

    cfg = run_config(environment_factory={"a": "tests.fixtures.envs:CounterEnv"})
    with pytest.raises(ConfigError, match=r"data.path: environment_factory is a mapping.*`environment` column"):
        training_rows(cfg)


def test_rows_with_only_an_environment_column_serve_an_empty_user_prompt(tmp_path, tok):
    """TRL's 'Multiple environments' example: the dataset holds only `environment`; reset() supplies the prompt.
    Allowed where an environment supplies it (agentic runs); a one-turn run still needs its prompt column."""
    from actors.types import EMPTY_PROMPT
    from orchestrator.data.sources import training_rows

    f = tmp_path / "envs.jsonl"
    f.write_text("\n".join(json.dumps({"environment": e}) for e in ("a", "b")))
    cfg = run_config(environment_factory={"a": "tests.fixtures.envs:CounterEnv", "b": "tests.fixtures.envs:CounterEnv"},
                     data={"path": str(f)})
    rows = training_rows(cfg)
    assert rows == [{"environment": "a"}, {"environment": "b"}]
    src = PromptSource(rows, tok, DataConfig(path=str(f), shuffle_dataset=False))
    first = src.next_batch(1)[0]
    assert first.row == {"environment": "a"}  # reset(**row) gets the row as it is, as in TRL
    assert first.prompt_ids == tok.apply_chat_template(list(EMPTY_PROMPT), add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)
    with pytest.raises(DataError, match="data.prompt_column 'prompt' not in dataset"):
        load_rows(DataConfig(path=str(f)))
