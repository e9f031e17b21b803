"""Loading a config: YAML, dotted overrides, validation errors naming each bad field, and the reference
every field's docstring makes (docs/config.md)."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.config.base import ConfigError, _Section
from orchestrator.config.rewards import RewardConfig
from orchestrator.config.run import RunConfig


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc or '<root>'}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `key.sub=value` overrides (values parsed as YAML; list items by index: rewards.0.weight=2;
    the index one past the end appends: rewards.1={name: x, function: m:f})."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override {key!r}: its value is not YAML ({str(err).splitlines()[0]}); quote a "
                              f"string that starts with {{, [ or a quote: {key}=\"'{raw}'\"") from None
        node: Any = tree
        parts = key.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) > len(node):
                    raise ConfigError(f"override {key!r}: {'.'.join(parts[:i]) or '<root>'} has no item {part!r}")
                if int(part) == len(node):  # one past the end appends (e.g. add a reward from the CLI)
                    node.append(value if last else {})
                    node = node if last else node[-1]
                    continue
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"override {key!r}: {'.'.join(parts[:i])} is a value, not a section")
    return tree


def parse_config(tree: dict[str, Any]) -> RunConfig:
    """Validate a config mapping; raises ConfigError naming each bad field."""
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (or start from defaults when path is None) and apply dotted overrides."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{p}: not valid YAML: {err}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return parse_config(apply_overrides(tree, list(overrides or [])))


def config_reference(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted field, default, docstring) for every field: docs/config.md is generated from it."""
    rows = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        sub = ann if isinstance(ann, type) and issubclass(ann, _Section) else None
        if sub is not None:
            rows.extend(config_reference(sub, f"{prefix}{name}."))
            continue
        union = typing.get_origin(ann) in (typing.Union, types.UnionType)
        optional = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, _Section)] if union else []
        if optional:  # an optional section (`eval`): its own row (off by default), then its fields
            rows.append((f"{prefix}{name}", repr(field.get_default()), (field.description or "").replace("\n", " ")))
            rows.extend(config_reference(optional[0], f"{prefix}{name}."))
            continue
        if name == "rewards" and model is RunConfig:
            rows.append((f"{prefix}rewards", repr(field.get_default()), (field.description or "").replace("\n", " ")))
            rows.extend(config_reference(RewardConfig, f"{prefix}rewards[]."))
            continue
        default = "(required)" if field.is_required() else repr(field.get_default(call_default_factory=True))
        rows.append((f"{prefix}{name}", default, (field.description or "").replace("\n", " ")))
    return rows
