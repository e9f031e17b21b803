"""Make PyPI's torchvision importable next to ``torch==2.13.0+cpu`` (run by scripts/install.sh on CPU).

Why: PyPI's Linux torchvision wheels are built against CUDA torch. Next to the CPU build of the same torch
release, its C++ extension (``torchvision/_C.so``: nms, roi_align, ...) cannot load (it needs
``libc10_cuda.so``). torchvision is written to run without it (``extension._has_ops()`` is then False and every
op registration checks it) except for two unconditional ``torch.library.register_fake`` decorators for
``torchvision::nms`` / ``torchvision::qnms``, which raise "operator torchvision::nms does not exist" at import.
This script guards those two with the same check torchvision uses everywhere else. What rayward (vLLM's and
transformers' multi-modal processors) needs from torchvision is pure Python over torch ops (transforms, the
video processor's imports); the C++ detection ops stay unavailable and raise torchvision's own message if called.

Idempotent; refuses a torchvision whose file no longer has the expected text (a newer release may have fixed
it, or moved it: then check by hand). The GPU install keeps the real torchvision and never runs this.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

# The torchvision releases whose file was checked (0.28.0 pairs with torch 2.13.0).
CHECKED = ("0.28.",)
UNGUARDED = ('@torch.library.register_fake("torchvision::nms")', '@torch.library.register_fake("torchvision::qnms")')


def guarded(line: str) -> str:
    op = line[len("@torch.library.register_fake(") : -1]
    return f"@(torch.library.register_fake({op}) if torchvision.extension._has_ops() else (lambda fn: fn))"


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision_cpu: torchvision is not installed; nothing to do")
        return 0
    root = pathlib.Path(spec.origin).parent
    version = (root / "version.py").read_text()
    if not any(f"__version__ = '{v}" in version or f'__version__ = "{v}' in version for v in CHECKED):
        print(f"torchvision_cpu: torchvision at {root} is not a checked release {CHECKED}; check the patch by hand")
        return 1
    meta = root / "_meta_registrations.py"
    text = meta.read_text()
    lines = text.splitlines(keepends=True)
    changed = 0
    for i, line in enumerate(lines):
        if line.rstrip("\n") in UNGUARDED:
            lines[i] = guarded(line.rstrip("\n")) + "\n"
            changed += 1
    if changed:
        # A new file in place of the old, never a write into it: an installer that hard-links packages from its
        # cache (uv's default) would otherwise patch the cache, and every environment linked to it, too.
        staged = meta.with_name(meta.name + ".rayward")
        staged.write_text("".join(lines))
        os.replace(staged, meta)
    elif not all(guarded(u) in text for u in UNGUARDED):
        print(f"torchvision_cpu: {meta} no longer has the expected decorators; check the patch by hand")
        return 1
    print(f"torchvision_cpu: {changed} decorator(s) guarded in {meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
