#!/usr/bin/env bash
# Run a pytest selection N times in a row (in the active environment); one line per run; stops at the first failure.
#   bash scripts/repeat_tests.sh 30 tests/test_trainers.py -k ddp
# Exit status: 0 if all N runs passed.
set -uo pipefail
n="$1"; shift
cd "$(dirname "$0")/.."
log="$(mktemp)"
for i in $(seq 1 "$n"); do
    start=$(date +%s)
    python -m pytest -q "$@" > "$log" 2>&1
    rc=$?
    echo "run $i/$n rc=$rc $(( $(date +%s) - start ))s $(tail -1 "$log")"
    if [ $rc -ne 0 ]; then tail -60 "$log"; exit 1; fi
done
echo "all $n runs passed"
