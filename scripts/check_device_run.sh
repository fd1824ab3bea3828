#!/usr/bin/env bash
# `specdec check` on a GPU, one device call from the repo root: the shipped demo pair through the engine (CUDA
# graphs) in fp32 and in bf16, plus the transformers loop in bf16, each timed. fp32 must PASS; bf16 shows what the
# default kernels give (greedy differences at near-ties are reported, not failures; a clear margin fails).
#   bash scripts/check_device_run.sh        (≈ 1–3 min; the estimate in README is ≈ 10–30 s a run after loading)
# Lands in $OUT: check_<runner>_<dtype>.json (one strict-JSON object each), check_times.txt, run.log.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu tries the script here (slowly)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
for run in "fast float32" "fast bfloat16" "hf bfloat16"; do
  set -- $run
  start=$(date +%s%N)
  timeout 240 python3 -m specdec check --engine "$1" --device "$DEVICE" --dtype "$2" --threads 0 --json \
    > "$OUT/check_$1_$2.json" 2>> "$OUT/run.log"
  rc=$?
  echo "engine=$1 dtype=$2 rc=$rc wall_s=$(awk "BEGIN {print ($(date +%s%N) - $start) / 1e9}")" \
    | tee -a "$OUT/check_times.txt"
done
