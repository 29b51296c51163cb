#!/usr/bin/env bash
# The main job: set up .venv if needed (scripts/setup_env.sh), then train and evaluate the small default PAR model
# (python examples/train_par.py; extra arguments are passed on, e.g. --max_steps 200).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_env.sh
python examples/train_par.py "$@"
