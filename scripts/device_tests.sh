#!/usr/bin/env bash
# One device call, from the repo root: every GPU-marked test (the 2-GPU ones too on a machine with 2+ GPUs), then
# the tensor-parallel probe (scripts/tp_probe.py: 8B-shaped plain decoding at TP 1 and TP 2, batch 1 and 64) when
# 2+ GPUs are there. Carry .whl (the server's dependencies as wheels, see the device README) for the server tests:
# fastapi 0.165 also needs opentelemetry-api there, or every server test is skipped.
#   bash scripts/device_tests.sh [TESTS_S] [PROBE_S]
# Lands in $OUT: run.log, tests.log, kernel_tests.log, tp_probe.jsonl.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  2>&1 | tee -a "$OUT/run.log"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
log "GPU-marked tests ($GPUS GPUs)"
timeout "${1:-330}" python3 -m pytest -q -p no:cacheprovider -m gpu -rfEs --continue-on-collection-errors tests 2>&1 | tee "$OUT/tests.log" | tail -40 \
  | tee -a "$OUT/run.log"
log "kernel tests that run on CUDA when it is there (not gpu-marked: on the CPU they run the Triton interpreter, in CI)"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/engine/test_greedy_commit.py tests/fast/kernels/test_argmax.py \
  2>&1 | tee "$OUT/kernel_tests.log" | tail -8 | tee -a "$OUT/run.log"
if [ "$GPUS" -ge 2 ]; then
  log "tensor-parallel probe (8B-shaped, random weights)"
  timeout "${2:-150}" python3 scripts/tp_probe.py --shape 8b --batch 1 64 --new 128 2>&1 | grep '^{' \
    | tee -a "$OUT/tp_probe.jsonl" "$OUT/run.log"
  timeout "${2:-150}" torchrun --nproc-per-node 2 scripts/tp_probe.py --shape 8b --batch 1 64 --new 128 2>&1 \
    | grep '^{' | tee -a "$OUT/tp_probe.jsonl" "$OUT/run.log"
fi
log done
