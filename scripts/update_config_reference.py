"""Regenerate README.md's config reference from the config docstrings (tests/unit/test_config.py checks it)."""

import io
import sys
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This checkout's config, not an installed rayward's (an editable install may point at another checkout).
sys.path.insert(0, str(ROOT))

from orchestrator.cli.main import main  # noqa: E402

START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
readme = ROOT / "README.md"
buf = io.StringIO()
with redirect_stdout(buf):
    main(["config-reference"])
text = readme.read_text()
head, rest = text.split(START)
readme.write_text(head + START + buf.getvalue() + END + rest.split(END)[1])
