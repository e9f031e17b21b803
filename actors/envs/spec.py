"""What an environment worker runs, and the user's tools and environment classes read the way TRL 1.16 reads them.

TRL's API, unchanged (`GRPOTrainer(tools=..., environment_factory=...)`):

* a **tool** is a plain function, sync or `async def`, whose type hints and Google-style docstring are the schema
  the model sees (transformers' `get_json_schema`);
* an **environment** is what `environment_factory()` returns: any callable taking no argument (a class, a
  function, a `functools.partial`, ...) that returns an instance with a `reset` method. `reset(**row)` starts an
  episode from the dataset row's columns and may return text appended to the last user message; every public
  function on the instance's class (not `reset`, not `get_reward`, not starting with `_`: TRL's
  `inspect.getmembers(type(instance), inspect.isfunction)` rule) is a tool; an optional `get_reward()` (sync or
  async) is a reward named after the class;
* `environment_factory` may be a mapping name -> factory, the dataset's `environment` column choosing per row;
  only that environment's tools (with the standalone ones first) are rendered into the row's prompt.

**The class behind a factory.** TRL calls every factory once at start (its probe) and reads the tools from the
class of what it returned. rayward reads a class as it is, without creating an instance (its `__init__` may
need what only the environment workers' nodes have), and calls any other factory once, as TRL does, to learn its
class (`environment_class`): the driver before Ray starts, to check it and render the tools' schemas (that
instance is then dropped). A factory that raises or returns something without `reset` is named there. The
workers call the factory themselves when they need an instance (actors/envs/worker.py) and read the tools from
`type(instance)`, as TRL does per rollout.

Plain Python, no Ray: the driver reads the same things here before anything starts (orchestrator/run/agents.py)
that the workers read (actors/envs/worker.py).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
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
    environments: environment_factory name -> `module:factory` (a class or any callable returning an
    environment); a single factory is `{None: "module:Class"}`, a run with tools only has none (its sessions hold
    the tools and no environment instance).
    """

    tools: tuple[str, ...] = ()
    environments: dict[str | None, str] = field(default_factory=dict)
    tool_timeout_s: float = 60.0  # each tool call, and each session's factory + reset
    reward_timeout_s: float = 60.0  # each get_reward() at close (the environment reward's `timeout_s`)
    agent_function: str | None = None  # `module:function` (agent_function): the workers run it, one call per
    # trajectory, instead of environment sessions (actors/agents/agent_worker.py); no tools or environments then

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
        raise EnvSpecError(f"{what} {user_code.describe(target)} is not callable")
    return fn


def factory_field(name: str | None) -> str:
    """The config field that names environment `name`'s factory, as messages give it."""
    return "environment_factory" if name is None else f"environment_factory[{name}]"


def factory_name(factory: Any) -> str:
    """How messages name a factory: a class or function by its name, a functools.partial by what it wraps."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    return getattr(factory, "__name__", type(factory).__name__)


def has_reset(cls: type) -> bool:
    return callable(getattr(cls, RESET, None))


def load_factory(target: str, what: str) -> Callable[[], Any]:
    """environment_factory's `target`, imported: a callable; a class is checked for `reset` (TRL's check), without
    creating an instance."""
    factory = import_object(target, what)
    if not callable(factory):
        raise EnvSpecError(
            f"{what} {user_code.describe(target)} is a {type(factory).__name__}, not callable: environment_factory "
            "names a class or a function (any callable) that returns an environment"
        )
    if isinstance(factory, type) and not has_reset(factory):
        raise EnvSpecError(
            f"{what} {user_code.describe(target)}: class {factory.__name__} has no `reset` method (TRL calls "
            "reset(**row) at the start of every rollout; it may return text appended to the last user message, or None)"
        )
    return factory


def environment_class(target: str, what: str) -> type:
    """The class of the environments `target`'s factory makes: a class is itself; any other factory is called once
    (TRL's probe at start) and the class of what it returned is checked for `reset`. EnvSpecError naming `what`
    when it cannot be imported, raises or returns something without `reset`."""
    factory = load_factory(target, what)
    if isinstance(factory, type):
        return factory
    try:
        instance = factory()
    except Exception as err:  # noqa: BLE001 - the user's factory: its error is theirs to read, with the field named
        raise EnvSpecError(
            f"{what} {user_code.describe(target)}: calling it raised {type(err).__name__}: {err} (rayward calls a "
            "factory that is not a class once before anything starts, as TRL does, to read the environment's tools "
            "from the class of what it returns)"
        ) from None
    cls = type(instance)
    if not has_reset(cls):
        raise EnvSpecError(
            f"{what} {user_code.describe(target)} returned a {cls.__name__}, which has no `reset` method (TRL calls "
            "reset(**row) at the start of every rollout; it may return text appended to the last user message, or None)"
        )
    return cls


def environment_classes(spec: EnvSpec) -> dict[str | None, type]:
    """environment_factory name -> the class of its environments (environment_class: each factory called at most
    once)."""
    return {name: environment_class(target, factory_field(name)) for name, target in spec.environments.items()}


def tool_method_names(cls: type) -> list[str]:
    """The class's tools, in TRL's order: its public functions (inherited ones too) but reset and get_reward."""
    return [
        name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in (RESET, GET_REWARD) and not name.startswith("_")
    ]


class _Unbound:
    """What a method is bound to for its schema: no instance of the user's class is kept for it."""


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


def tool_schemas(
    spec: EnvSpec, classes: dict[str | None, type] | None = None
) -> dict[str | None, list[dict[str, Any]]]:
    """Per environment name (None: the only environment, or a run with tools only): the schemas of the tools a
    row of that environment sees, the standalone tools first, then the class's methods (TRL's order). classes:
    environment_classes(spec), if the caller has it already (a factory is not called twice). EnvSpecError naming
    the tool or method that has no schema, or a name two tools share."""
    standalone = [(f"tools[{i}] {user_code.describe(t)}", load_tool(t, f"tools[{i}]"))
                  for i, t in enumerate(spec.tools)]
    classes = environment_classes(spec) if classes is None else classes
    envs = spec.environments or {None: None}
    out: dict[str | None, list[dict[str, Any]]] = {}
    for name, target in envs.items():
        tools = list(standalone)
        if target is not None:
            where, cls = factory_field(name), classes[name]
            tools += [(f"{where} {user_code.describe(target)}: method {cls.__name__}.{m}", schema_target(cls, m))
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


def reward_classes(
    spec: EnvSpec, classes: dict[str | None, type] | None = None
) -> dict[str, list[str | None]]:
    """The environment classes with a get_reward(), by class name (the reward's name, as TRL names it), each with
    the environment_factory names that use it (a class under two names is one reward, as in TRL). classes: as for
    tool_schemas."""
    out: dict[str, list[str | None]] = {}
    seen: dict[str, type] = {}
    classes = environment_classes(spec) if classes is None else classes
    for name in spec.environments:
        cls = classes[name]
        if not callable(getattr(cls, GET_REWARD, None)):
            continue
        if seen.setdefault(cls.__name__, cls) is not cls:
            raise EnvSpecError(
                f"environment_factory: two different classes are named {cls.__name__!r} "
                f"({seen[cls.__name__].__module__} and {cls.__module__}); their get_reward() rewards would share a name"
            )
        out.setdefault(cls.__name__, []).append(name)
    return out


__all__ = [
    "EnvSpec", "EnvSpecError", "environment_class", "environment_classes", "factory_field", "factory_name",
    "has_reset", "import_object", "load_factory", "load_tool", "reward_classes", "schema_target", "tool_method_names",
    "tool_schema", "tool_schemas",
]
