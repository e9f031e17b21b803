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
# The default is CI's tier: everything but the scenarios. A run's start (Ray, a vLLM engine, a learner and workers,
# each a process importing torch) costs about a minute of 2 cores, so CI's tier holds three whole runs (the demo,
# the agentic tools run, the agent-endpoint run), two short ones of the second-model tier (a judge, a distillation teacher) and the engines in
# process; the `scenario` marker holds every other run (learning runs, LoRA,
# eval, VLM, TRL scripts, several local Ray nodes, chaos, signals, jobs), the pools' fault and scaling cases and
# the multiprocess engine core (CONTRIBUTING.md lists them). --all runs CI's tier, then the scenarios one file at a
# time: each starts its own Ray nodes or kills processes on purpose, and two at once on 2 cores push each other's
# start-ups past their deadlines.
PYTEST=("$VENV/bin/python" -m pytest -q -ra --timeout=900 --durations=15)
CI_TIER=("${PYTEST[@]}" -n "${RAYWARD_TEST_WORKERS:-2}" --dist loadfile -m "not scenario")
if [ "${1:-}" = --all ]; then
  shift
  "${CI_TIER[@]}" "$@"
  exec "${PYTEST[@]}" -p no:xdist -m scenario "$@"
fi
exec "${CI_TIER[@]}" "$@"
