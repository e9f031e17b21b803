"""The OpenAI chat-completions protocol as the agent endpoint speaks it (actors/agents/endpoint.py).

Plain functions and records, no server: a request body checked and its messages converted to the chat
template's form (`parse_request`), the response written as OpenAI writes it (`completion`, `chunks` for a
streamed one, `sse`), and errors as OpenAI's error body (`ApiError.body`).

What is served is OpenAI's documented API for one model, with the sampling the trainer assumes: a parameter
that would make the engine sample differently from what the learner trains (another temperature, penalties, a
seed of the agent's), or that is not served (several choices, log-probs, structured output), is refused with
OpenAI's error body naming it, never silently dropped. Accepted:

    model               the served name (/v1/models); another is `model_not_found` (404)
    messages            system/developer, user, assistant (content, tool_calls), tool (tool_call_id, content);
                        text content parts are joined; an image or audio part is refused (a text model)
    tools, tool_choice  function tools; tool_choice "auto" (the default) only: the engine does not constrain
                        decoding, so "none", "required" or a named function cannot be honoured
    temperature, top_p  omitted, or the run's own (generation.temperature, generation.top_p)
    max_tokens, max_completion_tokens   at most this many tokens this turn (the trajectory's budgets bound it too)
    n                   1
    stop                up to 4 strings: the turn stops after one (the ids trained are the ids sampled, the
                        string included; the content returned ends before it, as OpenAI's)
    stream, stream_options.include_usage
    parallel_tool_calls, user, metadata, store, service_tier   accepted, no effect here
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from actors.types import ToolCall

# Requests' parameters served as the module docstring says.
ACCEPTED = frozenset({
    "model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "n", "stop", "stream", "stream_options", "parallel_tool_calls", "user", "metadata", "store", "service_tier",
})
# Parameters of OpenAI's API that are refused, and why (the error's message).
REFUSED = {
    "seed": "rayward seeds every turn itself: the trajectories of a GRPO group must differ, and a resumed run "
            "draws the same tokens",
    "logprobs": "log-probabilities are not served (the trainer keeps the sampled tokens' own)",
    "top_logprobs": "log-probabilities are not served (the trainer keeps the sampled tokens' own)",
    "frequency_penalty": "a penalty changes the distribution the engine samples from, which the trainer assumes "
                         "is the policy's",
    "presence_penalty": "a penalty changes the distribution the engine samples from, which the trainer assumes "
                        "is the policy's",
    "logit_bias": "a logit bias changes the distribution the engine samples from, which the trainer assumes is "
                  "the policy's",
    "response_format": "structured output (constrained decoding) is not served",
    "functions": "the deprecated function-calling API is not served: use tools",
    "function_call": "the deprecated function-calling API is not served: use tool_choice",
    "modalities": "text is the only modality served",
    "audio": "text is the only modality served",
    "prediction": "predicted outputs are not served",
    "reasoning_effort": "reasoning effort is not served (the chat template's settings are the run's: "
                        "generation.chat_template_kwargs)",
    "web_search_options": "web search is not served",
}
# OpenAI's limit on stop sequences per request.
MAX_STOP = 4
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """A request the endpoint refuses: an HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Served:
    """What the endpoint serves: the model's name and the run's sampling (requests may repeat it, not change it)."""

    model: str
    temperature: float
    top_p: float = 1.0


@dataclass
class ChatRequest:
    """A checked chat-completions request, its messages and tools in the chat template's form."""

    messages: list[dict[str, Any]]  # roles system/user/assistant/tool; assistant tool_calls' arguments as dicts;
    # tool messages carry the `name` of the call they answer
    tools: list[dict[str, Any]] = field(default_factory=list)  # {"type": "function", "function": {...}}
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def parse_request(body: Any, served: Served) -> ChatRequest:
    """The request body checked against the module docstring's rules; ApiError naming the parameter otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key in body:
        if key in REFUSED and body[key] is not None:
            raise ApiError(400, f"{key} is not supported by this endpoint: {REFUSED[key]}", param=key,
                           code="unsupported_parameter")
        if key not in ACCEPTED and key not in REFUSED:
            raise ApiError(400, f"Unrecognized request argument supplied: {key}", param=key,
                           code="unsupported_parameter")
    model = body.get("model")
    if model != served.model:
        raise ApiError(404, f"The model `{model}` does not exist or you do not have access to it (this endpoint "
                            f"serves {served.model!r}).", param="model", code="model_not_found")
    for key, run_value in (("temperature", served.temperature), ("top_p", served.top_p)):
        value = body.get(key)
        if value is not None and (not isinstance(value, int | float) or not math.isclose(value, run_value)):
            raise ApiError(400, f"{key} {value!r} is not the run's ({run_value:g}): the trainer assumes every "
                                f"token was sampled at the run's {key} (give it, or leave it out)", param=key,
                           code="unsupported_value")
    if body.get("n") not in (None, 1):
        raise ApiError(400, f"n {body.get('n')!r}: one choice per request is served (the trajectories of a group "
                            "are the GRPO samples)", param="n", code="unsupported_value")
    choice = body.get("tool_choice")
    if choice not in (None, "auto"):
        raise ApiError(400, f"tool_choice {choice!r}: only \"auto\" is served (decoding is not constrained, so a "
                            "required, forbidden or named tool cannot be honoured)", param="tool_choice",
                       code="unsupported_value")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    return ChatRequest(
        messages=convert_messages(body.get("messages")),
        tools=_tools(body.get("tools")),
        max_tokens=_max_tokens(body),
        stop=_stop(body.get("stop")),
        stream=bool(body.get("stream")),
        include_usage=bool((stream_options or {}).get("include_usage")) and bool(body.get("stream")),
    )


def convert_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI's messages in the chat template's form: developer -> system; text parts joined; an assistant's
    tool calls with their arguments decoded to an object; a tool message named after the call it answers (its
    tool_call_id among the earlier assistant messages' calls). Fields the template does not read are dropped."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty array", param="messages")
    names: dict[str, str] = {}  # tool call id -> its function's name
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"{where}: a message is an object whose role is one of {list(ROLES)}",
                           param=f"{where}.role")
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _content(m.get("content"), f"{where}.content",
                                                                  optional=role == "assistant")}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(m["tool_calls"])]
            names.update({c["id"]: c["function"]["name"] for c in msg["tool_calls"] if c.get("id")})
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ApiError(400, f"{where}: a tool message needs the tool_call_id of the call it answers",
                               param=f"{where}.tool_call_id")
            if call_id not in names:
                raise ApiError(400, f"{where}: tool_call_id {call_id!r} answers no tool call of an earlier "
                                    "assistant message", param=f"{where}.tool_call_id")
            msg.update(tool_call_id=call_id, name=names[call_id])
        out.append(msg)
    return out


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What two messages in the template's form must share to be the same turn: role, text, tool calls (name and
    arguments), the call a tool message answers. Reasoning fields and call ids are left out (an agent may drop
    the first; the second is the endpoint's own)."""
    calls = tuple((c["function"]["name"], json.dumps(c["function"].get("arguments") or {}, sort_keys=True))
                  for c in message.get("tool_calls") or ())
    return message["role"], message.get("content") or "", calls, message.get("name") if message["role"] == "tool" \
        else None


def call_id(request: int, k: int) -> str:
    """The id of call k of a trajectory's request `request` (unique within the trajectory, as OpenAI's are)."""
    return f"call_{request}_{k}"


def template_calls(calls: list[ToolCall], request: int) -> list[dict[str, Any]]:
    """A turn's calls in the template's form (arguments an object), with the ids the response gives them."""
    return [{"id": call_id(request, k), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for k, c in enumerate(calls)]


def response_message(content: str, calls: list[dict[str, Any]], reasoning: str | None = None) -> dict[str, Any]:
    """The assistant message as OpenAI returns it: content null when the turn only calls tools; each call's
    arguments a JSON string."""
    msg: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}} for c in calls]
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(cid: str, model: str, message: dict[str, Any], finish_reason: str, used: dict[str, int],
               created: int | None = None) -> dict[str, Any]:
    """A `chat.completion` object with one choice."""
    return {"id": cid, "object": "chat.completion", "created": created or int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": used}


def chunks(cid: str, model: str, message: dict[str, Any], finish_reason: str, used: dict[str, int] | None,
           created: int | None = None) -> list[dict[str, Any]]:
    """The same answer as `chat.completion.chunk` objects, as OpenAI streams it: the role and content, the tool
    calls (whole, each with its index), the finish reason, and the usage (stream_options.include_usage)."""
    base = {"id": cid, "object": "chat.completion.chunk", "created": created or int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    first: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("reasoning_content"):
        first["reasoning_content"] = message["reasoning_content"]
    out = [chunk(first)]
    if message.get("tool_calls"):
        out.append(chunk({"tool_calls": [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]}))
    out.append(chunk({}, finish_reason))
    if used is not None:
        out.append({**base, "choices": [], "usage": used})
    return out


def sse(events: list[dict[str, Any]]) -> bytes:
    """Server-sent events: each object a `data:` line, then `data: [DONE]`."""
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def models(model: str) -> dict[str, Any]:
    """/v1/models: the one model served."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "rayward"}]}


# --- helpers ------------------------------------------------------------------------------------------------


def _content(content: Any, where: str, *, optional: bool) -> str:
    if content is None:
        if optional:
            return ""
        raise ApiError(400, f"{where}: content is required", param=where)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: content is a string or an array of content parts", param=where)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal":
            continue
        else:
            raise ApiError(400, f"{where}[{k}]: content part of type {kind!r} is not served (a text model: text "
                                "parts only)", param=f"{where}[{k}].type", code="unsupported_value")
    return "".join(texts)


def _call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, f"{where}: a tool call is {{id, type: function, function: {{name, arguments}}}}",
                       param=where)
    arguments = fn.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise ApiError(400, f"{where}.function.arguments is not valid JSON: {err}",
                           param=f"{where}.function.arguments") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ApiError(400, f"{where}.function.arguments must encode a JSON object",
                       param=f"{where}.function.arguments")
    out = {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be an array", param="tools")
    out = []
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"tools[{k}]: a tool is {{type: function, function: {{name, description, "
                                "parameters}}}} (function tools only)", param=f"tools[{k}]")
        # `strict` asks for constrained decoding, which is not served; the template reads the rest.
        out.append({"type": "function", "function": {k2: v for k2, v in fn.items() if k2 != "strict"}})
    return out


def _max_tokens(body: dict[str, Any]) -> int | None:
    values = []
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ApiError(400, f"{key} must be an integer >= 1, not {v!r}", param=key)
        values.append(v)
    return min(values, default=None)


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise ApiError(400, f"stop is a string or an array of up to {MAX_STOP} non-empty strings", param="stop")
    return list(stops)


__all__ = ["ApiError", "ChatRequest", "Served", "parse_request", "convert_messages", "message_key", "completion",
           "chunks", "sse", "models", "response_message", "template_calls", "usage"]
