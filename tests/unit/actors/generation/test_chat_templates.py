"""Every chat template TRL ships, against TRL's own GRPOTrainer: the installed `trl/chat_templates/*.jinja`, read at
collection time (a template a TRL upgrade adds joins by itself), each on a small tokenizer built offline with the
template's special tokens (tests/fixtures/chat_templates.py), without a response template in its files.

For each, TRL's trainer is built for a tool run (`environment_factory`) on one copy of the tokenizer, and
rayward's driver check (`check_tool_template`: chat.prepare_tokenizer) runs on another. Either both refuse, for
the same reason, rayward naming the model, the template and what is missing; or both run, and then:

* the tokenizers are prepared alike: the same response template, the same chat template (TRL's training template
  where the model's is not prefix-preserving), prefix-preserving (TRL's check);
* a tool turn is built alike: the first prompt (TRL's `_tokenize_prompts`), the model's call parsed (TRL's
  `parse_response`) back to the call rendered, the tool results' suffix ids (TRL's `_get_tool_suffix_ids`), the
  answer after them; and the ids so appended have the template's structure (`template_check`).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import pytest
from transformers.utils import get_json_schema
from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response

from actors.agents import chat
from orchestrator.config import ConfigError, parse_config
from orchestrator.run.agents import check_tool_template
from tests.fixtures.chat_templates import WeatherEnv, template_tokenizer, trl_templates, trl_trainer

pytestmark = pytest.mark.slow  # builds TRL's GRPOTrainer per template

PROMPT = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "forecast", "arguments": {"city": "Paris", "days": 3}}}]}
RESULTS = [{"role": "tool", "name": "forecast", "content": "Paris: sunny for 3 days"}]
TWO_RESULTS = [*RESULTS, {"role": "tool", "name": "forecast", "content": "Lyon: rain for 2 days"}]
ANSWER = {"role": "assistant", "content": "It will be sunny."}
# Why TRL's trainer refuses a template (its ValueError) -> what rayward's refusal says is missing.
REASONS = {
    "does not support tool calling": "its chat template cannot render tool calls (",
    "failed to add response schema": "its chat template has no response template to read the model's tool calls",
}
# The families the issue names, as TRL ships them: each must run a tool loop, in TRL and here (the matrix alone
# would pass if both refused everything).
HANDLED = ("qwen2_5", "qwen3", "qwen3_5_think", "qwen3_6", "llama3_1", "llama3_2", "gemma4", "gemma4_v5", "gptoss",
           "glm4moe", "nemotron_3_nano", "lfm2_2_5", "lfm2_v2")
REFUSED = ("llama3", "gemma3", "phi3", "phi3_5", "deepseekv3", "cohere")


@dataclass
class Case:
    ours: Any  # the tokenizer after rayward's driver check (prepared in place)
    refusal: ConfigError | None  # rayward's, if it refuses
    trainer: Any  # TRL's GRPOTrainer on its own copy of the tokenizer, or the ValueError its __init__ raised


def model_name(name: str) -> str:
    return f"tiny/{name}"


@pytest.fixture(scope="module")
def case(tool_tokenizer, tiny_model_path, tmp_path_factory):
    """name -> Case, built once per template."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)  # shared by the trainers: only __init__ runs
    out = str(tmp_path_factory.mktemp("trl"))
    cases: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in cases:
            ours = template_tokenizer(tool_tokenizer, name)
            trainer = trl_trainer(model, template_tokenizer(tool_tokenizer, name), out)
            cfg = parse_config({"model": {"name_or_path": model_name(name)}, "rewards": [],
                                "environment_factory": "tests.fixtures.chat_templates:WeatherEnv"})
            try:
                check_tool_template(cfg, ours)
                refusal = None
            except ConfigError as err:
                refusal = err
            cases[name] = Case(ours, refusal, trainer)
        return cases[name]

    return get


@pytest.mark.parametrize("name", trl_templates())
def test_every_trl_template_runs_a_tool_turn_as_trl_does_or_is_refused_as_trl_refuses_it(case, name):
    c = case(name)
    if isinstance(c.trainer, ValueError):
        assert_refused_as_trl(c, name)
    else:
        assert c.refusal is None, f"TRL runs a tool loop with it; rayward refuses: {c.refusal}"
        assert_prepared_as_trl(c)
        assert_tool_turn_as_trl(c)


def test_the_families_the_issue_names_run_and_the_others_are_refused(case):
    for name in HANDLED:
        assert case(name).refusal is None and not isinstance(case(name).trainer, ValueError), name
    for name in REFUSED:
        assert case(name).refusal is not None and isinstance(case(name).trainer, ValueError), name
    # qwen3's own template is not prefix-preserving: both swap in its training template.
    qwen3 = case("qwen3")
    assert qwen3.trainer.chat_template is not None and qwen3.ours.chat_template == qwen3.trainer.chat_template


def assert_refused_as_trl(c: Case, name: str) -> None:
    why = next((ours for theirs, ours in REASONS.items() if theirs in str(c.trainer)), None)
    assert why is not None, f"TRL refuses it for a reason rayward's check does not know: {c.trainer}"
    assert c.refusal is not None, f"TRL refuses it ({c.trainer}); rayward's check lets it through"
    message = str(c.refusal)
    assert message.startswith(f"model.name_or_path {model_name(name)!r} (TRL's {name} chat template): "), message
    assert why in message, message
    if "response template" in why:  # it names the templates TRL knows one for
        assert "qwen2_5" in message and "llama3_1" in message, message


def assert_prepared_as_trl(c: Case) -> None:
    tok = c.trainer.processing_class
    assert c.ours.response_template == tok.response_template is not None
    assert c.ours.chat_template == (c.trainer.chat_template or tok.chat_template)
    assert is_chat_template_prefix_preserving(c.ours)
    assert chat.extension_note(c.ours) is None
    assert chat.prepare_tokenizer(c.ours) is c.ours and c.ours.chat_template == (c.trainer.chat_template or
                                                                                  tok.chat_template)  # idempotent


def assert_tool_turn_as_trl(c: Case) -> None:
    ours, trainer = c.ours, c.trainer
    env = WeatherEnv()
    schemas, trl_tools = [get_json_schema(env.forecast)], [env.forecast]  # rayward passes schemas, TRL methods
    # The first prompt.
    trainer._batch_environments = [None]  # which environment each prompt of the batch uses (one, unnamed)
    prompt_ids = chat.render_prompt(ours, PROMPT, schemas)
    assert prompt_ids == trainer._tokenize_prompts([copy.deepcopy(PROMPT)])[0][0]
    # The model's call, read back as written.
    sampled = model_turn(ours, PROMPT, CALL, schemas)
    turn = chat.parse_turn(ours, sampled, prompt_ids, schemas)
    assert turn.message == parse_response(trainer._tokenizer, sampled, prefix=prompt_ids, tools=trl_tools)
    assert [(k.name, k.arguments) for k in turn.calls] == [("forecast", {"city": "Paris", "days": 3})]
    assert turn.malformed is None
    # The tool results after it.
    for results in (RESULTS, TWO_RESULTS):
        assert chat.tool_suffix_ids(ours, results) == trainer._get_tool_suffix_ids(copy.deepcopy(results))
    ids = prompt_ids + sampled + chat.tool_suffix_ids(ours, RESULTS)
    # The answer after them, and the whole conversation against the template's rendering of it.
    answer_ids = model_turn(ours, [*PROMPT, CALL, *RESULTS], ANSWER, schemas)
    answer = chat.parse_turn(ours, answer_ids, ids, schemas)
    assert answer.message == parse_response(trainer._tokenizer, answer_ids, prefix=ids, tools=trl_tools)
    assert answer.message["content"] == ANSWER["content"] and not answer.calls
    messages = [turn.message, *RESULTS, answer.message]
    check = chat.template_check(ours, PROMPT, messages, schemas, ids + answer_ids)
    assert check.match and check.boundaries > 0, (check, ours.decode(ids + answer_ids))


def model_turn(tok: Any, history: list[dict[str, Any]], message: dict[str, Any], tools: list[Any]) -> list[int]:
    """The ids a model of the family samples for `message` after `history`: the template's rendering of it after
    what the generation prompt already wrote (a thinking template's prompt opens `<think>`, which its rendering
    of the turn closes: the model writes the rest), through the last end-of-turn token if it writes one (what
    follows is the next suffix's: TRL's cut), tokenized on its own as sampled text is."""
    head = tok.apply_chat_template(history, tools=tools, add_generation_prompt=True, tokenize=False)
    text = tok.apply_chat_template([*history, message], tools=tools, tokenize=False)
    rest = text[len(os.path.commonprefix([head, text])):]
    if tok.eos_token and tok.eos_token in rest:
        rest = rest[: rest.rindex(tok.eos_token) + len(tok.eos_token)]
    return tok(rest, add_special_tokens=False)["input_ids"]
