"""The dependency rules of the tree: no import circle among rayward's modules, and `actors/` (the stages) never
imports `orchestrator/` (the driver). Every import counts: module level and inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("orchestrator", "actors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """rayward modules `path` imports anywhere in its body (`from a.b import c` counts a.b.c when that is a
    module, else a.b)."""
    found: set[str] = set()
    me = module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this package
                base = me.rsplit(".", node.level)[0] if path.name != "__init__.py" else me
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # a.b.c -> a.b -> a
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_of_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    pkg = ROOT / "actors"
    src = "def f():\n    from orchestrator.build import Run\n    from . import types\n"
    path = pkg / "_probe_for_test.py"
    try:
        path.write_text(src)
        assert imports_of(path, {"orchestrator.build", "actors.types", "actors"}) == {"orchestrator.build", "actors.types"}
    finally:
        path.unlink()


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_actors_never_import_the_driver():
    bad = {(m, d) for m, deps in graph().items() if m.startswith("actors") for d in deps if d.startswith("orchestrator")}
    assert not bad, f"actors/ imports orchestrator/: {sorted(bad)}"


def test_readme_layout_table_names_every_module():
    """README's layout table lists every module of orchestrator/ and actors/ (by path, or as a sibling
    `pkg/x.py, sub/y.py` in the same cell)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Layout\n")
    end = readme.find("\n## ", start + 1)  # the next section, or the end of the file
    table = readme[start: end if end != -1 else len(readme)]
    cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named: set[str] = set()
    for cell in cells:
        paths = [p.strip(" `") for p in cell.split(",")]
        first = paths[0]
        top = first.split("/")[0]
        named.add(first)
        named.update(f"{top}/{p}" for p in paths[1:])
    missing = [
        str(p.relative_to(ROOT)) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
        if p.name not in ("__init__.py", "__main__.py") and str(p.relative_to(ROOT)) not in named
    ]
    assert not missing, f"README layout table lacks: {missing}"
