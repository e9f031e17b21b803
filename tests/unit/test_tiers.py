"""tests/tiers.py is the one place that says what CI runs: every entry names collected tests, and no test file
marks itself a scenario (the marker comes from the list alone)."""

from __future__ import annotations

import re
import subprocess
import sys
from fnmatch import fnmatchcase

from tests.conftest import ROOT, is_scenario
from tests.tiers import SCENARIOS


def collected() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/unit", "tests/integration"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_every_entry_names_a_collected_test_and_the_tier_is_the_lists():
    ids = collected()
    assert len(ids) > 1000, ids[-5:]
    for entry in SCENARIOS:
        assert any(i == entry or i.startswith((entry + "::", entry + "[")) or fnmatchcase(i, entry) for i in ids), (
            f"tests/tiers.py: {entry!r} names no test (moved or renamed?)")
    scenarios = [i for i in ids if is_scenario(i)]
    assert 100 < len(scenarios) < len(ids) // 4, len(scenarios)  # the list selects a minority, as documented


def test_no_test_file_marks_itself_a_scenario():
    marked = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
              if p.name != "conftest.py" and re.search(r"pytest\.mark\.scenario", p.read_text())]
    assert not marked, f"scenarios are named in tests/tiers.py only: {marked}"
