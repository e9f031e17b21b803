"""Regenerate README.md's config reference from the config docstrings (tests/unit/test_config.py checks it)."""

import io
from contextlib import redirect_stdout
from pathlib import Path

from orchestrator.ops.cli import main

START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
readme = Path(__file__).resolve().parents[1] / "README.md"
buf = io.StringIO()
with redirect_stdout(buf):
    main(["config-reference"])
text = readme.read_text()
head, rest = text.split(START)
readme.write_text(head + START + buf.getvalue() + END + rest.split(END)[1])
