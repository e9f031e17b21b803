"""What scripts/install.sh leaves behind that the test suite and every run depend on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# The packages every Ray actor of a run imports at start-up.
HEAVY = ("torch", "transformers", "vllm", "ray")


@pytest.mark.parametrize("package", HEAVY)
def test_the_heavy_packages_are_installed_with_their_bytecode(package):
    """Without .pyc files each actor process compiles these packages' sources again on import (and never keeps them
    where PYTHONDONTWRITEBYTECODE is set, as on CI): a run's start and CI's tests took 1.8x as long. uv installs
    without bytecode unless asked (install.sh passes --compile-bytecode); pip compiles by default."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, package
    cached = Path(importlib.util.cache_from_source(spec.origin))
    assert cached.exists(), f"{package} has no bytecode ({cached}): reinstall with scripts/install.sh"
