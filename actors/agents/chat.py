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
tokenizer's `response_template`) that `prepare_tokenizer` has set up for a tool run as TRL's GRPOTrainer sets up
its processing class: the response template TRL's `add_response_schema` knows for the chat template, TRL's
training template where the model's own is not prefix-preserving. Both the driver (its checks, before Ray
starts) and every generator (its engine's tokenizer) prepare theirs, so they render and parse alike.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.types import Sample, ToolCall

# Appended to a tool result cut to the tool-token budget, so the model can tell a cut result from a short one.
TRUNCATION_MARK = " [truncated]"
# The name of the tool message that answers a call the model wrote but that could not be read (it has no name;
# the dummy conversation of `tool_suffix_ids` needs one).
MALFORMED_CALL_NAME = "invalid_tool_call"


# --- the tokenizer for a tool run ---------------------------------------------------------------------------


class ChatTemplateError(ValueError):
    """The chat template cannot run a tool loop. The message says what is missing; it reads after "its chat
    template " (`orchestrator.run.agents.check_tool_template` names the model and the template before it)."""


# Where a tokenizer keeps the run's chat-template keyword arguments (generation.chat_template_kwargs, TRL's
# chat_template_kwargs), which every render here passes, as TRL passes them to every render of its tool loop.
TEMPLATE_KWARGS_ATTR = "rayward_chat_template_kwargs"


def template_kwargs(tokenizer: Any) -> dict[str, Any]:
    """The chat-template keyword arguments renders of this tokenizer pass ({} unless `prepare_tokenizer` set any)."""
    return dict(getattr(tokenizer, TEMPLATE_KWARGS_ATTR, None) or {})


def prepare_tokenizer(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> Any:
    """What TRL's GRPOTrainer does to its processing class for a tool run (`tools` or `environment_factory`), in
    its order, in place; the tokenizer is returned. Idempotent. chat_template_kwargs (TRL's): passed by every
    render here from now on.

    1. The chat template must render a tool exchange (TRL's `supports_tool_calling`; `tool_template_problem`
       says what it drops).
    2. A tokenizer without a `response_template` gets the one TRL's `add_response_schema` has for its chat
       template (TRL matches the template's exact text). The tool calls are read with it (`parse_turn`); a legacy
       `response_schema` alone is not read by transformers 5's `parse_response`.
    3. A template that is not prefix-preserving (TRL's `is_chat_template_prefix_preserving`) is replaced by the
       training template TRL has for its family (`get_training_chat_template`): TRL passes it as `chat_template=`
       to every render of its tool loop; here it becomes the tokenizer's template, which chat.py passes to
       every render alike (`_render`).

    Raises ChatTemplateError for 1 and 2, where TRL's trainer raises too. A template that is not
    prefix-preserving and that TRL has no training template for is kept (TRL's trainer refuses it): rollouts
    still train on the sampled ids, and `extension_note` says what that costs."""
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
    )

    setattr(tokenizer, TEMPLATE_KWARGS_ATTR, dict(chat_template_kwargs or {}))
    problem = tool_template_problem(tokenizer)
    if problem is not None:
        raise ChatTemplateError(f"cannot render tool calls ({problem}); `tools` and `environment_factory` need one "
                                "that renders user -> assistant with tool_calls -> tool")
    if getattr(tokenizer, "response_template", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError:
            pass  # an unknown template: named below
        if getattr(tokenizer, "response_template", None) is None:
            raise ChatTemplateError(_no_response_template(tokenizer))
    if isinstance(tokenizer.chat_template, str) and tokenizer.chat_template in _training_templates():
        return tokenizer  # prepared already (TRL's checks render with an engine tokenizer's own copies: see _render)
    if not is_chat_template_prefix_preserving(tokenizer):
        try:
            tokenizer.chat_template = get_training_chat_template(tokenizer) or tokenizer.chat_template
        except ValueError:
            pass  # no training template for it: kept, with extension_note's note
    return tokenizer


def template_family(tokenizer: Any) -> str | None:
    """The name of the tokenizer's chat template among those TRL ships (`trl/chat_templates/<name>.jinja`; a
    training template under its family's name), or None."""
    return _trl_templates().get(tokenizer.chat_template) if isinstance(tokenizer.chat_template, str) else None


def tool_template_problem(tokenizer: Any) -> str | None:
    """Why the tokenizer's chat template cannot render a tool-calling conversation (TRL's criterion,
    `supports_tool_calling`: user -> assistant with tool_calls -> tool, every part visible in the text), or None
    if it can."""
    from trl.chat_template_utils import supports_tool_calling

    if getattr(tokenizer, "chat_template", None) is None:
        return "the tokenizer has no chat template"
    if supports_tool_calling(tokenizer):
        return None
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": _NAME, "arguments": {_ARG_KEY: _ARG_VALUE}}}]},
        {"role": "tool", "name": _NAME, "content": _CONTENT},
    ]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as err:  # noqa: BLE001 - the template's own error says what it rejects
        return f"rendering user -> assistant with tool_calls -> tool raises {type(err).__name__}: {err}"
    missing = [what for sentinel, what in _PARTS if sentinel not in rendered]
    return f"it drops {', '.join(missing)}" if missing else "TRL's supports_tool_calling rejects it"


# TRL's supports_tool_calling sentinels (trl/chat_template_utils.py): each part of a tool exchange must survive.
_NAME, _ARG_KEY, _ARG_VALUE, _CONTENT = "tool_name_a8f3e2b1", "tool_arg_key_b9d4f5c2", "tool_arg_val_d6e7a9f3", \
    "tool_content_c4f9a8e2"
_PARTS = (
    (_NAME, "the tool call's name (the assistant message's tool_calls)"),
    (_ARG_KEY, "the tool call's argument names"),
    (_ARG_VALUE, "the tool call's argument values"),
    (_CONTENT, "the tool result (a message of role 'tool')"),
)
_TRAINING_SUFFIX = "_training"


@functools.cache
def _trl_templates() -> dict[str, str]:
    """The text of every chat template TRL ships -> its family's name (the file's stem, `_training` dropped)."""
    from importlib import resources

    files = resources.files("trl").joinpath("chat_templates")
    return {
        f.read_text(encoding="utf-8"): f.name.removesuffix(".jinja").removesuffix(_TRAINING_SUFFIX)
        for f in sorted(files.iterdir(), key=lambda f: f.name) if f.name.endswith(".jinja")
    }


@functools.cache
def _training_templates() -> frozenset[str]:
    from importlib import resources

    files = resources.files("trl").joinpath("chat_templates")
    return frozenset(f.read_text(encoding="utf-8") for f in files.iterdir()
                     if f.name.endswith(f"{_TRAINING_SUFFIX}.jinja"))


@functools.cache
def _families_with_response_templates() -> list[str]:
    """The TRL templates `add_response_schema` has a response template for (it matches the template's text), a
    family's revisions (`gemma4_v2`, ...) under its name."""
    from types import SimpleNamespace

    from trl.chat_template_utils import add_response_schema

    known = set()
    for text, family in _trl_templates().items():
        holder = SimpleNamespace(chat_template=text, response_template=None)
        try:
            add_response_schema(holder)
        except ValueError:
            continue
        if holder.response_template is not None:
            known.add(re.sub(r"_v\d+$", "", family))
    return sorted(known)


def _no_response_template(tokenizer: Any) -> str:
    family = template_family(tokenizer)
    which = f"TRL's {family} template" if family else "this template"
    return (f"has no response template to read the model's tool calls with: the tokenizer's files set no "
            f"`response_template`, and TRL's add_response_schema has none for {which} (it has them for TRL's "
            f"{', '.join(_families_with_response_templates())} templates, matched by their exact text); add a "
            f"`response_template` to the tokenizer's files (transformers' chat response parsing), or use a model "
            f"whose template TRL knows")


def prompt_messages(messages: list[dict[str, Any]], observation: str | None) -> list[dict[str, Any]]:
    """The first prompt's messages: reset's text appended to the content of the last message, as TRL does (a
    new list; the row's messages are left as they are). Content parts (a prompt with images) get it as a text
    part at their end."""
    if not observation:
        return list(messages)
    last = messages[-1]
    content = last["content"]
    content = [*content, {"type": "text", "text": observation}] if isinstance(content, list) else content + observation
    return [*messages[:-1], {**last, "content": content}]


def message_images(messages: list[dict[str, Any]]) -> list[Any]:
    """The images the messages' content parts hold, in order (TRL's `{"type": "image", "image": PIL}` parts): the
    order a chat template writes their placeholders in."""
    return [part["image"] for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if isinstance(part, dict) and part.get("type") == "image"]


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
    name = tool_messages[0].get("name") or MALFORMED_CALL_NAME
    prefix_messages = _dummy_call(name)
    prefix = _dummy_prefix(tokenizer, name)
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


def tool_images_problem(tokenizer: Any, image_token_id: int) -> str | None:
    """Why the chat template cannot show the model an image a tool returned (TRL's multimodal tool responses: a
    tool message whose content parts hold an image), or None when it renders that image as one placeholder."""
    messages = [*_dummy_call("look"), {"role": "tool", "name": "look", "content": [
        {"type": "image", "image": None}, {"type": "text", "text": "dummy"}]}]
    try:
        rendered = _render(tokenizer, messages, [], add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 - the template's own error says what it rejects
        return f"its chat template cannot render a tool message with an image part ({type(err).__name__}: {err})"
    found = rendered.count(image_token_id)
    if found == 1:
        return None
    return (f"its chat template renders a tool message's image part as {found} image placeholders, not one "
            "(it drops images in tool messages)")


def extension_note(tokenizer: Any) -> str | None:
    """None if the chat template can be extended turn by turn (TRL's is_chat_template_prefix_preserving: the
    assistant turn renders the same with or without the tool messages after it); otherwise what is wrong, for
    the run's start-up notes. Such a template still trains on exactly the sampled ids (`tool_suffix_ids`), but
    they drift from the template's own rendering: `template_check` measures it. After `prepare_tokenizer`, only
    a template TRL has no training template for is left so."""
    prefix_messages = _dummy_call("dummy")
    prefix = _render(tokenizer, prefix_messages, [], add_generation_prompt=False)
    full = _render(tokenizer, [*prefix_messages, {"role": "tool", "name": "dummy", "content": "dummy"}], [],
                   add_generation_prompt=True)
    if full[: len(prefix)] == prefix:
        return None
    return ("the chat template is not prefix-preserving (an assistant turn renders differently once tool messages "
            "follow it): rollouts append the tool results after the sampled ids, so training ids drift from the "
            "template's rendering of the conversation (metric multiturn/template_mismatch_frac); TRL has no "
            "prefix-preserving training template for it (get_training_chat_template), and its trainer refuses it")


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
        raise ValueError("parse_turn: the tokenizer has no response_template: prepare it for a tool run first "
                         "(prepare_tokenizer, as TRL's trainer does)")
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
    suffix_ids: list[int]  # their `tool_suffix_ids`, at most the budget (images' placeholders expanded)
    truncated: int  # messages whose content was cut
    images: list[Any] = field(default_factory=list)  # the images their content parts hold, in order


# ids with one placeholder per image, the images -> the ids with each placeholder expanded to its image's vision
# tokens (actors/vision.py Images.expand): what a vision-language model reads.
Expand = Callable[[list[int], list[Any]], list[int]]


def fit_tool_results(tokenizer: Any, messages: list[dict[str, Any]], budget: int,
                     expand: Expand | None = None) -> FittedResults | None:
    """The tool messages with their suffix ids within `budget` tokens: the longest text cut first (to the token,
    TRUNCATION_MARK appended), re-rendered until the suffix fits. None if even the template's scaffold around empty
    results (and their images) does not fit: an image is never cut. expand: for results with images (TRL's
    multimodal tool responses), how their placeholders become the model's ids; their vision tokens count."""
    messages = [dict(m) for m in messages]
    images = message_images(messages)
    if images and expand is None:
        raise ValueError("fit_tool_results: tool results with images need `expand` (a vision-language model)")
    truncated: set[int] = set()
    # A result longer than the whole budget could hold is cut by characters first, so a many-megabyte result is
    # not tokenized whole (and again each round); the token cut below still decides where it ends.
    longest = max(budget, 0) * MAX_CHARS_PER_TOKEN
    for i, m in enumerate(messages):
        if len(_text(m)) > longest:
            messages[i] = _with_text(m, _text(m)[:longest] + TRUNCATION_MARK)
            truncated.add(i)
    mark = len(_ids(tokenizer, TRUNCATION_MARK))
    # Each round cuts the longest content by what the last rendering is over; a cut that re-tokenizes longer at
    # its seam is cut again in the next round.
    for _ in range(_FIT_ROUNDS_PER_MESSAGE * len(messages)):
        suffix = tool_suffix_ids(tokenizer, messages)
        if images:
            assert expand is not None
            suffix = expand(suffix, images)
        over = len(suffix) - budget
        if over <= 0:
            return FittedResults(messages, suffix, len(truncated), images)
        bodies = [_ids(tokenizer, _body(m, i in truncated)) for i, m in enumerate(messages)]
        i = max(range(len(messages)), key=lambda k: len(bodies[k]))
        if not bodies[i]:
            return None  # only the scaffold, images and marks left, still over
        keep = max(len(bodies[i]) - over - (0 if i in truncated else mark), 0)
        messages[i] = _with_text(messages[i], tokenizer.decode(bodies[i][:keep]) + TRUNCATION_MARK)
        truncated.add(i)
    return None


# Characters per token beyond any tokenizer's longest common token: a result over budget x this many characters
# is cut by characters before it is tokenized (what is kept still holds more than the budget's tokens).
MAX_CHARS_PER_TOKEN = 64
# Rounds of fit_tool_results per message: one cut normally fits; a seam that re-tokenizes longer needs another.
_FIT_ROUNDS_PER_MESSAGE = 8


def _text(message: dict[str, Any]) -> str:
    """A message's text: its content, or its content parts' text joined."""
    content = message["content"]
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def _with_text(message: dict[str, Any], text: str) -> dict[str, Any]:
    """The message with its text replaced: the content, or (content parts) the first text part, the other text
    parts dropped and the images kept where they are."""
    content = message["content"]
    if not isinstance(content, list):
        return {**message, "content": text}
    parts, placed = [], False
    for p in content:
        if isinstance(p, dict) and p.get("type") == "text":
            if not placed:
                parts.append({**p, "text": text})
                placed = True
        else:
            parts.append(p)
    if not placed:
        parts.append({"type": "text", "text": text})
    return {**message, "content": parts}


def _body(message: dict[str, Any], marked: bool) -> str:
    content = _text(message)
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


def check_sample(tokenizer: Any, sample: Sample, tools: list[dict[str, Any]],
                 collapse: Expand | None = None) -> TemplateCheck:
    """`template_check` of an agentic sample (its trajectory's prompt, messages and ids). collapse: for a sample
    with images, its ids' placeholder runs -> one placeholder per image, as the template writes them
    (actors/vision.py Images.collapse)."""
    t = sample.trajectory
    if t is None:
        raise ValueError("check_sample: not an agentic sample (no trajectory)")
    ids = t.prompt_ids + sample.completion_ids
    if t.images:
        if collapse is None:
            raise ValueError("check_sample: a sample with images needs `collapse` (a vision-language model)")
        ids = collapse(ids, list(t.images))
    return template_check(tokenizer, t.prompt, t.messages, tools, ids)


# --- helpers ------------------------------------------------------------------------------------------------


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, add_generation_prompt: bool
) -> list[int]:
    # tools or None: an empty list makes some templates (Llama 3) write their tool boilerplate (as TRL passes it).
    # The template is passed as TRL passes its own: vLLM's engine tokenizer renders on copies of itself made
    # when the engine loaded it, which would not see a template prepare_tokenizer installed since.
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return list(tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False,
        chat_template=template, **template_kwargs(tokenizer),
    ))


# Where a tokenizer keeps its rendered dummy calls (`_dummy_prefix`), by (chat template, its keyword arguments, the
# tool's name): the same for every result of a tool, so rendered once rather than once per tool result.
_PREFIX_CACHE_ATTR = "rayward_dummy_prefixes"


def _dummy_prefix(tokenizer: Any, name: str) -> list[int]:
    """The ids of `_dummy_call(name)` rendered without a generation prompt (tool_suffix_ids' prefix), cached on the
    tokenizer."""
    cache = getattr(tokenizer, _PREFIX_CACHE_ATTR, None)
    if cache is None:
        cache = {}
        setattr(tokenizer, _PREFIX_CACHE_ATTR, cache)
    key = (tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None,
           json.dumps(template_kwargs(tokenizer), sort_keys=True, default=str), name)
    if key not in cache:
        cache[key] = _render(tokenizer, _dummy_call(name), [], add_generation_prompt=False)
    return list(cache[key])


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
