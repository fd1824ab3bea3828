#!/usr/bin/env bash
# Issue 21 items 3/5 on one GPU in ONE command (< 6 min when /tmp/pair is there; from the repo root, data/code and
# .whl carried): the serving table through `specdec serve` (zoo pair + feature head, --num-draft-tokens auto,
# 8 / 32 / 64 / 128 streaming clients, plain and speculative requests on the same server) once per
# --prefill-budget (default: 0 = off, auto = a stall of 0.5 decode steps with K = 4, auto/8 = K = 8; also e.g.
# 256/4 = 256 tokens with --prefill-steps 4, 1024:0.0005 = 1024 with --switch-interval 0.0005, auto@0.25):
#   bash scripts/prefill_device_run.sh [BUDGETS...]        → $OUT/prefill/prefill_serve.{json,md}, $OUT/run.log
# The pair and its head are trained first (short budgets: ~4 min) when /tmp/pair/head is not there.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
if [ -d .whl ]; then  # the server's dependencies travel as wheels (see the device README)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=$PWD:/tmp/site
fi
if [ ! -f /tmp/pair/head/feature_head.json ]; then
  log "train the zoo gpu pair (budget scale 0.2)"
  rm -rf /tmp/pair
  timeout 170 python3 -m specdec train pair --preset gpu --data data/code --out /tmp/pair --budget-scale 0.2 \
      --no-progress 2>&1 | grep -v "^INFO" | tail -6 | tee -a "$OUT/run.log"
  log "train the feature head (30 s)"
  timeout 90 python3 -m specdec train head --target /tmp/pair/target --data data/code --out /tmp/pair/head \
      --max-seconds 30 --generate 2048 --gen-batch-size 1024 --feature-cache-tokens 4000000 \
      2>&1 | tail -4 | tee -a "$OUT/run.log"
fi
BUDGETS=${*:-0 auto auto/8}
LEFT=$(( ${TOTAL:-345} - SECONDS ))
log "serving table per prefill budget ($BUDGETS), $LEFT s left"
timeout $(( LEFT > 30 ? LEFT : 30 )) python3 scripts/bench_prefill_serve.py --pair /tmp/pair --head /tmp/pair/head \
    --data data/code --budgets $BUDGETS --clients 8 32 64 128 --out "$OUT/prefill" --max-seconds $(( LEFT - 20 )) \
    2>&1 | grep -v "^INFO" | tail -60 | tee -a "$OUT/run.log"
log done
