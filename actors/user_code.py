"""The user's code, imported by name: `module:attr` or `path/to/file.py:attr` (reward functions, tools,
environment classes). Every message starts with the config field that named the object, so a bad name is
reported as the user wrote it, before anything is started."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any


class UserCodeError(ValueError):
    """The named object cannot be imported; the message starts with the field that named it."""


def import_object(target: str, what: str) -> Any:
    """`module:attr` or `path/to/file.py:attr`, imported; UserCodeError names `what` (e.g. "tools[0]")."""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise UserCodeError(f"{what} {target!r} is not of the form module:name")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            spec = importlib.util.spec_from_file_location(f"rayward_user_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the user's to see, with the field named
        raise UserCodeError(
            f"{what} {target!r}: cannot import {module_name!r} ({type(err).__name__}: {err}); the module must be "
            f"importable from the directory you run rayward from ({os.getcwd()})"
        ) from None
    if not hasattr(module, attr):
        raise UserCodeError(f"{what} {target!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)
