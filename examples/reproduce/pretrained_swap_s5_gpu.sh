#!/usr/bin/env bash
# The paper-claim study's rows on a GPU machine in one call (issue 48, item 5): the SmolLM2 parent travels as its
# first 4 layers (a 41 MB GGUF, the same quantized bytes: `python -m par_studies.parents truncate`), so no second call
# is needed to carry the whole 98 MB file. Each row trains for at most TRAIN_SECONDS (stopped earlier by the in-range
# probe or its 3,000 steps), is tested on the GPU, and its record comes back under $OUT with its log.
#
# Prepare here (once):
#   python -m par_studies.parents truncate smollm2-135m --layers 4 --out .gpu/smollm2-135m-4layers.gguf
#   bash ../shared/gpu/wheels.sh gguf==0.19.0          # datasets, evaluate, trl, gguf into .whl (the host lacks them)
# Run there (carry .gpu and .whl):
#   bash examples/reproduce/pretrained_swap_s5_gpu.sh
# Check it end to end on a CPU at tiny scale:
#   TRAIN_SECONDS=20 N_TEST=8 SEED=9 ROWS=smollm2_full_pace_3k OUT=/tmp/gpu_out \
#     bash examples/reproduce/pretrained_swap_s5_gpu.sh
set -uo pipefail
OUT=${OUT:?set OUT to the folder the records go to}
SEED=${SEED:-1}
TRAIN_SECONDS=${TRAIN_SECONDS:-320}
ROW_TIMEOUT=${ROW_TIMEOUT:-500}   # a guard: a row still running then is killed (its log still comes back)
ROWS=${ROWS:-"smollm2_full_pace_3k smollm2_full_pace_3k_no_anchor random_full_pace_3k"}
GGUF=.gpu/smollm2-135m-4layers.gguf
GGUF_SHA256=86deec707024adb4c2000cf4fd93d18c14d040de2a696cbcd777b5af968b7c9f
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
echo "$GGUF_SHA256  $GGUF" | sha256sum -c - || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'cuda', torch.cuda.is_available())"
n_test=()
[ -n "${N_TEST:-}" ] && n_test=(--n_test "$N_TEST")
started=$(date +%s)
for row in $ROWS; do
  timeout "$ROW_TIMEOUT" python3 examples/reproduce/pretrained_swap_s5.py --row "$row" --seed "$SEED" \
    --parent_gguf "$GGUF" --max_train_seconds "$TRAIN_SECONDS" "${n_test[@]}" > "$OUT/$row.log" 2>&1 &
done
wait
echo "all rows ended after $(( $(date +%s) - started )) s"
for row in $ROWS; do
  cp "results/pretrained_swap_s5/runs/${row}_s$SEED.json" "$OUT/" 2>/dev/null || echo "$row: no record"
  for log in runs/pretrained_swap_s5/"${row}_s$SEED"/train_segment*.log; do
    [ -f "$log" ] && { echo "== $log"; grep -E "probe_accuracy|train_runtime|Error|error" "$log" | tail -n 60; } \
      >> "$OUT/$row.log"
  done
  echo "== $row"; tail -n 4 "$OUT/$row.log"
done
