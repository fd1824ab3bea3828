#!/usr/bin/env bash
# The zoo gpu pair + its feature head, then the engine benchmark on them, on one GPU (two calls: the machine
# stays warm between them, and /tmp/pair with it). From the repo root with data/code carried:
#   bash scripts/pair_device_run.sh train [SCALE] [HEAD_S]   # specdec train pair --preset gpu (budget SCALE, 0.85)
#                                                             # + specdec train head (HEAD_S seconds, 80; from a
#                                                             #   feature cache of 4M positions: ~4x the steps)
#   bash scripts/pair_device_run.sh bench [BENCH_S]           # bench_forward, engine_bench on /tmp/pair (+ head)
#   bash scripts/pair_device_run.sh serve [STEPS_S] [SERVE_S] # step_costs on /tmp/pair, and scripts/bench_serve.py
#                                                             # when .whl is carried
#   bash scripts/pair_device_run.sh all [SCALE] [HEAD_S]     # ONE command (< 10 min on an H200): the pair (budget
#                                                             # SCALE, 0.55), the head (HEAD_S, 100), then the batch-1
#                                                             # table (engine_bench --sections batch1, 32 prompts/arm)
# Everything lands in $OUT: run.log, summary/log JSON, engine.json.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
MODE=${1:-train}
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
if [ "$MODE" = all ]; then  # the issue-12 table from nothing, in one command: train, then measure
  set -- train "${2:-0.55}" "${3:-100}"
  DO_TABLE=1
fi
if [ "$MODE" = train ] || [ "$MODE" = all ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
  log "train the zoo gpu pair (budget scale ${2:-0.85})"
  rm -rf /tmp/pair
  timeout 420 python3 -m specdec train pair --preset gpu --data data/code --out /tmp/pair --budget-scale "${2:-0.85}" \
      --no-progress 2>&1 | grep -v "^INFO" | tail -40 | tee -a "$OUT/run.log"
  log "train the feature head (${3:-80} s)"
  timeout 200 python3 -m specdec train head --target /tmp/pair/target --data data/code --out /tmp/pair/head \
      --max-seconds "${3:-80}" --generate 2048 --gen-batch-size 1024 --feature-cache-tokens 4000000 \
      2>&1 | tail -25 | tee -a "$OUT/run.log"
  cp /tmp/pair/summary.json "$OUT/summary.json" 2>/dev/null
  (cd /tmp/pair && tar -czf "$OUT/logs.tar.gz" logs head/*.json 2>/dev/null)
fi
if [ -n "$DO_TABLE" ]; then
  log "batch-1 table on /tmp/pair + head (engine_bench --sections batch1)"
  timeout 200 python3 -m specdec.bench.engine_bench --pair /tmp/pair --head /tmp/pair/head --data data/code \
      --out "$OUT" --max-new-tokens 128 --sections batch1 --batch1-prompts 32 2>&1 | grep -v "^INFO" | tail -5 \
      | tee -a "$OUT/run.log"
  python3 scripts/engine_table.py "$OUT/engine.json" 2>&1 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = bench ]; then  # SECTIONS: engine_bench's sections (default: all but the batch-1 table and profile)
  HEAD=""
  [ -f /tmp/pair/head/feature_head.json ] && HEAD="--head /tmp/pair/head"
  log "forward cost (kernels)"
  timeout 120 python3 scripts/bench_forward.py --out "$OUT/forward.json" --no-profile 2>&1 | grep "^|" | tee -a "$OUT/run.log"
  log "engine bench on /tmp/pair $HEAD"
  timeout "${2:-420}" python3 -m specdec.bench.engine_bench --pair /tmp/pair --data data/code --out "$OUT" \
      --max-new-tokens 128 $HEAD --sections ${SECTIONS:-latency concurrent shapes synthetic} 2>&1 | grep -v "^INFO" \
      | tail -30 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = serve ]; then  # the step split on the trained pair, then serving (each level twice: first use vs steady)
  log "step costs on /tmp/pair (admission / steps / catch-ups)"
  timeout "${2:-150}" python3 scripts/step_costs.py --out "$OUT/step_costs_pair.json" --pair /tmp/pair \
      --head /tmp/pair/head --data data/code --sizes 8 32 64 --temperatures 0 1 2>&1 | grep -v "^INFO" | tail -22 \
      | tee -a "$OUT/run.log"
  if [ -d .whl ]; then  # the server's dependencies travel as wheels (see the device README)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
    log "serving bench (specdec serve, streaming clients)"
    timeout "${3:-240}" python3 scripts/bench_serve.py --target /tmp/pair/target --draft /tmp/pair/draft0 \
        --concurrency 1 8 8 32 32 64 64 --max-tokens 128 --device cuda --dtype bfloat16 --out "$OUT/serve.json" \
        2>&1 | tail -30 | tee -a "$OUT/run.log"
  fi
fi
log done
