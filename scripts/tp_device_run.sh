#!/usr/bin/env bash
# Tensor-parallel measurements on a 4-GPU kind (nvidia-h100-x4 / nvidia-h200-x4), one device call, ~7 min:
#   1. Llama-3-70B shape at TP 4 (random bf16 weights made on each GPU): plain decoding at batch 1 and 64 vs the
#      bandwidth bound, speculative at synthetic α 0.8 (γ 4 and 6; drafters replicated at TP 1 on every rank:
#      a cheap 2-layer dim-1024 one, and a Llama-3.2-1B-shaped one, about the bytes of a 70B EAGLE-3 head) vs
#      Thm 3.8, and µs per all-reduce in a CUDA graph; each with NCCL ("group") and the symmetric-memory
#      one-shot all-reduce ("one_shot")
#   2. Llama-3-8B shape at TP 1, 2 and 4 (the scaling line), batch 1 and 64
#   3. if time is left: the all-reduce alone under NCCL_PROTO=LL and LL128 (8B's dim, batch 1/5/64 rows)
# NVLink multicast stays off (the host's GPUs are shared): the three variables below, exported for every child.
#   bash scripts/tp_device_run.sh [BUDGET_S]        # results in $OUT: tp.jsonl (one JSON row per line), run.log
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUDGET=${1:-450}
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
log() { echo "=== $* (t=$(( $(date +%s) - START ))s)" | tee -a "$OUT/run.log"; }
probe() {  # probe NPROC TIMEOUT_S ARGS...: one torchrun launch, its JSON rows into tp.jsonl, the rest into run.log
  local n=$1 t=$2; shift 2
  local l; l=$(left)
  [ "$l" -lt 30 ] && { log "skipped (time): $n GPUs $*"; return; }
  [ "$t" -gt "$l" ] && t=$l
  log "$n GPUs: tp_probe.py $* (timeout ${t}s)"
  local devices; devices=$(seq -s, 0 $((n - 1)))
  CUDA_VISIBLE_DEVICES=$devices timeout -k 10 "$t" torchrun --nproc-per-node "$n" scripts/tp_probe.py "$@" \
    --out "$OUT/tp.jsonl" >>"$OUT/run.log" 2>&1
  log "exit $?"
}
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  2>&1 | tee -a "$OUT/run.log"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
nvidia-smi topo -m 2>&1 | tee -a "$OUT/run.log"
probe 4 250 --shape 70b --batch 1 64 --new 128 --spec-alpha 0.8 --gamma 4 6 --draft-shape draft-small 1b \
  --all-reduce group one_shot --comm-bench
probe 1 60 --shape 8b --batch 1 64 --new 128
probe 2 70 --shape 8b --batch 1 64 --new 128 --all-reduce group one_shot
probe 4 80 --shape 8b --batch 1 64 --new 128 --all-reduce group one_shot
for proto in LL LL128; do
  NCCL_PROTO=$proto probe 4 40 --shape 8b --comm-bench --comm-only --all-reduce group
done
log done
