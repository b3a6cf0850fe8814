#!/usr/bin/env bash
# One prepared run on a CUDA machine: the GPU checks and the harness, results under $OUT.
#
#   OUT=benchmarks/results/gpu bash benchmarks/device_run.sh
#
# Wheels in .whl/ (egglog and what it imports, for a machine without a package
# registry; add highspy's for the ILP's faster solver, else it uses scipy's HiGHS)
# are installed first when egglog is missing. Every step has its own time limit
# and appends to its own file, so a step that runs long loses only itself.
# DEVICE=cpu dry-runs the same steps on a machine without a GPU (gpu_check then
# only reports that there is no CUDA device). GPU_CHECK=0 skips gpu_check, MODELS=""
# the harness; TRAINING_CASES (model:mode:batch, comma list) runs benchmarks.gpu_training
# on each case in its own process of at most CASE_S seconds, rows into gpu_training.jsonl.
set -u
OUT=${OUT:-benchmarks/results/gpu}
DEVICE=${DEVICE:-cuda}
MODELS=${MODELS-mmoe ple dlrm dynamic_schema transformer deepfm dcnv2}
GPU_CHECK=${GPU_CHECK:-1}
TRAINING_CASES=${TRAINING_CASES:-}
CASE_S=${CASE_S:-240}
BUDGET_S=${BUDGET_S:-100000}  # no gpu_training case starts after this many seconds of the run
T0=$(date +%s)
# METHODS: a comma list; unset, every method the device can run (7 on CUDA, 4 on CPU).
METHODS=${METHODS:+--methods $METHODS}
BATCHES=${BATCHES:-32,256,2048}
# Each case compiles every method cold (7 methods: a few minutes per model and batch);
# size STEP_S, MODELS and BATCHES to the device time at hand.
STEP_S=${STEP_S:-300}
mkdir -p "$OUT"
if ! python3 -c "import egglog" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
LOG=$OUT/run.log
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} >"$LOG" 2>&1

python3 -c "import optimus_eqsat.backend" >>"$LOG" 2>&1 || { echo "optimus_eqsat does not import"; cat "$LOG"; exit 1; }

if [ "$GPU_CHECK" = 1 ]; then
  echo "== gpu_check" >>"$LOG"
  timeout 150 python3 -m benchmarks.gpu_check --out "$OUT/gpu_check.jsonl" >>"$LOG" 2>&1
  echo "gpu_check rc=$?" >>"$LOG"
fi

for case in ${TRAINING_CASES//,/ }; do
  [ $(( $(date +%s) - T0 )) -lt "$BUDGET_S" ] || { echo "budget spent: $case not run" | tee -a "$LOG"; continue; }
  echo "== gpu_training $case" >>"$LOG"
  start=$(date +%s)
  timeout "$CASE_S" python3 -m benchmarks.gpu_training --device "$DEVICE" --cases "$case" \
    --out "$OUT/gpu_training.jsonl" >>"$LOG" 2>&1
  echo "gpu_training $case rc=$? in $(( $(date +%s) - start )) s" | tee -a "$LOG"
done

for model in $MODELS; do
  echo "== harness $model" >>"$LOG"
  start=$(date +%s)
  timeout "$STEP_S" python3 -m benchmarks --device "$DEVICE" --models "$model" \
    $METHODS --modes inference,training --batches "$BATCHES" \
    --warmup 5 --steps 10 --rounds 5 --max-rounds 20 --max-timing-s 60 \
    --no-progress --out "/tmp/harness/$model" >>"$LOG" 2>&1
  echo "harness $model rc=$? in $(( $(date +%s) - start )) s" >>"$LOG"
  if [ -f "/tmp/harness/$model/results.csv" ]; then
    if [ -f "$OUT/harness.csv" ]; then tail -n +2 "/tmp/harness/$model/results.csv" >>"$OUT/harness.csv"
    else cp "/tmp/harness/$model/results.csv" "$OUT/harness.csv"; fi
    cat "/tmp/harness/$model/results.md" >>"$OUT/harness.md"
    cp "/tmp/harness/$model/step_time_ratio.png" "$OUT/step_time_ratio_$model.png" 2>/dev/null
  fi
done
date -u >>"$LOG"
