"""Regenerate the GRPOConfig field table of docs/trl.md from orchestrator/trl/args.py's FIELDS.

tests/unit/orchestrator/trl/test_args.py::test_the_docs_table_is_current fails until this has been run after a
field's treatment changed (or TRL's GRPOConfig did)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rayward, not an installed one

from orchestrator.trl.args import field_table  # noqa: E402

PAGE = ROOT / "docs" / "trl.md"
START, END = "<!-- trl-fields:start -->\n", "<!-- trl-fields:end -->"


def current(text: str) -> str:
    """The table between the page's markers."""
    return text.split(START)[1].split(END)[0]


if __name__ == "__main__":
    head, rest = PAGE.read_text().split(START)
    PAGE.write_text(head + START + field_table() + END + rest.split(END)[1])
