"""Chat-template pieces of an agentic rollout, token in / token out: the first prompt's ids, the ids of the tool
results between two model turns, the model's tool calls read from the ids it sampled, tool results cut to a
token budget, and the checks that the ids trained on are what the chat template renders.

A trajectory's ids are built by appending, never by re-rendering (TRL's tool loop does the same):

    ids(turn 0)   = render_prompt(prompt + reset's text, tools)                    the chat template, once
    ids(turn t+1) = ids(turn t) + sampled ids of turn t + tool_suffix_ids(its tool messages)

so the learner trains on exactly the ids the engine sampled, in exactly the context it sampled them in. The
suffix is TRL's `_get_tool_suffix_ids`: a dummy conversation rendered with and without the tool messages, cut
after the assistant turn's end-of-turn token (the model samples `<|im_end|>`; the `\\n` a ChatML template writes
after it belongs to the suffix). `template_check` renders a whole conversation through the template and
compares its special-token boundaries with the ids trained on.

Plain functions of a Hugging Face tokenizer (transformers 5: `apply_chat_template`, `parse_response` with the
tokenizer's `response_template`, which TRL's `add_response_schema` installs for the chat templates it knows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from actors.types import Sample, ToolCall

# Appended to a tool result cut to the tool-token budget, so the model can tell a cut result from a short one.
TRUNCATION_MARK = " [truncated]"
# The name of the tool message that answers a call the model wrote but that could not be read (it has no name;
# the dummy conversation of `tool_suffix_ids` needs one).
MALFORMED_CALL_NAME = "invalid_tool_call"


def prompt_messages(messages: list[dict[str, Any]], observation: str | None) -> list[dict[str, Any]]:
    """The first prompt's messages: reset's text appended to the content of the last message, as TRL does (a
    new list; the row's messages are left as they are)."""
    if not observation:
        return list(messages)
    last = messages[-1]
    return [*messages[:-1], {**last, "content": last["content"] + observation}]


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
    """The ids of the first prompt: the messages, the tool schemas, the generation prompt."""
    return _render(tokenizer, messages, tools, add_generation_prompt=True)


def tool_suffix_ids(tokenizer: Any, tool_messages: list[dict[str, Any]]) -> list[int]:
    """The ids that follow an assistant turn's end-of-turn token: its tool messages as the template renders
    them, through the next generation prompt (TRL's `_get_tool_suffix_ids`; the dummy call carries the first
    tool's name, as some templates name the tool in the response header).

    A template that renders the assistant turn differently once tool messages follow it (not prefix-preserving,
    see `extension_note`) gets the suffix after the same count of end-of-turn tokens (NeMo-RL's splice): the
    ids stay what the model sampled, and `template_check` measures how far they are from a full rendering."""
    prefix_messages = _dummy_call(tool_messages[0].get("name") or MALFORMED_CALL_NAME)
    prefix = _render(tokenizer, prefix_messages, [], add_generation_prompt=False)
    full = _render(tokenizer, prefix_messages + tool_messages, [], add_generation_prompt=True)
    eos = tokenizer.eos_token_id
    ends = [i for i, t in enumerate(prefix) if t == eos]
    cut = ends[-1] + 1 if ends else len(prefix)
    if full[:cut] == prefix[:cut]:
        return full[cut:]
    full_ends = [i for i, t in enumerate(full) if t == eos]
    if not ends or len(full_ends) < len(ends):
        raise ValueError("tool_suffix_ids: the chat template renders the assistant turn differently once tool "
                         "messages follow, and no end-of-turn token marks where it ends")
    return full[full_ends[len(ends) - 1] + 1 :]


def extension_note(tokenizer: Any) -> str | None:
    """None if the chat template can be extended turn by turn (TRL's is_chat_template_prefix_preserving: the
    assistant turn renders the same with or without the tool messages after it); otherwise what is wrong, for
    the run's start-up notes. Such a template still trains on exactly the sampled ids (`tool_suffix_ids`), but
    they drift from the template's own rendering: `template_check` measures it."""
    prefix_messages = _dummy_call("dummy")
    prefix = _render(tokenizer, prefix_messages, [], add_generation_prompt=False)
    full = _render(tokenizer, [*prefix_messages, {"role": "tool", "name": "dummy", "content": "dummy"}], [],
                   add_generation_prompt=True)
    if full[: len(prefix)] == prefix:
        return None
    return ("the chat template is not prefix-preserving (an assistant turn renders differently once tool messages "
            "follow it): rollouts append the tool results after the sampled ids, so training ids drift from the "
            "template's rendering of the conversation (metric multiturn/template_mismatch_frac); TRL's "
            "get_training_chat_template has a prefix-preserving template for known model families")


@dataclass
class Turn:
    """One model turn as the model wrote it."""

    message: dict[str, Any]  # the assistant message (TRL's completions entry): content, tool_calls
    calls: list[ToolCall]  # the well-formed calls, in order
    malformed: str | None = None  # the turn writes a tool call that cannot be read: why (the model is told)


def parse_turn(tokenizer: Any, ids: list[int], prefix: list[int], tools: list[dict[str, Any]]) -> Turn:
    """The model's message and tool calls, read from the ids it sampled as its family writes them: the
    tokenizer's `response_template` (transformers' `parse_response`, as TRL's tool loop reads calls), arguments
    typed by the tools' schemas. prefix: the prompt the turn was sampled after (a template may pre-write part
    of the turn). A turn that cannot be parsed is plain text, and `malformed` if it opens a tool call."""
    if getattr(tokenizer, "response_template", None) is None:
        raise ValueError("parse_turn: the tokenizer has no response_template (TRL's add_response_schema installs "
                         "one for the chat templates it knows)")
    try:
        parsed = tokenizer.parse_response(ids, prefix=prefix, tools=tools or None)
        if not isinstance(parsed, dict):
            raise ValueError("the response parser returned nothing")
        message, calls = _normalized(tokenizer, parsed)
    except (ValueError, TypeError) as err:  # bad JSON raises ValueError (json's included)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return Turn({"role": "assistant", "content": text}, [], why if _opens_call(tokenizer, text) else None)
    return Turn(message, calls)


def malformed_result(why: str) -> dict[str, Any]:
    """The tool message that answers an unreadable call (TRL's form for a failed tool: {"error": ...})."""
    return {"role": "tool", "name": MALFORMED_CALL_NAME, "content": str({"error": f"Malformed tool call: {why}"})}


@dataclass
class FittedResults:
    messages: list[dict[str, Any]]  # the tool messages, contents cut where needed
    suffix_ids: list[int]  # their `tool_suffix_ids`, at most the budget
    truncated: int  # messages whose content was cut


def fit_tool_results(tokenizer: Any, messages: list[dict[str, Any]], budget: int) -> FittedResults | None:
    """The tool messages with their suffix ids within `budget` tokens: the longest content cut first (to the
    token, TRUNCATION_MARK appended), re-rendered until the suffix fits. None if even the template's scaffold
    around empty results does not fit."""
    messages = [dict(m) for m in messages]
    truncated: set[int] = set()
    mark = len(_ids(tokenizer, TRUNCATION_MARK))
    # Each round cuts the longest content by what the last rendering is over; a cut that re-tokenizes longer at
    # its seam is cut again in the next round.
    for _ in range(_FIT_ROUNDS_PER_MESSAGE * len(messages)):
        suffix = tool_suffix_ids(tokenizer, messages)
        over = len(suffix) - budget
        if over <= 0:
            return FittedResults(messages, suffix, len(truncated))
        bodies = [_ids(tokenizer, _body(m, i in truncated)) for i, m in enumerate(messages)]
        i = max(range(len(messages)), key=lambda k: len(bodies[k]))
        if not bodies[i]:
            return None  # only the scaffold and marks left, still over
        keep = max(len(bodies[i]) - over - (0 if i in truncated else mark), 0)
        messages[i]["content"] = tokenizer.decode(bodies[i][:keep]) + TRUNCATION_MARK
        truncated.add(i)
    return None


# Rounds of fit_tool_results per message: one cut normally fits; a seam that re-tokenizes longer needs another.
_FIT_ROUNDS_PER_MESSAGE = 8


def _body(message: dict[str, Any], marked: bool) -> str:
    content = str(message["content"])
    return content.removesuffix(TRUNCATION_MARK) if marked else content


# --- the ids against the template ---------------------------------------------------------------------------


@dataclass
class TemplateCheck:
    """A trajectory's ids (prompt + completion) against the chat template's rendering of its conversation.
    Boundaries are the tokenizer's added tokens (`<|im_start|>`, `<|im_end|>`, `<tool_call>`, ...): the
    structure the model reads. Text between two boundaries may differ (a tool call re-rendered from its parsed
    arguments, BPE merges at a seam): content drift, counted, not a mismatch."""

    match: bool  # the boundaries agree (a cut last turn may lack its end-of-turn token)
    position: int | None  # the first boundary (index among them) where they differ
    boundaries: int  # in the ids trained on
    rendered: int  # in the template's rendering
    drifted_segments: int  # segments between matching boundaries whose text differs


def template_check(
    tokenizer: Any, prompt: list[dict[str, Any]], messages: list[dict[str, Any]], tools: list[dict[str, Any]],
    ids: list[int],
) -> TemplateCheck:
    """Render `prompt + messages` (with the tools; a generation prompt after trailing tool messages, as the ids
    then end with one) and compare its boundaries with those of `ids`. A last model turn cut before its
    end-of-turn token (length) may lack that one boundary."""
    ends_with_tool = bool(messages) and messages[-1]["role"] == "tool"
    rendered = _render(tokenizer, prompt + messages, tools, add_generation_prompt=ends_with_tool or not messages)
    added = set(tokenizer.added_tokens_decoder)
    ours, theirs = _segments(ids, added), _segments(rendered, added)
    b_ours = [b for b, _ in ours]
    b_theirs = [b for b, _ in theirs]
    position = next((i for i, (a, b) in enumerate(zip(b_ours, b_theirs, strict=False)) if a != b), None)
    cut_last_turn = not ends_with_tool and bool(ids) and ids[-1] != tokenizer.eos_token_id
    extra = len(b_theirs) - len(b_ours)
    if position is None and not 0 <= extra <= int(cut_last_turn):
        position = min(len(b_ours), len(b_theirs))
    drift = sum(
        tokenizer.decode(a) != tokenizer.decode(b)
        for (_, a), (_, b) in zip(ours, theirs, strict=False)
    )
    return TemplateCheck(position is None, position, len(b_ours), len(b_theirs), drift)


def check_sample(tokenizer: Any, sample: Sample, tools: list[dict[str, Any]]) -> TemplateCheck:
    """`template_check` of an agentic sample (its trajectory's prompt, messages and ids)."""
    t = sample.trajectory
    if t is None:
        raise ValueError("check_sample: not an agentic sample (no trajectory)")
    return template_check(tokenizer, t.prompt, t.messages, tools, t.prompt_ids + sample.completion_ids)


# --- helpers ------------------------------------------------------------------------------------------------


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, add_generation_prompt: bool
) -> list[int]:
    # tools or None: an empty list makes some templates (Llama 3) write their tool boilerplate (as TRL passes it).
    return list(tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False,
    ))


def _dummy_call(name: str) -> list[dict[str, Any]]:
    # "content": "" as TRL writes it (some processors need the key).
    return [
        {"role": "user", "content": "dummy"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                              "function": {"name": name, "arguments": {}}}]},
    ]


def _normalized(tokenizer: Any, parsed: dict[str, Any]) -> tuple[dict[str, Any], list[ToolCall]]:
    """TRL's clean-up of a parsed message (content a string without a trailing EOS) and its calls checked:
    each has a string name and arguments that are a JSON object (a string is decoded)."""
    message = dict(parsed)
    content = message.get("content")
    message["content"] = content.removesuffix(tokenizer.eos_token) if isinstance(content, str) else ""
    message.setdefault("role", "assistant")
    calls = []
    for k, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tool call {k} has no name")
        arguments = fn.get("arguments")
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError(f"tool call {k} ({fn['name']}): arguments are not an object")
        fn["arguments"] = arguments
        calls.append(ToolCall(fn["name"], arguments))
    if not calls:
        message.pop("tool_calls", None)
    return message, calls


def _opens_call(tokenizer: Any, text: str) -> bool:
    """Whether `text` opens a tool call as the response template writes one."""
    import re

    spec = tokenizer.response_template.get("fields", {}).get("tool_calls", {})
    if "open" in spec:
        return spec["open"] in text
    if "open_pattern" in spec:
        return re.search(spec["open_pattern"], text) is not None
    return False


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _segments(ids: list[int], boundaries: set[int]) -> list[tuple[int | None, list[int]]]:
    """ids cut at boundary tokens: (the boundary before it, or None at the start; the ids up to the next)."""
    out: list[tuple[int | None, list[int]]] = [(None, [])]
    for t in ids:
        if t in boundaries:
            out.append((t, []))
        else:
            out[-1][1].append(t)
    return out if out[0][1] else out[1:]
