#!/usr/bin/env bash
# Device run of the engine (issue 9) on one GPU, from the repo root with data/code carried:
#   bash scripts/engine_device_run.sh validate        # GPU tests of the engine, then the engine bench on the
#                                                     # zoo gpu SHAPES with random weights (timings only)
#   bash scripts/engine_device_run.sh full [SCALE] [BENCH_S] [SERVE_S] [EXTRA]
#                                                     # train the zoo gpu pair (budget scale, default 0.5),
#                                                     # then the engine bench on it (+ 8B-shaped plain decoding;
#                                                     # EXTRA="--no-shapes" skips those) and `specdec serve`
# Everything lands in $OUT: run.log and <mode>/engine.json.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
MODE=${1:-validate}
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    2>&1 | tee -a "$OUT/run.log"
if [ "$MODE" = validate ]; then
  log "GPU tests"
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_engine_gpu.py tests/fast/test_gpu.py \
      2>&1 | tail -25 | tee -a "$OUT/run.log"
  log "engine bench, random weights"
  timeout 300 python3 -m specdec.bench.engine_bench --pair random --data data/code --out "$OUT/random" \
      --max-new-tokens 128 2>&1 | tail -150 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = full ]; then
  # the server's dependencies travel as wheels (.whl, see the device README)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  log "train the zoo gpu pair + engine bench"
  timeout "${3:-400}" python3 -m specdec.bench.engine_bench --pair /tmp/pair --train --budget-scale "${2:-0.5}" \
      --data data/code --out "$OUT/full" --max-new-tokens 128 ${5:-} 2>&1 | grep -v "^INFO" | tail -200 \
      | tee -a "$OUT/run.log"
  log "serving bench (specdec serve, streaming clients)"
  timeout "${4:-140}" python3 scripts/bench_serve.py --target /tmp/pair/target --draft /tmp/pair/draft0 \
      --concurrency 1 8 32 64 --max-tokens 128 --device cuda --dtype bfloat16 2>&1 | tail -40 | tee -a "$OUT/run.log"
fi
log done
