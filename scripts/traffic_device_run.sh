#!/usr/bin/env bash
# Issue 21 on one GPU in ONE command (< 9 min on an H100/H200), from the repo root with data/code and .whl carried:
#   bash scripts/traffic_device_run.sh [SCALE] [HEAD_S] [TRAFFIC_S] [SERVE_S]
# 1. the zoo gpu pair + its feature head into /tmp/pair, unless /tmp/pair/head/feature_head.json is there already
#    (`specdec train pair --preset gpu --budget-scale SCALE`, default 0.3; `specdec train head`, HEAD_S s, default 50)
# 2. the traffic table through the Engine (`specdec bench`: plain vs the head drafter, "auto" and γ = 4, slots
#    64 / 8 / 1, a closed loop and Poisson arrivals; every engine warmed up first) → $OUT/traffic/traffic.{json,md}
# 3. the serving table (`specdec bench --serve`: the server on the pair with the head, --num-draft-tokens auto,
#    8 / 32 / 64 streaming clients, then Poisson arrivals) → $OUT/serve/serve.{json,md}
# 4. host work per engine step at 1 / 8 / 64 rows (scripts/host_overhead.py --stub: graph replays of one recorded
#    step, so the step time is the host's: bookkeeping, launches, the one device → host copy) → $OUT/host.json
# Progress and each stage's tail land in $OUT/run.log. TRAFFIC_S / SERVE_S: --max-seconds of each table (no arm
# or level starts after it; the rows measured so far are written), cut so the whole command ends within TOTAL
# seconds (default 540) when training ran long.
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
  log "train the zoo gpu pair (budget scale ${1:-0.3})"
  rm -rf /tmp/pair
  timeout 260 python3 -m specdec train pair --preset gpu --data data/code --out /tmp/pair --budget-scale "${1:-0.3}" \
      --no-progress 2>&1 | grep -v "^INFO" | tail -12 | tee -a "$OUT/run.log"
  log "train the feature head (${2:-50} s)"
  timeout 150 python3 -m specdec train head --target /tmp/pair/target --data data/code --out /tmp/pair/head \
      --max-seconds "${2:-50}" --generate 2048 --gen-batch-size 1024 --feature-cache-tokens 4000000 \
      2>&1 | tail -8 | tee -a "$OUT/run.log"
  cp /tmp/pair/summary.json "$OUT/summary.json" 2>/dev/null
fi
left() { echo $(( ${TOTAL:-540} - SECONDS )); }
clamp() { local v=$1; [ "$v" -gt "$2" ] && v=$2; [ "$v" -lt "$3" ] && v=$3; echo "$v"; }
T_S=$(clamp $(( $(left) - 150 - 40 - 45 )) "${3:-110}" 30)  # (leaves the serve and host stages their time)
log "traffic table (engine), --max-seconds $T_S"
timeout $(( T_S + 45 )) python3 -m specdec bench --pair /tmp/pair --head /tmp/pair/head --data data/code \
    --drafters head --slots 64 8 1 --policy auto 4 --out "$OUT/traffic" --max-seconds "$T_S" 2>&1 \
    | grep -v "^INFO" | grep -v "^|" | tail -40 | tee -a "$OUT/run.log"
S_S=$(clamp $(( $(left) - 40 - 90 )) "${4:-60}" 20)
log "serving table (specdec serve), --max-seconds $S_S"
timeout $(( S_S + 90 )) python3 -m specdec bench --serve --pair /tmp/pair --head /tmp/pair/head --data data/code \
    --clients 8 32 64 --out "$OUT/serve" --max-seconds "$S_S" 2>&1 | grep -v "^INFO" | tail -30 \
    | tee -a "$OUT/run.log"
log "host work per step (stub steps, 1 / 8 / 64 rows)"
timeout 40 python3 scripts/host_overhead.py --device cuda --stub --steps 200 --repeats 2 --gammas 0,4,auto \
    --sizes 1,8,64 --json "$OUT/host.json" 2>&1 | tail -12 | tee -a "$OUT/run.log"
log done
