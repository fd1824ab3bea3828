#!/usr/bin/env bash
# One device call for the fast model's kernels (issue 12), from the repo root:
#   bash scripts/device_kernels.sh [tests|bench|all]
# tests: the GPU-marked kernel, fast-model and engine tests; bench: linear, attention and whole-forward benchmarks.
# Everything lands in $OUT (run.log, *.json).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
MODE=${1:-all}
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$OUT/run.log"
if [ "$MODE" = tests ] || [ "$MODE" = all ]; then
  log "GPU tests"
  timeout ${TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/fast tests/engine 2>&1 \
      | tail -40 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  log "linear"
  timeout 120 python3 scripts/bench_linear.py --out "$OUT/linear.json" 2>&1 | tail -45 | tee -a "$OUT/run.log"
  log "attention"
  timeout 90 python3 scripts/kernel_bench.py --part attention --out "$OUT/attention.json" 2>&1 | tail -40 | tee -a "$OUT/run.log"
  log "forward"
  timeout 150 python3 scripts/bench_forward.py --out "$OUT/forward.json" 2>&1 | grep "^|" | tee -a "$OUT/run.log"
fi
log done
