#!/usr/bin/env bash
# The tests: set up .venv if needed (scripts/setup_env.sh), lint with ruff (configured in pyproject.toml), then run the
# suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_env.sh
ruff check .
python -m pytest "$@"
