#!/usr/bin/env bash
# Device check of the fast encoder-decoder path (specdec/fast/seq2seq.py) on one GPU, from the repo root (~2 min):
#   bash scripts/fast_seq2seq_device_run.sh
# 1. its tests, GPU ones included (graphs == eager, fp32 greedy == transformers with graphs, bf16 runs);
# 2. scripts/bench_fast_seq2seq.py on the EnDe tables' shapes, random weights: c and tokens/s on the fast and the
#    transformers paths, greedy identity between them → $OUT/fast_seq2seq.json.
# The EnDe tables themselves (scripts/ende_tables.sh) pick the fast path on their own ("path" in the JSON).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    2>&1 | tee -a "$OUT/run.log"
log "fast seq2seq tests (CPU + GPU)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rA tests/fast/test_seq2seq.py -s 2>&1 | tail -40 | tee -a "$OUT/run.log"
log "fast vs transformers encoder-decoder path, random weights (ende-tables shapes)"
timeout 300 python3 scripts/bench_fast_seq2seq.py --out "$OUT/fast_seq2seq.json" 2>&1 | tail -40 | tee -a "$OUT/run.log"
log "done"
