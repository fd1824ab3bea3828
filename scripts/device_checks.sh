#!/usr/bin/env bash
# One device call for this wave's merged GPU pieces (from the repo root): the draw, admission and head-training
# benchmarks, then every GPU-marked test of the fast model, the engine and the zoo's head cache. Lands in $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/run.log"
log "draw cost"
timeout 90 python3 scripts/draw_cost.py --out "$OUT/draw_cost.json" 2>&1 | tail -20 | tee -a "$OUT/run.log"
log "admission cost"
timeout 120 python3 scripts/admission_cost.py --out "$OUT/admission.json" 2>&1 | tail -45 | tee -a "$OUT/run.log"
log "head training speed"
timeout 120 python3 scripts/head_train_speed.py --out "$OUT/head_speed.json" 2>&1 | tail -20 | tee -a "$OUT/run.log"
log "GPU tests"
timeout ${TESTS_S:-300} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/fast tests/engine \
    tests/zoo/test_feature_head_cache.py tests/test_dtypes_devices.py 2>&1 | tail -40 | tee -a "$OUT/run.log"
log done
