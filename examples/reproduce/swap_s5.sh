#!/usr/bin/env bash
# Entry points for the swap-S5 reproduction (examples/reproduce/swap_s5.py).
#
#   bash examples/reproduce/swap_s5.sh cpu      # CPU scale: train d ≤ 8, test to 64 (about 25 min on 2 cores)
#   bash examples/reproduce/swap_s5.sh gpu      # GPU scale on one H200 (train d ≤ 32, test to 1024), see below
#
# GPU (the device machine lacks datasets/evaluate/trl and has no registry): first, on a machine with one,
#   bash ../shared/gpu/wheels.sh                # downloads the wheels into .whl/
# then run this script there with `.whl` carried along; everything lands in $OUT/swap_s5_gpu.tgz (one file).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the repository's packages (par_studies, state_tracking, ...) without an install
scale="${1:-cpu}"
case "$scale" in
  cpu)
    python examples/reproduce/swap_s5.py --scale cpu --out results/swap_s5_cpu \
      --work-dir runs/reproduce_swap_s5_cpu --checkpoint-dir runs/reproduce_swap_s5_cpu/best_checkpoint
    ;;
  gpu)
    if [ -d .whl ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
      export PYTHONPATH=/tmp/site:$PYTHONPATH
    fi
    out="${OUT:-/tmp/out}"
    python examples/reproduce/swap_s5.py --scale gpu --out /tmp/swap_s5_gpu/results \
      --work-dir /tmp/swap_s5_gpu/runs --checkpoint-dir /tmp/swap_s5_gpu/par-swap-s5-small
    tar czf "$out/swap_s5_gpu.tgz" -C /tmp/swap_s5_gpu results par-swap-s5-small
    ;;
  *) echo "usage: $0 cpu|gpu" >&2; exit 2 ;;
esac
