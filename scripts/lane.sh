#!/usr/bin/env bash
# Run the given commands one after another (one "lane" of at most two on this 2-core machine), each logged, and
# carry on past a failure: bash scripts/lane.sh LOG "cmd 1" "cmd 2" ...
set -u
cd "$(dirname "$0")/.."
log="$1"; shift
for cmd in "$@"; do
  echo "[$(date -u +%FT%TZ)] start: $cmd" >> "$log"
  bash -c "$cmd" >> "$log" 2>&1
  echo "[$(date -u +%FT%TZ)] exit $?: $cmd" >> "$log"
done
