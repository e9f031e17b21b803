"""TRL 1.16's agent patterns (tests/fixtures/trl_agents.py: the shapes of TRL's examples/scripts/grpo_agent.py,
grpo_2048.py and the GRPO guide's "Agent Training" section, on the box task) run in rayward and in TRL's own
GRPOTrainer, on the tiny tool model, and compared.

Two rayward runs (configs/tools.yaml, shortened; each shared by its module's assertions):

* routed: a dict environment_factory, `{sql: SqlBoxEnv, game: BoxGameEnv}`, over a dataset whose only column is
  `environment`; each reset writes its prompt. SqlBoxEnv's `open_box` is a SQL query on a local sqlite file bounded
  by its own `signal.alarm`; BoxGameEnv is a stateful game scored by a reward function that reads `environments`.
* own data: no dataset (TRL's placeholder rows); `OwnDataEnv.reset(prompt)` names its one column; the standalone
  tools `open_box` (sync, the same SQL query) and `submit` (`async def`) serve it.

TRL's side is the same code through `GRPOTrainer(...).train()`, one step, transformers generation on CPU
(`use_vllm=False`), a batch as large as rayward's two steps together. Per pattern, the share of the tool calls
that answered without error is compared (both sides sample, so within TOLERANCE), and what the pattern promises
is checked on both sides: the reward function reads each game's own state, the environment that owns its data
writes the prompts, the alarm's own message is what the model reads.
"""

from __future__ import annotations

import json
import math
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from actors.payloads import fetch
from orchestrator.builtin.tasks.boxes import NUM_BOXES, PROMPT_TEMPLATE
from orchestrator.config import load_config, parse_config
from orchestrator.loop import phases
from orchestrator.run.train import train
from tests.conftest import ROOT
from tests.fixtures import trl_agents
from tests.fixtures.trl_agents import (
    PLACEHOLDER_PROMPT,
    BoxGameEnv,
    OwnDataEnv,
    SqlBoxEnv,
    calls_made,
    is_error,
    tool_messages,
)

FIXTURES = "tests.fixtures.trl_agents"
STEPS = 2
NUM_GENERATIONS = 4
BATCH = 16  # rayward: 4 rows x NUM_GENERATIONS per step
TRL_BATCH = STEPS * BATCH  # TRL: one step with as many samples as rayward's run
ROUTED_ROWS = 4  # of each environment, alternating: one pass over them is rayward's STEPS steps, TRL's first batch
# Each side must have made this many calls in a group for its share to mean something: a group holds BATCH samples or
# more, the warmed-up model writes a call in most of them and two in a solved one.
MIN_CALLS = 12
# "Most calls answered", on each side: the warmed-up model's well-formed calls almost all answer (bench/README.md,
# trl_tools: tool failures per step), so a side falls under this only when a quarter of its calls fail, which
# samples of MIN_CALLS or more from such a model all but never show; a tool broken on one side (every open_box
# failing, say) halves that side's share.
MOST = 0.75
# The two sides' shares may differ by this much: the same reasoning from the other side (two samples of a model
# whose calls almost all answer differ by a quarter only when one of them fails a quarter of its calls).
TOLERANCE = 0.25
QUESTION = re.compile("^" + re.escape(PROMPT_TEMPLATE).replace(r"\{box\}", r"(\d)") + "$")


# Scenario tier: two rayward runs and two TRL runs (CI time); CI's tier: a stock template's tool turn,
# the tools run.


# --- what both sides produced, read alike -------------------------------------------------------------------


@dataclass
class Sampled:
    """One side's samples, in order: the prompt, the conversation, the pattern group, each reward's raw score and
    the environment instance at the end (None where it was lost)."""

    prompts: list[list[dict[str, Any]]] = field(default_factory=list)
    completions: list[list[dict[str, Any]]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    rewards: dict[str, list[float | None]] = field(default_factory=dict)
    environments: list[Any] = field(default_factory=list)

    def of(self, group: str) -> list[int]:
        return [i for i, g in enumerate(self.groups) if g == group]

    def answered(self, group: str, skip: str | None = None) -> tuple[int, int]:
        """(tool calls that answered without error, tool calls) over the group's conversations."""
        messages = [m for i in self.of(group) for m in tool_messages(self.completions[i], skip)]
        return sum(not is_error(m) for m in messages), len(messages)


def no_opinion(reward: float | None) -> bool:
    """A reward function's None for a sample (rayward's table keeps None, TRL's log NaN)."""
    return reward is None or math.isnan(reward)


def group_of(env: Any) -> str:
    return {SqlBoxEnv: "sql", BoxGameEnv: "game", OwnDataEnv: "own"}[type(env)]


@contextmanager
def pytest_alarm_kept() -> Iterator[None]:
    """The SIGALRM handler and timer as they were (pytest-timeout's, when it runs): TRL's alarm pattern, run in this
    process, installs its own handler and cancels any timer."""
    handler = signal.getsignal(signal.SIGALRM)
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.signal(signal.SIGALRM, handler)
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, max(remaining - (time.monotonic() - start), 1e-3), interval)


# --- rayward ------------------------------------------------------------------------------------------------


def rayward_run(name: str, run_dir: Path, edit: Callable[[dict[str, Any]], None]) -> tuple[list[dict], Sampled]:
    """configs/tools.yaml, shortened and edited, through the real train(); its history and what the loop handed the
    learner (phases.to_train_batch), read as Sampled."""
    tree = load_config(ROOT / "configs" / "tools.yaml", [
        f"logging.dir={run_dir}", f"grpo.max_steps={STEPS}", f"generation.num_generations={NUM_GENERATIONS}",
        f"generation.generation_batch_size={BATCH}", f"grpo.per_device_train_batch_size={BATCH}",
        "logging.check_logprob_parity=false",
    ]).model_dump()
    edit(tree)
    steps = []
    real = phases.to_train_batch

    def capture(run, selection):
        step = real(run, selection)  # its trajectories read now, while the generators hold them
        steps.append((step, [s.trajectory for p in fetch(step.rollouts.payloads) for s in p.samples]))
        return step

    mp = pytest.MonkeyPatch()
    mp.setattr(phases, "to_train_batch", capture)
    try:
        history = train(parse_config(tree), name=name, show_progress=False)
    finally:
        mp.undo()
    return history, rayward_samples(steps)


def rayward_samples(steps: list[Any]) -> Sampled:
    from ray import cloudpickle

    out = Sampled()
    for step, trajectories in steps:
        for t in trajectories:
            out.prompts.append(t.prompt)
            out.completions.append(t.messages)
            state = cloudpickle.loads(t.env_state) if t.env_state is not None else None
            out.environments.append(state)
            out.groups.append(t.env if t.env is not None else "own")
        for key, values in step.table.items():
            if key.startswith("rewards/"):
                out.rewards.setdefault(key.removeprefix("rewards/"), []).extend(values)
    return out


@pytest.fixture(scope="module")
def database():
    return trl_agents.build_database()


@pytest.fixture(scope="module")
def routed_run(ray_cluster, database, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("routed")
    rows = run_dir / "rows.jsonl"
    rows.write_text("".join(json.dumps({"environment": e}) + "\n" for e in ["sql", "game"] * ROUTED_ROWS))

    def edit(tree: dict[str, Any]) -> None:
        tree["name"] = "trl-routed"
        tree["environment_factory"] = {"sql": f"{FIXTURES}:SqlBoxEnv", "game": f"{FIXTURES}:BoxGameEnv"}
        tree["data"].update(path=str(rows), shuffle_dataset=False)
        tree["rewards"] = [{"name": "game_won", "function": f"{FIXTURES}:game_won"}]  # + SqlBoxEnv's get_reward

    return rayward_run("trl-routed", run_dir, edit)


@pytest.fixture(scope="module")
def own_data_run(ray_cluster, database, tmp_path_factory):
    def edit(tree: dict[str, Any]) -> None:
        tree["name"] = "trl-own-data"
        del tree["data"]  # no dataset: the environment owns the data
        tree["environment_factory"] = f"{FIXTURES}:OwnDataEnv"
        tree["tools"] = [f"{FIXTURES}:open_box", f"{FIXTURES}:submit"]
        tree["rewards"] = [{"name": "submitted_code", "function": f"{FIXTURES}:submitted_code"}]

    return rayward_run("trl-own-data", tmp_path_factory.mktemp("own"), edit)


# --- TRL ----------------------------------------------------------------------------------------------------


def trl_trainer(output_dir: Path, **kwargs: Any) -> Any:
    """TRL's GRPOTrainer on the tiny tool model as bench/trl_tools.py builds it, one step of TRL_BATCH samples,
    without its progress bar and log lines."""
    from transformers import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from orchestrator.builtin.models.tools import ensure_tiny_tool_model

    args = GRPOConfig(
        output_dir=str(output_dir), per_device_train_batch_size=TRL_BATCH, gradient_accumulation_steps=1,
        generation_batch_size=TRL_BATCH, num_generations=NUM_GENERATIONS, max_completion_length=128,
        max_tool_calling_iterations=3, temperature=1.0, learning_rate=2e-4, loss_type="dapo", beta=0.0, max_steps=1,
        use_cpu=True, bf16=False, use_vllm=False, shuffle_dataset=False, report_to="none", save_strategy="no",
        logging_steps=1, seed=0, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=str(ensure_tiny_tool_model()), args=args, **kwargs)
    for chatty in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(chatty)
    return trainer


def trl_samples(trainer: Any) -> Sampled:
    """The step's samples as the trainer logged them (its completions log) and its environment instances."""
    logs = trainer._logs
    return Sampled(prompts=list(logs["prompt"]), completions=list(logs["completion"]),
                   groups=[group_of(e) for e in trainer.environments],
                   rewards={k: list(v) for k, v in logs["rewards"].items()}, environments=list(trainer.environments))


@pytest.fixture(scope="module")
def trl_routed(database, trl_quiet, tmp_path_factory):
    from datasets import Dataset

    trainer = trl_trainer(
        tmp_path_factory.mktemp("trl-routed"),
        train_dataset=Dataset.from_list([{"environment": e} for e in ["sql", "game"] * ROUTED_ROWS]),
        environment_factory={"sql": SqlBoxEnv, "game": BoxGameEnv}, reward_funcs=[trl_agents.game_won],
    )
    with pytest_alarm_kept():
        trainer.train()
    return trainer, trl_samples(trainer)


@pytest.fixture(scope="module")
def trl_own_data(database, trl_quiet, tmp_path_factory):
    trainer = trl_trainer(tmp_path_factory.mktemp("trl-own-data"), environment_factory=OwnDataEnv,
                          tools=[trl_agents.open_box, trl_agents.submit], reward_funcs=[trl_agents.submitted_code])
    with pytest_alarm_kept():
        trainer.train()
    return trainer, trl_samples(trainer)


@pytest.fixture(scope="module")
def trl_quiet():
    mp = pytest.MonkeyPatch()
    mp.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory's warning
    yield mp
    mp.undo()


# --- the tests ----------------------------------------------------------------------------------------------


def test_every_pattern_shows_the_model_the_box_tasks_tools():
    """The tiny model was warmed up on BoxEnv's two tools: each pattern's tools have their schemas exactly."""
    from transformers.utils import get_json_schema

    from orchestrator.builtin.models.tools import task_tools

    expected = [get_json_schema(fn) for fn in task_tools()]
    for tools in ([SqlBoxEnv().open_box, SqlBoxEnv().submit], [BoxGameEnv().open_box, BoxGameEnv().submit],
                  [trl_agents.open_box, trl_agents.submit]):
        assert [get_json_schema(fn) for fn in tools] == expected


def test_rayward_trains_on_a_dataset_with_only_an_environment_column(routed_run):
    history, ours = routed_run
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    assert sorted(set(ours.groups)) == ["game", "sql"] and len(ours.of("sql")) == len(ours.of("game"))
    for prompt in ours.prompts:  # reset's text is the whole user message (TRL appends it to an empty one)
        assert len(prompt) == 1 and prompt[0]["role"] == "user" and QUESTION.match(prompt[0]["content"]), prompt
    assert all(h["multiturn/stop_reason/env_error"] == 0 for h in history)  # every reset() ran


@pytest.mark.parametrize("group", ["sql", "game", "own"])
def test_tools_answer_in_rayward_as_often_as_in_trl(group, request):
    """Per pattern, the share of tool calls that answered without error. rayward answers a call it cannot parse
    with an error message of its own (TRL leaves it as text and ends the episode): those are left out, so both
    shares are over the calls each trainer ran."""
    from actors.agents.chat import MALFORMED_CALL_NAME

    rayward_side, trl_side = ("routed_run", "trl_routed") if group != "own" else ("own_data_run", "trl_own_data")
    _, ours = request.getfixturevalue(rayward_side)
    _, theirs = request.getfixturevalue(trl_side)
    ok, calls = ours.answered(group, skip=MALFORMED_CALL_NAME)
    trl_ok, trl_calls = theirs.answered(group)
    print(f"{group}: rayward {ok}/{calls} answered, TRL {trl_ok}/{trl_calls}")
    assert calls >= MIN_CALLS and trl_calls >= MIN_CALLS
    assert ok / calls >= MOST and trl_ok / trl_calls >= MOST
    assert abs(ok / calls - trl_ok / trl_calls) <= TOLERANCE


@pytest.mark.parametrize("side", ["routed_run", "trl_routed"])
def test_the_reward_function_reads_each_games_own_state(side, request):
    """BoxGameEnv's moves are the calls its conversation made that answered; game_won read that instance."""
    _, sampled = request.getfixturevalue(side)
    games = sampled.of("game")
    assert games
    for i in games:
        env = sampled.environments[i]
        assert isinstance(env, BoxGameEnv)
        assert env.moves == calls_made(sampled.completions[i]), (env.moves, sampled.completions[i])
        assert sampled.rewards["game_won"][i] == float(env.won)
    assert any(sampled.environments[i].moves for i in games)  # the games were played
    assert all(no_opinion(sampled.rewards["game_won"][i]) for i in sampled.of("sql"))  # another environment's


@pytest.mark.parametrize("side", ["routed_run", "trl_routed"])
def test_the_sql_environments_reward_is_its_get_reward(side, request):
    """SqlBoxEnv's get_reward() scores its samples (read from each instance's state), and only its samples."""
    _, sampled = request.getfixturevalue(side)
    assert sampled.of("sql")
    for i in sampled.of("sql"):
        env = sampled.environments[i]
        assert sampled.rewards["SqlBoxEnv"][i] == float(env.submitted == trl_agents.lookup(env.episode, env.box))
    assert all(no_opinion(sampled.rewards["SqlBoxEnv"][i]) for i in sampled.of("game"))


@pytest.mark.parametrize("side", ["own_data_run", "trl_own_data"])
def test_an_environment_that_owns_its_data_writes_the_prompts(side, request):
    """No dataset: each prompt is a placeholder row's empty user message with reset's question appended, and reset
    received that row's one column by name."""
    _, sampled = request.getfixturevalue(side)
    assert sampled.groups and set(sampled.groups) == {"own"}
    for prompt, env in zip(sampled.prompts, sampled.environments, strict=True):
        assert prompt == [{"role": "user", "content": PROMPT_TEMPLATE.format(box=env.box)}]
        assert env.placeholder == PLACEHOLDER_PROMPT
    boxes = {env.box for env in sampled.environments}
    assert boxes <= set(range(1, NUM_BOXES + 1)) and len(boxes) > 1  # the environment draws its questions


def test_rayward_trains_without_a_dataset(own_data_run):
    history, ours = own_data_run
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    assert len(ours.prompts) == STEPS * BATCH
    assert all(h["multiturn/stop_reason/env_error"] == 0 for h in history)  # reset(prompt) took the row
    submits = [m for c in ours.completions for m in tool_messages(c) if m["name"] == "submit"]
    assert submits and all(m["content"] == "Submitted." for m in submits)  # the async standalone tool answered


def test_the_alarm_tools_own_timeout_reads_the_same_in_both(database, trl_routed):
    """One call made slow on purpose (SlowSqlBoxEnv: a query that never ends, its own alarm): the message the model
    reads, from rayward's environment worker (the class the pool runs, on this main thread as on the worker's)
    and from TRL's own tool loop."""
    from actors.envs.spec import EnvSpec
    from actors.envs.worker import EnvWorker
    from actors.types import EnvRequest, ToolCall

    worker = EnvWorker(EnvSpec(environments={None: f"{FIXTURES}:SlowSqlBoxEnv"}, tool_timeout_s=30))
    opened = worker.open([(0, EnvRequest(None, {}, seed=0))])[0]
    assert opened.error is None, opened.error
    [ours] = worker.call(0, [ToolCall("open_box", {"box": 1})])
    theirs = trl_tool_message(trl_routed[0], trl_agents.SlowSqlBoxEnv(), "open_box", {"box": 1})
    expected = str({"error": f"Operation timed out after {trl_agents.SLOW_ALARM_S} seconds"})
    assert ours.status == "error" and ours.content == expected
    assert theirs == {"role": "tool", "name": "open_box", "content": expected}


def trl_tool_message(trainer: Any, env: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The tool message TRL's own tool loop (GRPOTrainer._tool_call_loop) writes for one call in `env`: one sample
    whose first turn is that call, its environment `sql`."""
    from orchestrator.builtin.models.tools import completion_ids

    tok = trainer.processing_class
    env.reset()
    prompt = [{"role": "user", "content": PROMPT_TEMPLATE.format(box=1)}]
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}
    prompt_ids = tok.apply_chat_template(prompt, tools=[env.open_box, env.submit], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
    trainer._batch_environments = ["sql"]
    trainer._sync_tool_dicts = [{"open_box": env.open_box, "submit": env.submit}]
    trainer._async_tool_dicts = [{}]
    with pytest_alarm_kept():
        _, completions, *_ = trainer._tool_call_loop([prompt], [prompt_ids], [completion_ids(tok, call)], [[call]],
                                                     None, None, {})
    return next(m for m in completions[0] if m["role"] == "tool")
