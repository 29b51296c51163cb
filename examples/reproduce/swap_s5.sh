#!/usr/bin/env bash
# Entry points for the swap-S5 reproduction (examples/reproduce/swap_s5.py).
#
#   bash examples/reproduce/swap_s5.sh cpu      # CPU scale: train d ≤ 8, test to 64 (about 25 min on 2 cores)
#   bash examples/reproduce/swap_s5.sh gpu      # GPU scale on one H200 (train d ≤ 32, test to 1024), see below
#
# GPU (the device machine lacks datasets/evaluate/trl and has no registry): first, on a machine with one,
#   bash ../shared/gpu/wheels.sh                # downloads the wheels into .whl/
# then run this script there with `.whl` carried along; everything lands in $OUT/swap_s5_gpu.tgz
# (one file; runs/swap_s5_gpu.tgz without $OUT).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the repository's packages (par_studies, state_tracking, ...) without an install
scale="${1:-cpu}"
case "$scale" in
  cpu)
    python examples/reproduce/swap_s5.py --scale cpu --out results/swap_s5_cpu \
      --work_dir runs/reproduce_swap_s5_cpu --checkpoint_dir runs/reproduce_swap_s5_cpu/best_checkpoint
    ;;
  gpu)
    scratch="$(mktemp -d)"  # wheels, runs and results outside the working tree; only the archive is kept
    if [ -d .whl ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$scratch/site" .whl/*.whl
      export PYTHONPATH="$scratch/site:$PYTHONPATH"
    fi
    out="${OUT:-$PWD/runs}"
    mkdir -p "$out"
    python examples/reproduce/swap_s5.py --scale gpu --out "$scratch/swap_s5_gpu/results" \
      --work_dir "$scratch/swap_s5_gpu/runs" --checkpoint_dir "$scratch/swap_s5_gpu/par-swap-s5-small"
    tar czf "$out/swap_s5_gpu.tgz" -C "$scratch/swap_s5_gpu" results par-swap-s5-small
    ;;
  *) echo "usage: $0 cpu|gpu" >&2; exit 2 ;;
esac
