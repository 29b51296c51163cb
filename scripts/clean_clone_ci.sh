#!/usr/bin/env bash
# CI from a clean clone, N times in a row: clone this repository's HEAD into a new folder and run .ci/run there
# (a fresh virtual environment, the README's install, the whole suite). One line per run; stops at the first failure.
#   bash scripts/clean_clone_ci.sh 3
set -uo pipefail
n="${1:-3}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
for i in $(seq 1 "$n"); do
    dir="$(mktemp -d)/clone"
    git clone -q "$repo" "$dir"
    start=$(date +%s)
    (cd "$dir" && .ci/run) > "$dir.log" 2>&1
    rc=$?
    echo "clean clone $i/$n ($(git -C "$dir" rev-parse --short HEAD)) rc=$rc $(( $(date +%s) - start ))s: $(grep -E 'passed|failed' "$dir.log" | tail -1)"
    if [ $rc -ne 0 ]; then tail -60 "$dir.log"; exit 1; fi
    rm -rf "$(dirname "$dir")"
done
echo "all $n clean-clone CI runs passed"
