#!/usr/bin/env bash
# One device run of the model zoo (see specdec/zoo): trains the demo pair and the gpu preset on one GPU.
# Usage on the device machine (repo root, data/ carried):  bash scripts/zoo_device_run.sh [GPU_BUDGET_SCALE] [PRESETS]
# Everything lands in $OUT: run.log, demo_pair.tar.part-* (the demo weights, <16 MiB pieces), logs.tar.gz.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
GPU_SCALE=${1:-0.6}
DATA=$(realpath "${DATA:-data/code}")
PY=${PYTHON:-python3}
PRESETS=${2:-"demo gpu"}  # run 2 trained "demo" alone
mkdir -p "$OUT"
# Run the zoo from an isolated copy: the rest of the package (written concurrently) is not needed here.
ISO=/tmp/iso
rm -rf "$ISO" && mkdir -p "$ISO/specdec/cli"
cp -r specdec/zoo "$ISO/specdec/"
cp specdec/cli/__init__.py specdec/cli/common.py specdec/cli/train.py specdec/cli/train_checkpoints.py "$ISO/specdec/cli/"
cp specdec/analysis.py specdec/strict_json.py "$ISO/specdec/"
cp specdec/__main__.py "$ISO/specdec/"
echo '"""isolated copy for the device run"""' > "$ISO/specdec/__init__.py"
export PYTHONPATH="$ISO"  # and run from $ISO: `-m` puts the cwd first on sys.path
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
} 2>&1 | tee "$OUT/run.log"
for preset in $PRESETS; do
  scale=1.0
  case "$preset" in gpu*) scale=$GPU_SCALE;; esac
  echo "=== preset $preset (budget scale $scale) $(date +%T)" | tee -a "$OUT/run.log"
  (cd "$ISO" && $PY -m specdec train pair --preset "$preset" --data "$DATA" --out "/tmp/runs/$preset" \
      --budget-scale "$scale" --no-progress) 2>&1 | tee -a "$OUT/run.log"
done
echo "=== packing $(date +%T)" | tee -a "$OUT/run.log"
# logs + summaries of every preset (small)
(cd /tmp/runs && tar -czf "$OUT/logs.tar.gz" */logs */summary.json) 2>&1 | tee -a "$OUT/run.log"
# the demo pair's weights, split into pieces below the 16 MiB limit on returned files
if [ -d /tmp/runs/demo ]; then
  (cd /tmp/runs/demo && tar -cf - target draft* | split -b 15m - "$OUT/demo_pair.tar.part-")
fi
ls -la "$OUT" | tee -a "$OUT/run.log"
