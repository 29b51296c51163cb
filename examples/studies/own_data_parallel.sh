#!/usr/bin/env bash
# Run many own_data.py rows at once, one thread each, on a host with more cores than ours (the device machine's
# 16-core host; results/own_data_cpu/README.md, "Fourth pass"). Each line of JOBS is the arguments of one own_data.py
# row; the rows' JSONs (results/own_data_cpu/runs/<name>.json as own_data.py writes them) and train logs are packed, with
# each job's log, into $OUT/rows.tar.gz. Usage (repository root, .whl/ from ../shared/gpu/wheels.sh carried along):
#   bash examples/studies/own_data_parallel.sh JOBS PARALLEL TIMEOUT_S
set -uo pipefail
jobs_file=$1 parallel=$2 timeout_s=$3
out=${OUT:-/tmp/own_data_parallel} logs=/tmp/own_data_parallel_logs
mkdir -p "$out" "$logs"
if [ -d .whl ] && ! python3 -c "import datasets" 2>/dev/null; then  # the device host lacks datasets
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$logs/started"
nproc >> "$logs/started"
grep -v '^\s*$' "$jobs_file" | xargs -P "$parallel" -I{} sh -c \
  "timeout $timeout_s python3 examples/studies/own_data.py {} > \"$logs/\$(echo '{}' | tr -c 'a-zA-Z0-9_\n' _).log\" 2>&1; echo \"rc=\$? {}\" >> \"$logs/done\""
# the rows written by this call only: newer than the start marker
tar czf "$out/rows.tar.gz" $(find results/own_data_cpu/runs runs/own_data -newer "$logs/started" \
  \( -name '*.json' -path 'results/*' -o -name train.log \) 2>/dev/null) "$logs"
