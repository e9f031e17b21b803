"""chat.py on the tiny tool model's real tokenizer, against TRL 1.16's own pieces where TRL has them: the tool
suffix (TRL's `_get_tool_suffix_ids` dummy-conversation diff), parse_response, the prefix-preserving check;
tool-result truncation; and the structural check of trained ids against the template's full rendering."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest
from trl.chat_template_utils import (
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
    qwen3_template,
)

from actors.agents import chat
from orchestrator.builtin.models.tools import completion_ids, episode_ids, episode_messages, task_tools
from orchestrator.builtin.models.tools import tool_suffix_ids as trl_style_suffix
from orchestrator.builtin.tasks.boxes import boxes_dataset
from tests.fixtures.envs import ToolTestEnv, tool_schemas


@pytest.fixture(scope="module")
def schemas():
    from transformers.utils import get_json_schema

    return [get_json_schema(f) for f in task_tools()]


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def call_text(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


def trl_template(name: str) -> str:
    return resources.files("trl").joinpath(f"chat_templates/{name}.jinja").read_text(encoding="utf-8")


def test_a_stock_template_without_a_response_template_is_prepared_as_trl_prepares_it(tool_tokenizer, schemas):
    """The issue: TRL's qwen2_5.jinja and no response template in the tokenizer's files. parse_turn cannot read
    the model's call until the tokenizer is prepared; then it has the one TRL's add_response_schema sets."""
    tok = copy.deepcopy(tool_tokenizer)
    tok.response_template = None
    prompt = chat.render_prompt(tok, [{"role": "user", "content": "Open box 2."}], schemas)
    sampled = ids(tok, call_text("open_box", box=2))
    with pytest.raises(ValueError, match="no response_template: prepare it for a tool run first"):
        chat.parse_turn(tok, sampled, prompt, schemas)
    template = tok.chat_template
    assert chat.prepare_tokenizer(tok) is tok
    assert tok.response_template == qwen3_template and tok.chat_template == template  # prefix-preserving: kept
    assert [c.name for c in chat.parse_turn(tok, sampled, prompt, schemas).calls] == ["open_box"]
    assert chat.template_family(tok) == "qwen2_5"
    chat.prepare_tokenizer(tok)  # idempotent
    assert tok.response_template == qwen3_template and tok.chat_template == template


def test_a_template_that_is_not_prefix_preserving_gets_trls_training_template(tool_tokenizer):
    tok = copy.deepcopy(tool_tokenizer)
    tok.response_template, tok.chat_template = None, trl_template("qwen3")
    assert not is_chat_template_prefix_preserving(tok)
    training = get_training_chat_template(tok)
    chat.prepare_tokenizer(tok)
    assert tok.chat_template == training and tok.response_template == qwen3_template
    assert is_chat_template_prefix_preserving(tok) and chat.extension_note(tok) is None
    assert chat.template_family(tok) == "qwen3"  # a training template goes under its family's name
    chat.prepare_tokenizer(tok)
    assert tok.chat_template == training


def test_the_engines_tokenizer_renders_with_the_template_installed_after_vllm_copied_it(tool_tokenizer):
    """vLLM's engine tokenizer renders on copies of itself made when it was loaded (its thread pool): chat.py passes
    the prepared template to every render, as TRL passes its training template."""
    hf = pytest.importorskip("vllm.tokenizers.hf")
    tok = copy.deepcopy(tool_tokenizer)
    tok.response_template, tok.chat_template = None, trl_template("qwen3")
    plain = chat.prepare_tokenizer(copy.deepcopy(tok))
    engine = chat.prepare_tokenizer(hf.maybe_make_thread_pool(tok, copies=2))
    assert engine.chat_template == plain.chat_template and engine.response_template == plain.response_template
    messages = [*chat._dummy_call("f"), {"role": "tool", "name": "f", "content": "r"}]
    assert engine.apply_chat_template(messages, tokenize=False) != plain.apply_chat_template(messages, tokenize=False)
    assert chat._render(engine, messages, [], add_generation_prompt=True) == \
        chat._render(plain, messages, [], add_generation_prompt=True)
    assert chat.tool_suffix_ids(engine, messages[-1:]) == chat.tool_suffix_ids(plain, messages[-1:])
    assert chat.extension_note(engine) is None
    assert chat.prepare_tokenizer(engine).chat_template == plain.chat_template  # idempotent there too


def test_a_template_trl_cannot_run_a_tool_loop_with_is_refused_naming_what_is_missing(tool_tokenizer):
    tok = copy.deepcopy(tool_tokenizer)
    tok.response_template, tok.chat_template = None, trl_template("deepseekv3")  # renders calls; TRL cannot read them
    with pytest.raises(chat.ChatTemplateError, match="has no response template") as err:
        chat.prepare_tokenizer(tok)
    assert "TRL's add_response_schema has none for TRL's deepseekv3 template" in str(err.value)
    assert "qwen2_5, qwen3" in str(err.value) and "deepseekv3," not in str(err.value)
    tok.chat_template = tool_tokenizer.chat_template + "{#- edited -#}"  # not TRL's text
    assert chat.template_family(tok) is None
    with pytest.raises(chat.ChatTemplateError, match="has none for this template"):
        chat.prepare_tokenizer(tok)
    tok.response_template = qwen3_template  # the tokenizer's files set one: used as it is
    assert chat.prepare_tokenizer(tok).response_template == qwen3_template
    tok.chat_template = trl_template("phi3")  # drops calls and results
    with pytest.raises(chat.ChatTemplateError, match="cannot render tool calls .it drops the tool call.s name"):
        chat.prepare_tokenizer(tok)


def test_the_first_prompt_appends_resets_text_to_the_last_message_and_renders_the_tools(tool_tokenizer, schemas):
    row = [{"role": "system", "content": "S"}, {"role": "user", "content": "Open box 2."}]
    messages = chat.prompt_messages(row, " The boxes are red.")
    assert messages[-1] == {"role": "user", "content": "Open box 2. The boxes are red."}
    assert row[-1]["content"] == "Open box 2."  # the row is left as it was
    assert chat.prompt_messages(row, None) == row
    prompt = chat.render_prompt(tool_tokenizer, messages, schemas)
    assert prompt == tool_tokenizer.apply_chat_template(messages, tools=task_tools(), add_generation_prompt=True,
                                                        tokenize=True, return_dict=False)
    text = tool_tokenizer.decode(prompt)
    assert '"name": "open_box"' in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("results", [
    [{"role": "tool", "name": "open_box", "content": "583"}],
    [{"role": "tool", "name": "open_box", "content": "583"}, {"role": "tool", "name": "submit", "content": "ok"}],
])
def test_the_tool_suffix_is_trls_and_starts_after_the_end_of_turn_token(tool_tokenizer, results):
    suffix = chat.tool_suffix_ids(tool_tokenizer, results)
    assert suffix == trl_style_suffix(tool_tokenizer, results)
    text = tool_tokenizer.decode(suffix)
    assert text.startswith("\n<|im_start|>user\n<tool_response>") and text.endswith("<|im_start|>assistant\n")
    assert all(m["content"] in text for m in results)


def test_the_qwen_template_extends_and_a_rewriting_one_is_named_and_spliced_at_its_eos(tool_tokenizer):
    assert chat.extension_note(tool_tokenizer) is None
    assert is_chat_template_prefix_preserving(tool_tokenizer)
    rewriting = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'assistant' and loop.last %}LAST{% endif %}{{ m.content }}<|im_end|>\n{% endfor -%}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
    )
    original = tool_tokenizer.chat_template
    tool_tokenizer.chat_template = rewriting
    try:
        assert not is_chat_template_prefix_preserving(tool_tokenizer)
        assert "not prefix-preserving" in chat.extension_note(tool_tokenizer)
        suffix = chat.tool_suffix_ids(tool_tokenizer, [{"role": "tool", "name": "f", "content": "r"}])
        assert tool_tokenizer.decode(suffix) == "\n<|im_start|>toolr<|im_end|>\n<|im_start|>assistant\n"
    finally:
        tool_tokenizer.chat_template = original


def test_a_call_is_parsed_as_trl_parses_it_with_arguments_typed_by_the_schema(tool_tokenizer, schemas):
    prompt = chat.render_prompt(tool_tokenizer, [{"role": "user", "content": "Open box 2."}], schemas)
    sampled = ids(tool_tokenizer, call_text("open_box", box="2"))
    turn = chat.parse_turn(tool_tokenizer, sampled, prompt, schemas)
    assert turn.message == parse_response(tool_tokenizer, sampled, prefix=prompt, tools=schemas)
    assert [(c.name, c.arguments) for c in turn.calls] == [("open_box", {"box": 2})]
    assert turn.malformed is None
    two = ids(tool_tokenizer, call_text("open_box", box=1)[: -len("<|im_end|>")] + "\n" + call_text("submit", code=5))
    assert [c.name for c in chat.parse_turn(tool_tokenizer, two, prompt, schemas).calls] == ["open_box", "submit"]
    answer = chat.parse_turn(tool_tokenizer, ids(tool_tokenizer, "Done.<|im_end|>"), prompt, schemas)
    assert answer.message == {"role": "assistant", "content": "Done."} and not answer.calls and not answer.malformed


def test_an_unreadable_call_is_malformed_and_plain_text_is_not(tool_tokenizer, schemas):
    prompt = chat.render_prompt(tool_tokenizer, [{"role": "user", "content": "Open box 2."}], schemas)
    bad = ids(tool_tokenizer, '<tool_call>\n{"name": "open_box", "arguments": {"box": 2}\n</tool_call><|im_end|>')
    turn = chat.parse_turn(tool_tokenizer, bad, prompt, schemas)
    assert turn.calls == [] and "JSON" in turn.malformed
    assert turn.message == parse_response(tool_tokenizer, bad, prefix=prompt, tools=schemas)  # TRL's fallback
    nameless = ids(tool_tokenizer, '<tool_call>\n{"arguments": {}}\n</tool_call><|im_end|>')
    assert "no name" in chat.parse_turn(tool_tokenizer, nameless, prompt, schemas).malformed
    cut = ids(tool_tokenizer, "The code is")  # a turn cut by max_tokens
    assert chat.parse_turn(tool_tokenizer, cut, prompt, schemas).malformed is None
    error = chat.malformed_result("bad JSON")
    assert error["role"] == "tool" and "Malformed tool call: bad JSON" in error["content"]
    assert chat.tool_suffix_ids(tool_tokenizer, [error])  # the template renders it


def test_tool_results_are_cut_to_the_budget_longest_first(tool_tokenizer):
    results = [{"role": "tool", "name": "huge", "content": "word " * 400},
               {"role": "tool", "name": "echo", "content": "short"}]
    whole = chat.fit_tool_results(tool_tokenizer, results, 10_000)
    assert whole.truncated == 0 and whole.messages == results
    for budget in (40, 100, 250):
        fitted = chat.fit_tool_results(tool_tokenizer, results, budget)
        assert fitted.truncated == 1 and len(fitted.suffix_ids) <= budget
        assert fitted.suffix_ids == chat.tool_suffix_ids(tool_tokenizer, fitted.messages)
        assert fitted.messages[0]["content"].endswith(chat.TRUNCATION_MARK)
        assert fitted.messages[1] == results[1]
        assert len(fitted.suffix_ids) >= budget - 8  # cut to the budget, not far below it
    assert chat.fit_tool_results(tool_tokenizer, results, 12) is None  # not even the scaffold fits
    assert results[0]["content"] == "word " * 400  # the caller's messages are left as they were


def test_a_result_of_megabytes_is_cut_by_characters_before_it_is_tokenized_to_the_same_result(tool_tokenizer):
    class Spy:
        """The tokenizer, noting the longest text it is given (to tokenize, or in a message to render)."""

        longest = 0

        def __getattr__(self, name):
            return getattr(tool_tokenizer, name)

        def __call__(self, text, **kw):
            Spy.longest = max(Spy.longest, len(text))
            return tool_tokenizer(text, **kw)

        def apply_chat_template(self, messages, **kw):
            Spy.longest = max(Spy.longest, *(len(str(m.get("content", ""))) for m in messages))
            return tool_tokenizer.apply_chat_template(messages, **kw)

    def fit(tokenizer, words: int, budget: int):
        return chat.fit_tool_results(tokenizer, [{"role": "tool", "name": "huge", "content": "word " * words}], budget)

    for budget in (60, 150):
        assert len("word " * 400) < budget * chat.MAX_CHARS_PER_TOKEN < len("word " * 200_000)
        Spy.longest = 0
        huge, cut = fit(Spy(), 200_000, budget), fit(tool_tokenizer, 400, budget)
        assert huge.messages == cut.messages and huge.suffix_ids == cut.suffix_ids and huge.truncated == 1
        assert Spy.longest <= budget * chat.MAX_CHARS_PER_TOKEN + len(chat.TRUNCATION_MARK)

def test_an_episode_built_token_by_token_matches_the_template_at_every_boundary(tool_tokenizer, schemas):
    row = boxes_dataset(size=1, seed=3)[0]
    messages = episode_messages(row, 2)
    trained, _ = episode_ids(tool_tokenizer, row["prompt"], messages, task_tools())
    check = chat.template_check(tool_tokenizer, row["prompt"], messages, schemas, trained)
    assert check.match and check.position is None and check.boundaries == check.rendered > 10
    # Ending after tool results: the ids end with the next generation prompt.
    first_round = messages[:2]
    after_tools, _ = episode_ids(tool_tokenizer, row["prompt"], first_round, task_tools())
    assert chat.template_check(tool_tokenizer, row["prompt"], first_round, schemas, after_tools).match
    # A last turn cut before its end-of-turn token may lack that one boundary.
    cut = trained[:-3]
    assert cut[-1] != tool_tokenizer.eos_token_id
    assert chat.template_check(tool_tokenizer, row["prompt"], messages, schemas, cut).match


def test_boundary_drift_is_a_mismatch_and_content_drift_is_not(tool_tokenizer, schemas):
    row = boxes_dataset(size=1, seed=4)[0]
    messages = episode_messages(row, 1)
    trained, _ = episode_ids(tool_tokenizer, row["prompt"], messages, task_tools())
    im_start = tool_tokenizer.convert_tokens_to_ids("<|im_start|>")
    last_start = len(trained) - 1 - trained[::-1].index(im_start)
    dropped = trained[:last_start] + trained[last_start + 1:]  # a separator the template writes, missing
    check = chat.template_check(tool_tokenizer, row["prompt"], messages, schemas, dropped)
    assert not check.match and check.position is not None
    # The model wrote the call with other spacing than the template renders it: content drift only.
    spaced = [dict(m) for m in messages]
    first_call = completion_ids(tool_tokenizer, messages[0])
    respaced = ids(tool_tokenizer, tool_tokenizer.decode(first_call).replace('", "', '","'))
    assert respaced != first_call
    start = trained.index(first_call[0], len(chat.render_prompt(tool_tokenizer, row["prompt"], schemas)))
    drifted = trained[:start] + respaced + trained[start + len(first_call):]
    check = chat.template_check(tool_tokenizer, row["prompt"], spaced, schemas, drifted)
    assert check.match and check.drifted_segments >= 1


def test_every_tool_of_the_test_environment_has_a_schema():
    assert sorted(s["function"]["name"] for s in tool_schemas(ToolTestEnv)) == [
        "after_held", "boom", "die", "echo", "gated_echo", "hang", "huge"]
