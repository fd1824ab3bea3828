#!/usr/bin/env bash
# Device run of issue 6 (fast path + benchmarks) on one GPU. Usage, from the repo root on the device:
#   bash scripts/gpu_bench.sh validate        # GPU tests, 8B-shaped system check (+profile), gpu shapes with random weights
#   bash scripts/gpu_bench.sh full [SCALE] [LIMIT_S] [REPEATS]
#                                             # system check, then train the zoo gpu pair (budget scale SCALE,
#                                             # default 0.5; needs data/code carried) and benchmark it
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
bench() {  # bench NAME TIMEOUT ARGS...
  local name=$1 limit=$2; shift 2
  log "bench $name: $*"
  timeout "$limit" $PY -m specdec.cli.bench "$@" --json --out "$RES/$name" 2>&1 | tee "$RES/$name.log" \
      | grep -v "^\[bench" | tail -70 | tee -a "$OUT/run.log"
  grep "^\[bench" "$RES/$name.log" | tail -5 | tee -a "$OUT/run.log"
}

if [ "$MODE" = validate ]; then
  log "pytest tests/fast (GPU tests included)"
  timeout 150 $PY -m pytest -q -x tests/fast -p no:cacheprovider 2>&1 | tail -15 | tee -a "$OUT/run.log"
fi
case "$MODE" in validate|system) bench system 150 --preset system --profile ;; full) bench system 75 --preset system --profile ;; esac
if [ "$MODE" = validate ]; then
  bench gpu_random 200 --preset gpu --pair random --repeats 2 --profile
fi
if [ "$MODE" = full ]; then
  bench gpu "${3:-420}" --preset gpu --data data/code --train --pair /tmp/pair --budget-scale "${2:-0.5}" \
      --repeats "${4:-3}" --profile
fi
log done
