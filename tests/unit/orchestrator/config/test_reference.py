"""The config reference (orchestrator/config/loading.py's reference functions,
scripts/update_config_reference.py): `rayward config-reference` prints every field of the tree, docs/config.md
and each feature page's Options block are current and lose no field, default or word of a docstring, and the
manual lists every page."""

from __future__ import annotations

import io
import re
import shutil
import typing
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from orchestrator.cli.main import main
from orchestrator.config import RunConfig, config_reference
from orchestrator.config.loading import DOCS_PAGES, docs_page, first_sentence, summary
from scripts import update_config_reference as ref

ROOT = Path(__file__).resolve().parents[4]
DOCS = ROOT / "docs"
ROW = re.compile(r"^\| `([^`]+)` \| `(.*?)` \| (.*) \|$")
ENTRY = re.compile(r'^- <a id="([^"]+)"></a>`([^`]+)` \((required|default `.*?`)\): (.*)$')


def flat(text: str) -> str:
    return " ".join(text.split())


def section_of(annotation: object) -> type[BaseModel] | None:
    """The config section a field's type is, or is optionally (`X | None`), else None."""
    for a in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(a) is None and isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def tree(model: type[BaseModel] = RunConfig, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, default) of every field, walked from the pydantic models: a section's fields under its
    name, an optional section's own row first, and the top-level `rewards` list's entry fields under
    `rewards[]` (a nested list of rewards, `eval.rewards`, is one row: it takes the same entries)."""
    for name, field in model.model_fields.items():
        key, ann = prefix + name, field.annotation
        listed = typing.get_args(ann)[0] if typing.get_origin(ann) is list and not prefix else None
        if isinstance(listed, type) and issubclass(listed, BaseModel):
            yield key, repr(field.get_default(call_default_factory=True))
            yield from tree(listed, f"{key}[].")
        elif (sub := section_of(ann)) is not None:
            if sub is not ann:  # optional: off by default, a row of its own
                yield key, repr(field.get_default())
            yield from tree(sub, f"{key}.")
        else:
            required = field.is_required()
            yield key, "(required)" if required else repr(field.get_default(call_default_factory=True))


def printed() -> list[tuple[str, str, str]]:
    """What `rayward config-reference` prints: (key, default, meaning) per row."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["config-reference"]) == 0
    return [m.groups() for line in buf.getvalue().splitlines() if (m := ROW.match(line))]


def reference_block() -> str:
    text = (DOCS / "config.md").read_text()
    return text.split(ref.START)[1].split(ref.END)[0]


def config_md_rows() -> list[tuple[str | None, tuple[str, str, str]]]:
    """(the heading above it, (key, default, meaning)) of each field row of docs/config.md."""
    heading, out = None, []
    for line in reference_block().splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif heading != "Presets" and (m := ROW.match(line)):
            out.append((heading, m.groups()))
    return out


def entries(page: str) -> dict[str, tuple[str, str]]:
    """anchor -> (key, text) of each entry of a page's Options block."""
    block = (DOCS / page).read_text().split(ref.OPTIONS_START)[1].split(ref.OPTIONS_END)[0]
    out = {}
    for line in block.splitlines():
        if m := ENTRY.match(line):
            out[m.group(1)] = (m.group(2), m.group(4))
    return out


def test_the_generated_docs_are_current():
    stale = [str(p.relative_to(ROOT)) for p in ref.stale()]
    assert not stale, f"stale: {stale}: run `python scripts/update_config_reference.py`"


def test_config_reference_prints_every_field_of_the_tree():
    expected = list(tree())
    assert len(expected) > 200
    assert [(k, d) for k, d, _ in printed()] == expected
    assert all(doc for _, _, doc in printed())


def test_config_md_has_every_field_once_under_its_sections_heading():
    rows = config_md_rows()
    assert [(k, d) for _, (k, d, _) in rows] == list(tree())
    for heading, (key, _, _) in rows:
        top = key.split(".")[0].removesuffix("[]")
        names = re.findall(r"`([^`]+)`", heading or "")
        assert top in names and (len(names) == 1 or key == top), f"{key} under `## {heading}`"
    sections = ("model", "data", "generation", "grpo", "rewards", "cluster", "eval", "loop", "weight_sync",
                "logging", "agent", "distillation")
    assert {h for h, _ in rows} >= {f"`{s}`" for s in sections}


def test_config_md_rows_are_short():
    long = [line[:80] for line in reference_block().splitlines() if line.startswith("|") and len(line) > 250]
    assert not long, long


def test_every_docstring_is_whole_on_its_page_and_each_row_says_where():
    """A row of docs/config.md is its field's whole docstring, or the start of it and a link to the entry on
    the field's page that holds all of it (the entry of a field with the same long text, which the field's own
    entry links to)."""
    rows = {key: meaning for _, (key, _, meaning) in config_md_rows()}
    for key, _, doc in config_reference():
        page = docs_page(key)[1]
        assert page == ref.DOCS_PAGES[docs_page(key)[0]]
        own = entries(page)[f"config.{key.replace('[]', '')}"]
        assert own[0] == key
        whole = own[1] == flat(doc)
        if not whole:  # "as [`other`](page#config.other): ...", other's entry holding the text
            m = re.match(r"as \[`([^`]+)`\]\(([\w.-]*)#(config\.[^)]+)\): ", own[1])
            assert m, f"{key}: its entry on docs/{page} neither holds its docstring nor links to it"
            assert entries(m.group(2) or page)[m.group(3)] == (m.group(1), flat(doc)), key
        meaning = rows[key].replace("\\|", "|")
        if meaning != flat(doc):
            m = re.fullmatch(r"(.*) \[more\]\(([\w.-]+)#(config\.[^)]+)\)", meaning)
            assert m, f"{key}: its row of docs/config.md is cut but links to no entry"
            held = entries(m.group(2))[m.group(3)][1]
            assert held == flat(doc), f"{key}: its `more` link leads to another text"
            assert flat(doc).startswith(m.group(1).removesuffix(" …")), key


def test_docs_pages_names_fields_and_pages_with_an_options_heading():
    keys = [k.replace("[]", "") for k, _, _ in config_reference()]
    for prefix, page in DOCS_PAGES.items():
        assert any(k == prefix or k.startswith(prefix + ".") for k in keys), f"DOCS_PAGES: no field {prefix}"
        text = (DOCS / page).read_text()
        above = text.split(ref.OPTIONS_START)[0]
        assert "\n## Options\n" in above, f"docs/{page}: no `## Options` above its block"
    with pytest.raises(KeyError, match="no entry of DOCS_PAGES"):
        docs_page("nonexistent.field")
    assert docs_page("rewards[].judge.engines.num_cpus") == ("rewards", "rewards.md")
    assert docs_page("cluster.reward_autoscale.min_workers") == ("cluster.reward_autoscale", "reward-pool.md")


def test_the_presets_list_names_every_file_in_configs():
    listed = dict(re.findall(r"^\| `configs/([^`]+)` \| (.+) \|$", reference_block(), re.M))
    assert sorted(listed) == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert all(len(purpose) > 20 for purpose in listed.values()), listed


def test_index_and_nav_list_every_page():
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    index = (DOCS / "index.md").read_text()
    assert [p for p in pages if p != "index.md" and f"]({p})" not in index] == []

    def nav_pages(node: object) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from nav_pages(v)
        elif isinstance(node, list):
            for v in node:
                yield from nav_pages(v)

    nav = set(nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    assert [p for p in pages if p not in nav] == []


def test_first_sentence_skips_brackets_code_and_abbreviations():
    assert first_sentence("Micro-batch size. One step accumulates.") == "Micro-batch size."
    assert first_sentence("LoRA (PEFT): e.g. {r: 8}. The rest.") == "LoRA (PEFT): e.g. {r: 8}."
    assert first_sentence("Std (Dr. GRPO) per `a. b` token. More.") == "Std (Dr. GRPO) per `a. b` token."
    no_end = "Why: actors/runtime/cpus.py and 0.5 of it"
    assert first_sentence(no_end) == no_end


def test_summary_cuts_at_the_last_clause_that_fits():
    text = "alpha beta, gamma delta (epsilon, zeta) eta theta."
    assert summary(text, 100) == text
    assert summary(text, 25) == "alpha beta, gamma delta …"  # before the bracket, not inside it
    assert summary(text, 24) == "alpha beta …"
    assert summary(text + " Second sentence.", 100) == text
    assert all(len(summary(doc, n)) <= n for _, _, doc in config_reference() for n in (40, 120))


def test_a_stale_block_is_found_and_rewritten(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    monkeypatch.setattr(ref, "DOCS", docs)
    monkeypatch.setattr(ref, "PAGE", docs / "config.md")
    learner = docs / "learner.md"
    learner.write_text(learner.read_text().replace("Peak AdamW learning rate.", "Peak learning rate."))
    assert ref.stale() == [learner]
    assert ref.main(["--check"]) == 1
    assert ref.main([]) == 0 and ref.stale() == []
    assert "Peak AdamW learning rate." in learner.read_text()
    learner.write_text(learner.read_text().replace(ref.OPTIONS_END, ""))
    with pytest.raises(SystemExit, match="docs/learner.md: needs one"):
        ref.stale()
