#!/usr/bin/env bash
# Run the whole test suite: unit tests (seconds), then integration tests on a local Ray cluster with real
# vLLM, reward workers and learner (minutes). GPU-marked tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAYWARD_VENV:-.venv}
[ -x "$VENV/bin/python" ] || bash scripts/install.sh
exec "$VENV/bin/python" -m pytest -q -ra --timeout=900 --durations=15 "$@"
