#!/usr/bin/env bash
# Install (first time only) and run the demo: GRPO on the letter task with the offline tiny model, on an
# embedded local Ray cluster. Extra arguments are config overrides, e.g. grpo.max_steps=60.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAYWARD_VENV:-.venv}
[ -x "$VENV/bin/rayward" ] || bash scripts/install.sh
exec "$VENV/bin/rayward" run configs/demo.yaml "$@"
