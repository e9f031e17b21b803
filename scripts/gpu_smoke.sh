#!/usr/bin/env bash
# The GPU smoke kit (docs/learner.md, "GPU smoke kit"): every learner path that needs CUDA and neither Ray nor
# vLLM, on a bare machine with one GPU and torch, transformers and accelerate, in a few minutes (tests/gpu/smoke.py).
# Prints one table (check, result, time, detail) and exits 1 if a check failed; prints one line and exits 0 where
# there is no CUDA device.
#
#   bash scripts/gpu_smoke.sh                  # from anywhere; the checkout is this script's parent
#   bash scripts/gpu_smoke.sh --device cpu     # the same checks on the CPU: a dry run (gloo for NCCL)
#   bash scripts/gpu_smoke.sh --only lora      # the checks whose name contains "lora"
#   bash scripts/gpu_smoke.sh --wheels DIR     # DIR's pure-Python wheels (peft) on the path; default build/smoke-wheels
#
# PYTHON picks the interpreter (default python3). No network and nothing written outside a temporary directory: the
# tiny model is built there (RAYWARD_CACHE, removed at exit). No pytest needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$(command -v python3 || command -v python || echo python3)}"
WHEELS="$ROOT/build/smoke-wheels"
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEELS="${2:?--wheels needs a directory}"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "gpu_smoke: $PY cannot import torch; set PYTHON to the interpreter that has torch, transformers, accelerate"
  exit 1
fi

# A pure-Python wheel (peft is py3-none-any) imports straight from its zip file: no pip, nothing installed.
EXTRA=""
if [[ -d "$WHEELS" ]]; then
  for w in "$WHEELS"/*.whl; do
    if [[ -e "$w" ]]; then EXTRA="$EXTRA:$w"; fi
  done
fi
export PYTHONPATH="$ROOT$EXTRA${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/rayward-gpu-smoke.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT
export RAYWARD_CACHE="$SCRATCH"

# Under eight minutes however it ends: the kit starts no check after its budget (--budget-s), and a check that hangs
# (a collective that never completes) is killed here, the rows before it already printed.
LIMIT_S="${RAYWARD_SMOKE_TIMEOUT_S:-470}"
rc=0
timeout --kill-after=10 "$LIMIT_S" "$PY" -m tests.gpu.smoke ${ARGS[@]+"${ARGS[@]}"} || rc=$?
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
  echo "gpu_smoke: stopped after ${LIMIT_S}s (a check hung); the rows above are the checks that ended"
fi
exit "$rc"
