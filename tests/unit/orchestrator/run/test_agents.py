"""Tools and environments before anything starts (orchestrator/run/agents.py, build.prepare's agentic part): the
config keys, each bad input refused in one line naming the field or function, the tool schemas per environment,
the environment rewards and `keep_state`."""

import copy

import pytest

from actors.envs.spec import tool_schemas
from orchestrator.builtin.models.tools import chat_template
from orchestrator.builtin.tasks.boxes import boxes_dataset
from orchestrator.config import ConfigError, parse_config
from orchestrator.run.agents import check_environment_rows, env_spec, prepare_agent, tool_template_problem
from orchestrator.run.build import reward_specs

F, BAD = "tests.fixtures.envs", "tests.fixtures.bad_envs"
BOXES = "orchestrator.builtin.tasks.boxes:BoxEnv"
ROWS = [{"prompt": [{"role": "user", "content": "hi"}], "start": 1}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = chat_template()  # TRL's Qwen2.5 template: renders tool calls
    return tok


def cfg(**tree):
    tree.setdefault("rewards", [{"name": "r", "function": "letter_fraction"}])
    return parse_config(tree)


def prepare(c, tokenizer, rows=ROWS, eval_rows=None):
    return prepare_agent(c, tokenizer, rows, reward_specs(c.rewards), eval_rows)


# --- config ---------------------------------------------------------------------------------------------------


def test_config_keys_and_defaults():
    c = cfg()
    assert (c.tools, c.environment_factory, c.generation.max_tool_calling_iterations) == ([], None, None)
    assert (c.agent.tool_timeout_s, c.agent.trajectory_timeout_s, c.agent.max_tool_tokens) == (60.0, 600.0, 1024)
    assert (c.cluster.num_env_workers, c.cluster.env_worker.num_cpus, c.cluster.env_autoscale) == (2, 0.25, None)
    c = cfg(tools=[f"{F}:echo"], environment_factory={"a": f"{F}:CounterEnv"},
            generation={"max_tool_calling_iterations": 3}, cluster={"env_autoscale": {"max_workers": 4}})
    assert c.environment_factory == {"a": f"{F}:CounterEnv"} and c.cluster.env_autoscale.min_workers == 1


@pytest.mark.parametrize(("tree", "message"), [
    ({"tools": ["echo"]}, "tools[0]: 'echo' is not of the form module:name"),
    ({"environment_factory": {"a": "Counter"}}, "environment_factory[a]: 'Counter' is not of the form module:name"),
    ({"environment_factory": {}}, "environment_factory: an empty mapping"),
    ({"agent": {"tool_timeout_s": 60, "trajectory_timeout_s": 30}}, "trajectory_timeout_s (30) must be above"),
    ({"cluster": {"env_autoscale": {"min_workers": 3, "max_workers": 2}}}, "min_workers (3) must not exceed"),
    ({"generation": {"max_tool_calling_iterations": -1}}, "max_tool_calling_iterations"),
])
def test_config_rejects(tree, message):
    with pytest.raises(ConfigError) as info:
        cfg(**tree)
    assert message in str(info.value)


# --- tools and environment classes --------------------------------------------------------------------------------


@pytest.mark.parametrize(("tree", "message"), [
    ({"tools": [f"{BAD}:no_docstring"]},
     "tools[0] 'tests.fixtures.bad_envs:no_docstring': no tool schema (DocstringParsingException: Cannot generate JSON "
     "schema for no_docstring because it has no docstring!)"),
    ({"tools": [f"{BAD}:no_hints"]}, "tools[0] 'tests.fixtures.bad_envs:no_hints': no tool schema "
     "(TypeHintParsingException: Argument x is missing a type hint in function no_hints)"),
    ({"tools": [f"{BAD}:undescribed_argument"]}, "no description for the argument 'y'"),
    ({"tools": [f"{BAD}:nope"]}, "tools[0] 'tests.fixtures.bad_envs:nope': module 'tests.fixtures.bad_envs' has no "
     "attribute 'nope'"),
    ({"environment_factory": "tests.fixtures.no_such_module:Env"},
     "environment_factory 'tests.fixtures.no_such_module:Env': cannot import 'tests.fixtures.no_such_module' "
     "(ModuleNotFoundError"),
    ({"environment_factory": "tests.fixtures.broken_env_module:Env"},
     "cannot import 'tests.fixtures.broken_env_module' (RuntimeError: this module does not import)"),
    ({"environment_factory": f"{BAD}:NoReset"}, "class NoReset has no `reset` method"),
    ({"environment_factory": f"{BAD}:failing_factory"},
     "environment_factory 'tests.fixtures.bad_envs:failing_factory': calling it raised RuntimeError: no sandbox "
     "available"),
    ({"environment_factory": {"a": f"{BAD}:make_no_reset"}},
     "environment_factory[a] 'tests.fixtures.bad_envs:make_no_reset' returned a NoReset, which has no `reset` method"),
    ({"environment_factory": f"{BAD}:NOT_CALLABLE"},
     "environment_factory 'tests.fixtures.bad_envs:NOT_CALLABLE' is a str, not callable"),
    ({"environment_factory": f"{BAD}:UndocumentedMethodEnv"},
     "environment_factory 'tests.fixtures.bad_envs:UndocumentedMethodEnv': method UndocumentedMethodEnv.look: no tool "
     "schema (DocstringParsingException"),
    ({"environment_factory": f"{BAD}:EchoEnv", "tools": [f"{F}:echo"]},
     "method EchoEnv.echo: the tool name 'echo' is taken by tools[0] 'tests.fixtures.envs:echo'"),
    ({"environment_factory": {"a": f"{F}:CounterEnv", "b": f"{BAD}:NoReset"}},
     "environment_factory[b] 'tests.fixtures.bad_envs:NoReset': class NoReset has no `reset` method"),
])
def test_bad_tools_and_environments_are_named(tokenizer, tree, message):
    with pytest.raises(ConfigError) as info:
        prepare(cfg(**tree), tokenizer)
    assert message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_schemas_per_environment_in_trl_order_without_an_instance(tokenizer):
    c = cfg(tools=[f"{F}:echo"], environment_factory={"count": f"{F}:CounterEnv", "boxes": BOXES})
    rows = [{**ROWS[0], "environment": "count"}, {**ROWS[0], "environment": "boxes"}]
    setup = prepare(c, tokenizer, rows)
    names = {env: [s["function"]["name"] for s in schemas] for env, schemas in setup.schemas.items()}
    assert names == {"count": ["echo", "add", "async_add", "big", "boom", "double", "hold", "own_timeout"],
                     "boxes": ["echo", "open_box", "submit"]}  # standalone first, then methods (getmembers order)
    add = setup.schemas["count"][1]["function"]
    assert add["parameters"] == {"type": "object", "properties": {"n": {"type": "integer", "description":
                                 "How much to add."}}, "required": ["n"]}  # no `self`
    assert setup.env_classes == {"count": "CounterEnv", "boxes": "BoxEnv"}
    assert setup.routed and setup.spec.tool_timeout_s == 60.0


@pytest.mark.parametrize("factory", [f"{F}:make_sql_env", f"{F}:sql_env_of_five", f"{BAD}:make_env"])
def test_a_factory_that_is_not_a_class_is_called_once_for_its_class(tokenizer, factory):
    """A function or a functools.partial, as TRL takes them: called once, its class's methods are the tools."""
    from tests.fixtures import envs

    before = envs.SqlEnv.connections
    setup = prepare(cfg(environment_factory=factory), tokenizer)
    names = [s["function"]["name"] for s in setup.schemas[None]]
    if factory.endswith("make_env"):
        assert names == ["echo"] and setup.env_classes == {None: "EchoEnv"}
    else:
        assert names == ["opened", "query", "spin"] and setup.env_classes == {None: "SqlEnv"}
        assert envs.SqlEnv.connections - before == 1 and setup.env_rewards[0].name == "SqlEnv"


def test_schemas_are_what_trl_renders_for_bound_methods():
    """The schema of a method read from the class is the one TRL's instance method gives (transformers' own)."""
    from transformers.utils import get_json_schema

    from orchestrator.builtin.tasks.boxes import BoxEnv

    ours = tool_schemas(env_spec(cfg(environment_factory=BOXES)))[None]
    env = BoxEnv()
    assert ours == [get_json_schema(env.open_box), get_json_schema(env.submit)]


def test_tools_only_run(tokenizer):
    setup = prepare(cfg(tools=[f"{F}:echo", f"{F}:async_echo"]), tokenizer)
    assert [s["function"]["name"] for s in setup.schemas[None]] == ["echo", "async_echo"]
    assert setup.spec.environments == {} and setup.env_classes == {} and setup.env_rewards == []


def test_one_turn_runs_have_no_agent_setup(tokenizer):
    assert prepare(cfg(), tokenizer) is None


# --- the chat template -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("template", "problem"), [
    ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
     "it drops the tool call's name (the assistant message's tool_calls), the tool call's argument names, the tool "
     "call's argument values"),
    ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
     "{{ m['content'] }}{% endfor %}",
     "rendering user -> assistant with tool_calls -> tool raises TemplateError: no tool role"),
    ("{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['content'] }}{% for c in m.get('tool_calls', []) %}"
     "{{ c['function']['name'] }}{{ c['function']['arguments'] | tojson }}{% endfor %}{% endif %}{% endfor %}",
     "it drops the tool result (a message of role 'tool')"),
    (None, "the tokenizer has no chat template"),
])
def test_a_template_that_cannot_render_tool_calls_is_named(tokenizer, template, problem):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    assert tool_template_problem(tok) == problem
    with pytest.raises(ConfigError, match="its chat template cannot render tool calls"):
        prepare(cfg(environment_factory=BOXES), tok)


def test_a_tool_calling_template_passes(tokenizer):
    assert tool_template_problem(tokenizer) is None
    assert prepare(cfg(environment_factory=BOXES), tokenizer).template_note is None


def test_a_template_that_rewrites_the_last_turn_passes_with_a_note(tokenizer):
    """It renders tool calls, but the last assistant turn differently (as some reasoning templates drop earlier
    thinking): rollouts still train on the sampled ids, and the run says they drift from the template. TRL knows
    no response template for it: its tokenizer files set one (TRL's Qwen3 one)."""
    from trl.chat_template_utils import qwen3_template

    tok = copy.deepcopy(tokenizer)
    tok.response_template = qwen3_template
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and loop.last %}LAST"
        "{% endif %}{{ m['content'] }}{% for c in m.get('tool_calls', []) %}<tool_call>{{ c['function']['name'] }}"
        "{{ c['function']['arguments'] | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    setup = prepare(cfg(environment_factory=BOXES), tok)
    assert "not prefix-preserving" in setup.template_note and "multiturn/template_mismatch_frac" in setup.template_note


def test_a_vlm_run_is_told_when_its_template_drops_the_images_tools_return(tokenizer):
    """A vision-language run takes tools that return images (TRL's multimodal tool responses) where its template
    renders a tool message's image part as the model's placeholder (TRL's Qwen3-VL template); one that renders tool
    calls but writes the image part as text (TRL's Qwen2.5 text template) is told at start what that means."""
    from orchestrator.builtin.models.vlm import VISION_TOKENS, tool_chat_template

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    image = tok.convert_tokens_to_ids("<|image_pad|>")
    assert prepare(cfg(environment_factory=BOXES), tok).images_note is None  # a text run: no image token to check
    setup = prepare_agent(cfg(environment_factory=BOXES), tok, ROWS, [], None, image_token_id=image)
    assert "renders a tool message's image part as 0 image placeholders" in setup.images_note
    assert "TRL's qwen2_5 chat template" in setup.images_note and "tools/failure_frequency" in setup.images_note
    tok.chat_template = tool_chat_template()
    tok.response_template = None
    assert prepare_agent(cfg(environment_factory=BOXES), tok, ROWS, [], None, image_token_id=image).images_note is None


# --- the dataset's environment column ----------------------------------------------------------------------------


def test_environment_column_is_checked_with_a_mapping_only(tokenizer):
    routed = cfg(environment_factory={"count": f"{F}:CounterEnv"})
    with pytest.raises(ConfigError, match=r"data: environment_factory is a mapping, so every row needs an "
                                          r"`environment` column naming one of \['count'\]; row 0 has none"):
        prepare(routed, tokenizer)
    rows = [{**ROWS[0], "environment": "count"}, {**ROWS[0], "environment": "maze"}]
    with pytest.raises(ConfigError, match=r"data row 1: environment 'maze' is not a key of environment_factory "
                                          r"\(have \['count'\]\)"):
        prepare(routed, tokenizer, rows)
    with pytest.raises(ConfigError, match=r"eval.data row 0: environment 'maze'"):
        check_environment_rows(routed, rows[1:], "eval.data")
    check_environment_rows(cfg(environment_factory=f"{F}:CounterEnv"), rows, "data")  # one class: column unused


# --- rewards ------------------------------------------------------------------------------------------------------


def test_environment_rewards_named_or_implicit(tokenizer):
    implicit = prepare(cfg(environment_factory=BOXES), tokenizer, boxes_dataset(4))
    assert [r.name for r in implicit.env_rewards] == ["BoxEnv"] and implicit.env_rewards[0].weight == 1.0
    (spec,) = implicit.env_reward_specs
    assert (spec.name, spec.env_reward, spec.on_error, spec.function) == ("BoxEnv", True, "fallback", None)

    c = cfg(environment_factory=BOXES, rewards=[{"name": "BoxEnv", "weight": 2.0, "fallback": -1.0, "timeout_s": 5}])
    named = prepare(c, tokenizer, boxes_dataset(4))
    assert named.env_rewards == [] and named.spec.reward_timeout_s == 5.0
    assert reward_specs(c.rewards)[0].fallback == -1.0 and reward_specs(c.rewards)[0].env_reward

    only_env = prepare(cfg(environment_factory=BOXES, rewards=[]), tokenizer, boxes_dataset(4))
    assert [r.name for r in only_env.env_rewards] == ["BoxEnv"]  # TRL: the environment may be the only reward


@pytest.mark.parametrize(("tree", "message"), [
    ({"environment_factory": BOXES, "rewards": [{"name": "Boxes"}]},
     "rewards[Boxes]: neither function nor model names an environment's get_reward(), but no environment_factory "
     "class named 'Boxes' has one (classes with get_reward: ['BoxEnv'])"),
    ({"environment_factory": BOXES, "rewards": [{"name": "BoxEnv", "function": "letter_fraction"}]},
     "rewards[BoxEnv]: BoxEnv is also the name of environment BoxEnv's get_reward() reward"),
    ({"environment_factory": f"{BAD}:NoRewardEnv", "rewards": []}, "rewards: no reward source"),
])
def test_bad_reward_sources(tokenizer, tree, message):
    with pytest.raises(ConfigError) as info:
        prepare(cfg(**tree), tokenizer)
    assert message in str(info.value)


def test_keep_state_when_a_reward_declares_environments(tokenizer):
    plain = cfg(environment_factory=f"{F}:CounterEnv")
    assert not prepare(plain, tokenizer).keep_state
    wanting = cfg(environment_factory=f"{F}:CounterEnv",
                  rewards=[{"name": "c", "function": f"{F}:env_counts"}])
    assert prepare(wanting, tokenizer).keep_state


def test_text_prompts_with_tools_are_refused_before_ray_starts(tokenizer):
    """An agentic run renders chat messages (the tools' schemas, reset()'s text); a text prompt failed at the first
    rollout, after Ray, the engines and the learner had started. A row without a prompt is an environment's to
    fill (TRL's placeholder)."""
    from orchestrator.config import DataSource
    from orchestrator.data.sources import load_rows

    c = cfg(environment_factory=BOXES)
    with pytest.raises(ConfigError, match=r"data.prompt_column 'prompt': with tools or environment_factory the "
                                          r"prompt is chat messages .* row 0 holds str"):
        prepare(c, tokenizer, load_rows(DataSource(path="toy")))
    assert prepare(c, tokenizer, [{"box": 1, "seed": 3}]) is not None


# --- agent functions (agent_function: the OpenAI-compatible endpoint) -----------------------------------------

AGENT = "orchestrator.builtin.tasks.box_agent:box_agent"


@pytest.mark.parametrize(("tree", "message"), [
    ({"agent_function": "box_agent"}, "agent_function: 'box_agent' is not of the form module:name"),
    ({"agent_function": AGENT, "tools": [f"{F}:echo"]}, "give `tools`/`environment_factory` or `agent_function`"),
    ({"agent_function": AGENT, "environment_factory": BOXES}, "not both"),
    ({"rewards": [{"name": "box_agent"}]}, "neither environment_factory nor agent_function is set"),
])
def test_agent_function_config_rejects(tree, message):
    with pytest.raises(ConfigError) as info:
        cfg(**tree)
    assert message in str(info.value)


def test_an_agent_function_is_checked_before_ray_starts_and_its_reward_named_after_it(tokenizer):
    setup = prepare(cfg(agent_function=AGENT, rewards=[]), tokenizer, boxes_dataset(4))
    assert (setup.spec.agent_function, setup.schemas, setup.env_classes) == (AGENT, {None: []}, {None: "box_agent"})
    assert [r.name for r in setup.env_rewards] == ["box_agent"] and setup.env_reward_specs[0].env_reward
    named = prepare(cfg(agent_function=AGENT, rewards=[{"name": "box_agent", "weight": 2.0}]), tokenizer)
    assert named.env_rewards == []  # weighted by `rewards`
    beside = prepare(cfg(agent_function=AGENT), tokenizer)  # a reward function too: the agent's is implicit
    assert [r.name for r in beside.env_rewards] == ["box_agent"]
    for tree, message in [
        ({"agent_function": "orchestrator.builtin.tasks.box_agent:nope"}, "agent_function"),
        ({"agent_function": "tests.fixtures.agents:no_client_agent"},
         "an agent function receives (client, row)"),
        ({"agent_function": AGENT, "rewards": [{"name": "c", "function": f"{F}:env_counts"}]},
         "declare `environments`, but an agent function has no environment instances"),
    ]:
        with pytest.raises(ConfigError) as info:
            prepare(cfg(**tree), tokenizer)
        assert message in str(info.value)
