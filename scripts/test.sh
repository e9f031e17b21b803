#!/usr/bin/env bash
# Run the whole test suite: unit tests (seconds), then integration tests on a local Ray cluster with real
# vLLM, reward workers and learner (minutes). GPU-marked tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAYWARD_VENV:-.venv}
[ -x "$VENV/bin/python" ] || bash scripts/install.sh
# The environment's tools first on PATH, as if activated: the cluster tests start nodes with its `ray` CLI
# (cluster/local_cluster.sh), which a fresh shell that never activated it would not find.
PATH="$(cd "$VENV" && pwd)/bin:$PATH"
export PATH
# Two pytest workers (pytest-xdist), one test file at a time each (--dist loadfile: a module's shared run stays on
# one worker): a sync run keeps one core busy while the other waits on Ray start-ups, engine loads and
# deliberate hang deadlines, so a second file fills those gaps. RAYWARD_TEST_WORKERS=0 runs in this process.
# What CI runs is said once, in tests/tiers.py: every test but the scenarios it names (marked `scenario` by
# tests/conftest.py). --all runs CI's tier, then the scenarios one file at a time: each starts its own Ray nodes or
# kills processes on purpose, and two at once on 2 cores push each other's start-ups past their deadlines.
PYTEST=("$VENV/bin/python" -m pytest -q -ra --timeout=900 --durations=15)
CI_TIER=("${PYTEST[@]}" -n "${RAYWARD_TEST_WORKERS:-2}" --dist loadfile -m "not scenario")
if [ "${1:-}" = --all ]; then
  shift
  "${CI_TIER[@]}" "$@"
  exec "${PYTEST[@]}" -p no:xdist -m scenario "$@"
fi
exec "${CI_TIER[@]}" "$@"
