"""The dependency rules of the tree: no import circle among rayward's modules, and `actors/` (the stages) never
imports `orchestrator/` (the driver). Every import counts: module level and inside functions, and at run time what
the driver pickles to an actor (an object pickled by reference imports its module where it is unpickled)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    src = "def f():\n    from orchestrator.run.build import Run\n    from . import types\n"
    path = pkg / "_probe_for_test.py"
    try:
        path.write_text(src)
        assert (imports_of(path, {"orchestrator.run.build", "actors.types", "actors"})
                == {"orchestrator.run.build", "actors.types"})
    finally:
        path.unlink()


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_actors_never_import_the_driver():
    bad = {(m, d) for m, deps in graph().items() if m.startswith("actors")
           for d in deps if d.startswith("orchestrator")}
    assert not bad, f"actors/ imports orchestrator/: {sorted(bad)}"


# Run in a fresh interpreter: unpickle stdin, report what it is and which driver modules that imported.
UNPICKLE = (
    "import json, pickle, sys; obj = pickle.loads(sys.stdin.buffer.read()); "
    "print(json.dumps([type(obj).__qualname__, sorted(m for m in sys.modules if m.startswith('orchestrator'))]))"
)


@pytest.mark.slow  # a second interpreter that imports torch
def test_what_the_driver_sends_the_learner_unpickles_without_the_driver():
    """build_run hands every learner rank `learner_spec(cfg, model_path)` (rank 0 also the reward pool's handle). Ray
    pickles it with references to the classes and functions inside, and a learner process that unpickles it
    imports their modules: none may be the driver's (a functools.partial of an orchestrator function would be)."""
    from ray import cloudpickle

    from orchestrator.config import load_config
    from orchestrator.run.build import learner_spec

    blob = cloudpickle.dumps(learner_spec(load_config(ROOT / "configs" / "demo.yaml"), "/models/policy"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", UNPICKLE], input=blob, capture_output=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    kind, driver_modules = json.loads(out.stdout)
    assert kind == "LearnerSpec"
    assert driver_modules == [], f"unpickling the learner's spec imported the driver: {driver_modules}"


def test_readme_layout_table_names_every_folder():
    """README's layout table has a row for every package folder of orchestrator/ and actors/ (the folders are the
    map: each `__init__.py` lists its modules)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Layout\n")
    end = readme.find("\n## ", start + 1)  # the next section, or the end of the file
    table = readme[start: end if end != -1 else len(readme)]
    named = {line.split("|")[1].strip(" `/") for line in table.splitlines() if line.startswith("| `")}
    folders = {str(p.parent.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")}
    # a folder inside a named one (builtin/tasks in builtin/), the packages' own rows aside
    nested = {f for f in folders if any(f.startswith(g + "/") for g in named - set(PACKAGES))}
    missing = sorted(folders - named - nested)
    assert not missing, f"README layout table lacks the folders: {missing}"


def test_every_package_lists_its_modules():
    """Each folder's __init__.py docstring names every module of the folder (the map a newcomer reads)."""
    import ast

    bad = {}
    for pkg in PACKAGES:
        for init in (ROOT / pkg).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            modules = [p.stem for p in init.parent.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
            unnamed = [m for m in modules if m not in doc]
            if unnamed or not doc:
                bad[str(init.parent.relative_to(ROOT))] = unnamed or "no docstring"
    assert not bad, f"folders whose __init__.py does not name their modules: {bad}"


# Ray's private modules, and a handle's private id: reached only through actors/runtime/ray_compat.py, which names the
# Ray version it was checked on.
RAY_PRIVATE = ("ray._private", "ray._raylet")


def private_ray_uses(path: Path) -> list[str]:
    """`ray._private...`/`ray._raylet` imports and `._actor_id` reads in a file, as `line: text`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Attribute) and node.attr == "_actor_id":
            names = ["._actor_id"]
        found += [f"{node.lineno}: {n}" for n in names if n == "._actor_id" or n.startswith(RAY_PRIVATE)]
    return found


def test_private_ray_apis_only_through_ray_compat():
    assert private_ray_uses(ROOT / "actors" / "runtime" / "ray_compat.py"), "the probe finds nothing: it cannot fail"
    bad = {str(p.relative_to(ROOT)): uses for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
           if p.name != "ray_compat.py" and (uses := private_ray_uses(p))}
    assert not bad, f"Ray's private APIs outside actors/runtime/ray_compat.py: {bad}"
