"""The base of every config section, and the error a config that cannot run raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class ConfigError(ValueError):
    """A config that cannot run; the message names every bad field path."""
