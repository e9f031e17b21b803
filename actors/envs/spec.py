"""What an environment worker runs, and the user's tools and environment classes read the way TRL 1.16 reads them.

TRL's API, unchanged (`GRPOTrainer(tools=..., environment_factory=...)`):

* a **tool** is a plain function, sync or `async def`, whose type hints and Google-style docstring are the schema
  the model sees (transformers' `get_json_schema`);
* an **environment** is a class: `reset(**row)` starts an episode from the dataset row's columns and may return
  text appended to the last user message; every public function on the class (not `reset`, not `get_reward`,
  not starting with `_`: TRL's `inspect.getmembers(cls, inspect.isfunction)` rule) is a tool; an optional
  `get_reward()` (sync or async) is a reward named after the class;
* `environment_factory` may be a mapping name -> class, the dataset's `environment` column choosing per row;
  only that environment's tools (with the standalone ones first) are rendered into the row's prompt.

Plain Python, no Ray: the driver reads the same things here before anything starts (orchestrator/environments.py)
that the workers read when they start (actors/envs/worker.py).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Any

from actors import user_code

# The methods of an environment class that are not tools (TRL's names).
RESET, GET_REWARD = "reset", "get_reward"


class EnvSpecError(ValueError):
    """A tool or environment class that cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class EnvSpec:
    """What an environment worker needs (plain data: it crosses Ray pickled).

    tools: the standalone tools, `module:function` (or `path/to/file.py:function`), TRL's `tools=`.
    environments: environment_factory name -> `module:Class`; a single factory is `{None: "module:Class"}`, a run
    with tools only has none (its sessions hold the tools and no environment instance).
    """

    tools: tuple[str, ...] = ()
    environments: dict[str | None, str] = field(default_factory=dict)
    tool_timeout_s: float = 60.0  # each tool call, and each session's factory + reset
    reward_timeout_s: float = 60.0  # each get_reward() at close (the environment reward's `timeout_s`)

    @property
    def routed(self) -> bool:
        """Whether environment_factory is a mapping (the dataset's `environment` column picks per row)."""
        return any(name is not None for name in self.environments)


def import_object(target: str, what: str) -> Any:
    """`module:attr` or `path/to/file.py:attr`, imported; EnvSpecError names `what` (e.g. "tools[0]")."""
    try:
        return user_code.import_object(target, what)
    except user_code.UserCodeError as err:
        raise EnvSpecError(str(err)) from None


def load_tool(target: str, what: str) -> Any:
    fn = import_object(target, what)
    if not callable(fn):
        raise EnvSpecError(f"{what} {target!r} is not callable")
    return fn


def load_environment(target: str, what: str) -> type:
    """An environment class, checked as TRL checks it (a `reset` method)."""
    cls = import_object(target, what)
    if not isinstance(cls, type):
        raise EnvSpecError(
            f"{what} {target!r} is a {type(cls).__name__}, not a class: rayward reads an environment's tools from "
            "its class, without creating one"
        )
    if not callable(getattr(cls, RESET, None)):
        raise EnvSpecError(
            f"{what} {target!r}: class {cls.__name__} has no `reset` method (TRL calls reset(**row) at the start of "
            "every rollout; it may return text appended to the last user message, or None)"
        )
    return cls


def tool_method_names(cls: type) -> list[str]:
    """The class's tools, in TRL's order: its public functions (inherited ones too) but reset and get_reward."""
    return [
        name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in (RESET, GET_REWARD) and not name.startswith("_")
    ]


class _Unbound:
    """What a method is bound to for its schema: the user's class is never instantiated before a worker starts."""


def schema_target(cls: type, name: str) -> Any:
    """The callable whose signature is the tool's, without an instance: a method bound to a placeholder (the
    signature drops `self`, whatever it is called), a static method as it is."""
    fn = getattr(cls, name)
    if isinstance(inspect.getattr_static(cls, name), staticmethod):
        return fn
    return types.MethodType(fn, _Unbound())


def tool_schema(fn: Any, what: str) -> dict[str, Any]:
    """The JSON schema the chat template renders ({"type": "function", "function": {...}}), from the type hints
    and the Google-style docstring, by transformers' get_json_schema (what TRL and apply_chat_template use)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as err:  # noqa: BLE001 - transformers' own message says which hint or description is missing
        raise EnvSpecError(
            f"{what}: no tool schema ({type(err).__name__}: {err}). A tool needs a type hint on every argument and a "
            "Google-style docstring with a description and an `Args:` entry per argument"
        ) from None


def tool_schemas(spec: EnvSpec) -> dict[str | None, list[dict[str, Any]]]:
    """Per environment name (None: the only environment, or a run with tools only): the schemas of the tools a
    row of that environment sees, the standalone tools first, then the class's methods (TRL's order).
    EnvSpecError naming the tool or method that has no schema, or a name two tools share."""
    standalone = [(f"tools[{i}] {t!r}", load_tool(t, f"tools[{i}]")) for i, t in enumerate(spec.tools)]
    envs = spec.environments or {None: None}
    out: dict[str | None, list[dict[str, Any]]] = {}
    for name, target in envs.items():
        tools = list(standalone)
        if target is not None:
            where = f"environment_factory[{name}]" if name is not None else "environment_factory"
            cls = load_environment(target, where)
            tools += [(f"{where} {target!r}: method {cls.__name__}.{m}", schema_target(cls, m))
                      for m in tool_method_names(cls)]
        schemas, seen = [], {}
        for what, fn in tools:
            s = tool_schema(fn, what)
            tool_name = s["function"]["name"]
            if tool_name in seen:
                raise EnvSpecError(f"{what}: the tool name {tool_name!r} is taken by {seen[tool_name]}; the model "
                                   "calls tools by name, so each must be unique")
            seen[tool_name] = what
            schemas.append(s)
        out[name] = schemas
    return out


def reward_classes(spec: EnvSpec) -> dict[str, list[str | None]]:
    """The environment classes with a get_reward(), by class name (the reward's name, as TRL names it), each with
    the environment_factory names that use it (a class under two names is one reward, as in TRL)."""
    out: dict[str, list[str | None]] = {}
    seen: dict[str, type] = {}
    for name, target in spec.environments.items():
        cls = load_environment(target, "environment_factory")
        if not callable(getattr(cls, GET_REWARD, None)):
            continue
        if seen.setdefault(cls.__name__, cls) is not cls:
            raise EnvSpecError(
                f"environment_factory: two different classes are named {cls.__name__!r} ({seen[cls.__name__].__module__}"
                f" and {cls.__module__}); their get_reward() rewards would share a name"
            )
        out.setdefault(cls.__name__, []).append(name)
    return out


__all__ = [
    "EnvSpec", "EnvSpecError", "import_object", "load_environment", "load_tool",
    "reward_classes", "schema_target", "tool_method_names", "tool_schema", "tool_schemas",
]
