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
# only reports that there is no CUDA device).
set -u
OUT=${OUT:-benchmarks/results/gpu}
DEVICE=${DEVICE:-cuda}
MODELS=${MODELS:-mmoe ple dlrm dynamic_schema transformer deepfm dcnv2}
STEP_S=${STEP_S:-75}
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

echo "== gpu_check" >>"$LOG"
timeout 150 python3 -m benchmarks.gpu_check --out "$OUT/gpu_check.jsonl" >>"$LOG" 2>&1
echo "gpu_check rc=$?" >>"$LOG"

for model in $MODELS; do
  echo "== harness $model" >>"$LOG"
  start=$(date +%s)
  timeout "$STEP_S" python3 -m benchmarks --device "$DEVICE" --models "$model" \
    --methods eager,inductor,inductor_optimus,optimus_eqsat --mode inference,training \
    --warmup 5 --repeats 50 --no-progress --out "/tmp/harness/$model" >>"$LOG" 2>&1
  echo "harness $model rc=$? in $(( $(date +%s) - start )) s" >>"$LOG"
  if [ -f "/tmp/harness/$model/results.csv" ]; then
    if [ -f "$OUT/harness.csv" ]; then tail -n +2 "/tmp/harness/$model/results.csv" >>"$OUT/harness.csv"
    else cp "/tmp/harness/$model/results.csv" "$OUT/harness.csv"; fi
    cat "/tmp/harness/$model/results.md" >>"$OUT/harness.md"
  fi
done
date -u >>"$LOG"
