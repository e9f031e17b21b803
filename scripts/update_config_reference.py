"""Regenerate the config reference page (docs/config.md) from the config's field docstrings.

tests/unit/orchestrator/test_config.py::test_config_reference_page_is_current fails until this has been run
after a field or its docstring changed."""

import io
import sys
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This checkout's config, not an installed rayward's (an editable install may point at another checkout).
sys.path.insert(0, str(ROOT))

from orchestrator.cli.main import main  # noqa: E402

PAGE = ROOT / "docs" / "config.md"
START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"


def generated() -> str:
    """The table `rayward config-reference` prints."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        main(["config-reference"])
    return buf.getvalue()


def current(text: str) -> str:
    """The table between the page's markers."""
    return text.split(START)[1].split(END)[0]


if __name__ == "__main__":
    head, rest = PAGE.read_text().split(START)
    PAGE.write_text(head + START + generated() + END + rest.split(END)[1])
