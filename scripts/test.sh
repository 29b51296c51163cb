#!/usr/bin/env bash
# The tests: set up .venv if needed (scripts/setup_env.sh), then run the suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_env.sh
python -m pytest "$@"
