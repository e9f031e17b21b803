"""scripts/torchvision_cpu.py (run by scripts/install.sh on CPU): it guards the two torchvision decorators that fail
next to CPU torch, once, without touching an installer's cache that the package's files are hard links to, and
refuses a torchvision release it was not checked on."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

UNGUARDED = ('@torch.library.register_fake("torchvision::nms")\ndef meta_nms(): ...\n\n'
             '@torch.library.register_fake("torchvision::qnms")\ndef meta_qnms(): ...\n')


def fake_torchvision(tmp_path, version: str):
    pkg = tmp_path / "site" / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f"__version__ = '{version}'\n")
    cache = tmp_path / "cache-meta.py"  # an installer's cache entry: the package's file is a hard link to it
    cache.write_text(UNGUARDED)
    os.link(cache, pkg / "_meta_registrations.py")
    return pkg, cache


def run(tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "torchvision_cpu.py")], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, cwd=tmp_path)


def test_guards_both_decorators_once_and_leaves_the_cache_alone(tmp_path):
    pkg, cache = fake_torchvision(tmp_path, "0.28.0+cu130")
    first = run(tmp_path)
    assert first.returncode == 0 and "2 decorator(s) guarded" in first.stdout, first.stdout + first.stderr
    text = (pkg / "_meta_registrations.py").read_text()
    assert text.count("if torchvision.extension._has_ops() else (lambda fn: fn))") == 2
    assert cache.read_text() == UNGUARDED  # the hard-linked cache entry is untouched
    again = run(tmp_path)
    assert again.returncode == 0 and "0 decorator(s) guarded" in again.stdout


def test_an_unchecked_release_is_refused(tmp_path):
    fake_torchvision(tmp_path, "0.31.0")
    r = run(tmp_path)
    assert r.returncode == 1 and "not a checked release" in r.stdout
