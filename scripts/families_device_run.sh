#!/usr/bin/env bash
# One device call, from the repo root (about 5 minutes): the families' GPU-marked tests (fp32 on CUDA exact with
# graphs and the Triton attention — windows, soft-capping —, bf16 up to ties; the attention kernel's window/softcap
# in bf16 at Gemma's head dim), then plain greedy decoding tok/s, engine vs transformers' generate, for real family
# shapes with random weights (Gemma 2 2B, Gemma 3 1B, Phi-3 mini, Pythia 1B, GPT-2).
#   bash scripts/families_device_run.sh [TESTS_S] [BENCH_S]
# Lands in $OUT: families_tests.log, families_bench.jsonl, families_bench.log.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee "$OUT/families_bench.log"
timeout "${1:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu -rfEs tests/fast/test_families.py \
  tests/fast/kernels/test_attention.py 2>&1 | tee "$OUT/families_tests.log" | tail -30
timeout "${2:-150}" python3 scripts/bench_families.py --prompt 128 --new 128 --batch 1 8 \
  --out "$OUT/families_bench.jsonl" 2>&1 | grep -v '^\[transformers\]' | tee -a "$OUT/families_bench.log" | tail -20
