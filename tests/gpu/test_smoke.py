"""The GPU smoke kit's checks (tests/gpu/smoke.py) as pytest tests, for a GPU host that has pytest; skipped without
CUDA (tests/conftest.py). scripts/gpu_smoke.sh runs the same checks without pytest and prints them as one table."""

from __future__ import annotations

import pytest

from tests.gpu.smoke import CHECKS, Skip


@pytest.mark.parametrize("check", [fn for _, fn in CHECKS], ids=[name.replace(" ", "-") for name, _ in CHECKS])
def test_smoke_check_on_cuda(check):
    try:
        check("cuda")
    except Skip as why:
        pytest.skip(str(why))
