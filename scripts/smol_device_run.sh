#!/usr/bin/env bash
# Issue 23 in one GPU command (≈ 9 min on one H100/H200): the SmolLM2-135M-Instruct draft model, data included
# (scripts/train_smol_drafter.py --kinds draft: prompts from local text, the target's answers, KL distillation,
# engine α checks), then the paper's Tables 2/3/4 on SmolLM2 (scripts/smol_tables.py: unigram, bigram, the draft
# model and the shipped feature head; T = 0 and 1; speed by γ; predicted vs measured).
#
#   GGUF=/tmp/smol.gguf OUT=/some/dir bash scripts/smol_device_run.sh
#
# Everything lands in $RUN_DIR (default /tmp/smolrun), then goes to $OUT as one tar.gz split into 15 MiB parts
# (the device returns at most 8 files of 16 MiB): cat smolrun.tgz.part_* | tar xzf - -C DIR
# Each step is time-boxed (TRAIN_S, TABLES_S seconds) so the archive is written even when a step runs long.
# SMOL_DEVICE=cpu SMOL_TINY=1 runs the same steps in their --tiny form (a CPU check of the script).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the folder the results go to}"
GGUF=${GGUF:-/tmp/smol.gguf}
R=${RUN_DIR:-/tmp/smolrun}
TRAIN_S=${TRAIN_S:-340}
TABLES_S=${TABLES_S:-190}
DEVICE=${SMOL_DEVICE:-cuda}
TINY=${SMOL_TINY:+--tiny}
PY=${PYTHON:-python3}
mkdir -p "$R"
{ nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1; "$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > "$R/env.txt"
timeout "$TRAIN_S" "$PY" scripts/train_smol_drafter.py --out "$R" --kinds draft --gguf "$GGUF" --device "$DEVICE" \
    --gen-seconds 80 --draft-seconds 140 $TINY 2>&1 | tee "$R/train.log"
echo "train_smol_drafter rc=${PIPESTATUS[0]}" | tee -a "$R/train.log"
timeout "$TABLES_S" "$PY" scripts/smol_tables.py --run "$R" --out "$R/tables" --gguf "$GGUF" --device "$DEVICE" \
    $TINY 2>&1 | tee "$R/tables.log"
echo "smol_tables rc=${PIPESTATUS[0]}" | tee -a "$R/tables.log"
tar czf - -C "$R" . | split -b 15m - "$OUT/smolrun.tgz.part_"
ls -la "$OUT"
