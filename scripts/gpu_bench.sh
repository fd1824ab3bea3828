#!/usr/bin/env bash
# Device run of issue 6 (fast path + benchmarks) on one GPU. Usage, from the repo root on the device:
#   bash scripts/gpu_bench.sh validate        # GPU tests, 8B-shaped system check (+profile), gpu shapes with random weights
#   bash scripts/gpu_bench.sh gpu [SCALE]     # train the zoo gpu pair (budget scale SCALE, default 0.5) and benchmark it
#   bash scripts/gpu_bench.sh system          # the system check alone
# Logs and results land in $OUT (run.log + results.tar.gz: every JSON/Markdown/PNG the benches wrote).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
PY=${PYTHON:-python3}
RES=/tmp/results
mkdir -p "$OUT" "$RES"
MODE=${1:-validate}
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee -a "$OUT/run.log"
pack() { (cd "$RES" && tar -czf "$OUT/results.tar.gz" .) ; ls -la "$RES"/* | tee -a "$OUT/run.log"; }
trap pack EXIT

if [ "$MODE" = validate ]; then
  log "pytest tests/fast (GPU tests included)"
  timeout 150 $PY -m pytest -q -x tests/fast -p no:cacheprovider 2>&1 | tail -15 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = validate ] || [ "$MODE" = system ]; then
  log "bench --preset system --profile"
  timeout 200 $PY -m specdec.cli.bench --preset system --profile --json --out "$RES/system" 2>&1 | tee "$RES/system.log" | tail -40 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = validate ]; then
  log "bench --preset gpu --pair random (zoo gpu shapes, random weights: timings only)"
  timeout 200 $PY -m specdec.cli.bench --preset gpu --pair random --repeats 2 --profile --json --out "$RES/gpu_random" 2>&1 | tee "$RES/gpu_random.log" | tail -60 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = gpu ]; then
  SCALE=${2:-0.5}
  log "bench --preset gpu --train (budget scale $SCALE)"
  timeout 480 $PY -m specdec.cli.bench --preset gpu --data data/code --train --budget-scale "$SCALE" --profile --json \
      --out "$RES/gpu" 2>&1 | tee "$RES/gpu.log" | grep -v "^\[bench.*step" | tail -80 | tee -a "$OUT/run.log"
  rm -rf "$RES/gpu/pair"  # weights do not come back (too large)
fi
log done
