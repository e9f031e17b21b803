"""Loading a config: YAML, dotted overrides, validation errors naming each bad field, and the reference
every field's docstring makes (docs/config.md, and each feature page's "Options": DOCS_PAGES says which)."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
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


# The page of docs/ that explains each field, by dotted key prefix (the longest prefix of a key wins; a list's
# `[]` is left out: `rewards.judge` is `rewards[].judge`). Every field's whole docstring is in its page's
# "Options" block, and its row of docs/config.md links there (scripts/update_config_reference.py writes
# both). A field added to a section lands on the section's page; an entry here moves it to another.
DOCS_PAGES: dict[str, str] = {
    "name": "watching.md",
    "seed": "faults.md",
    "model": "model.md",
    "model.attn_implementation": "learner.md",
    "model.processor_kwargs": "vision.md",
    "model.lora": "learner.md",
    "data": "data.md",
    "generation": "model.md",
    "generation.max_tool_calling_iterations": "agents.md",
    "generation.tensor_parallel_size": "weight-sync.md",
    "generation.kv_after_update": "pipelined.md",
    "grpo": "learner.md",
    "grpo.scale_rewards": "rewards.md",
    "grpo.multi_objective_aggregation": "rewards.md",
    "grpo.dynamic_sampling": "pipelined.md",
    "grpo.max_refill_rounds": "pipelined.md",
    "grpo.save_steps": "checkpoints.md",
    "grpo.save_best": "evaluation.md",
    "grpo.save_best_mode": "evaluation.md",
    "grpo.router_replay": "moe.md",
    "grpo.router_aux_loss_coef": "moe.md",
    "rewards": "rewards.md",
    "tools": "agents.md",
    "environment_factory": "agents.md",
    "agent_function": "agents.md",
    "agent": "agents.md",
    "cluster": "cluster.md",
    "cluster.num_learners": "learner.md",
    "cluster.learner_placement": "learner.md",
    "cluster.learner_strategy": "learner.md",
    "cluster.learner": "learner.md",
    "cluster.num_reward_workers": "reward-pool.md",
    "cluster.reward_autoscale": "reward-pool.md",
    "cluster.reward_chunk_groups": "reward-pool.md",
    "cluster.reward_worker": "reward-pool.md",
    "cluster.cpu_split": "weight-sync.md",
    "cluster.generator_autoscale": "pipelined.md",
    "cluster.generator_max_restarts": "faults.md",
    "cluster.max_failures": "faults.md",
    "cluster.hang_timeout_s": "faults.md",
    "cluster.num_env_workers": "agents.md",
    "cluster.env_autoscale": "agents.md",
    "cluster.env_worker": "agents.md",
    "loop": "pipelined.md",
    "weight_sync": "weight-sync.md",
    "logging": "watching.md",
    "logging.check_logprob_parity": "weight-sync.md",
    "logging.max_logprob_parity_gap": "weight-sync.md",
    "logging.token_samples": "viewer.md",
    "eval": "evaluation.md",
    "distillation": "rewards.md",
}


def docs_page(key: str) -> tuple[str, str]:
    """(the DOCS_PAGES prefix that places a dotted field, its page); KeyError for a field no entry covers."""
    parts = key.replace("[]", "").split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in DOCS_PAGES:
            return prefix, DOCS_PAGES[prefix]
    raise KeyError(f"{key}: no entry of DOCS_PAGES (orchestrator/config/loading.py) names its page")


# Words whose period ends no sentence.
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "cf", "Dr"})


def _outside(text: str) -> Iterator[tuple[int, str]]:
    """(index, character) of the characters outside backticks and brackets of any kind."""
    depth, code = 0, False
    for i, c in enumerate(text):
        if c == "`":
            code = not code
        elif not code and c in "([{":
            depth += 1
        elif not code and c in ")]}":
            depth = max(0, depth - 1)
        elif not code and depth == 0:
            yield i, c


def first_sentence(doc: str) -> str:
    """A docstring's first sentence: up to the first period outside brackets and code that ends a word (not
    e.g., i.e., ...) and is followed by a space or the end."""
    for i, c in _outside(doc):
        if c == "." and doc[i + 1 : i + 2] in ("", " ", "\n"):
            word = re.search(r"[\w.]*$", doc[:i])
            if word is None or word.group(0) not in _ABBREVIATIONS:
                return doc[: i + 1]
    return doc


def summary(doc: str, limit: int) -> str:
    """The docstring's first sentence, or, when that is longer than limit characters, its start up to the last
    clause boundary that fits (a comma, semicolon or colon, or an opening bracket, outside brackets and code)
    followed by " …"; at most limit characters either way."""
    text = " ".join(first_sentence(doc).split())
    if len(text) <= limit:
        return text
    cuts = [i for i, c in _outside(text) if i + 2 <= limit and (c in ",;:" and text[i + 1 : i + 2] == " " or
                                                                   c == " " and text[i + 1 : i + 2] == "(")]
    end = cuts[-1] if cuts else max(text.rfind(" ", 0, limit - 1), 0)
    return text[:end].rstrip(" ,;:") + " …"
