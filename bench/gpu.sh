#!/usr/bin/env bash
# One command for the end-to-end benchmark on CUDA (bench/generate.py); it also runs, smaller, on CPU.
#
#   bash bench/gpu.sh [OUT_DIR]          # default OUT_DIR: .cache/bench_gpu/<date> (gitignored)
#
# On CUDA: bfloat16, batches 1, 16, 64 (64 held-out prompts x 64 new tokens; batch 1 on the first 8),
# 2 repeats, the target inflated to 40 blocks (bench/pair.py). The pair is built first if
# .cache/bench_pair lacks it (trained on the GPU there, so its weights differ from a CPU build's;
# copy a CPU build to .cache/bench_pair to benchmark the very same pair). On CPU: the --quick run
# (float32, 1 thread, batches 1 and 4). Writes OUT_DIR/results.json, OUT_DIR/*.png, OUT_DIR/log.txt,
# OUT_DIR/build.log and OUT_DIR/env.txt. Budget: < 5 minutes (the benchmark itself is cut at 290 s, or at
# HSD_BENCH_TIMEOUT seconds; bench/generate.py writes results.json after each finished repeat, so a cut
# run keeps them, marked "partial"). HSD_BENCH_ARGS replaces the arguments below, HSD_BENCH_PAIR the
# pair's folder (HSD_BENCH_FAST_PAIR=1: build a barely trained pair there if missing, for tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${1:-.cache/bench_gpu/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  ARGS=(--device cuda --dtype bfloat16 --threads 4 --batches 1,16,64 --prompts 64 --b1-prompts 8 --new 64 --repeats 2)
else
  ARGS=(--quick)
fi
[ -z "${HSD_BENCH_ARGS:-}" ] || read -r -a ARGS <<< "$HSD_BENCH_ARGS"
PAIR=${HSD_BENCH_PAIR:-.cache/bench_pair}  # another pair folder (a script test uses a --fast one)
{ date -u; "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'); print('transformers', transformers.__version__)"; nvidia-smi 2>/dev/null || true; } > "$OUT/env.txt"
[ -f "$PAIR/build.json" ] || HSD_BENCH_THREADS=${HSD_BENCH_THREADS:-4} "$PY" bench/pair.py --out "$PAIR" \
  ${HSD_BENCH_FAST_PAIR:+--fast} 2>&1 | tee "$OUT/build.log"
timeout "${HSD_BENCH_TIMEOUT:-290}" "$PY" bench/generate.py --pair "$PAIR" "${ARGS[@]}" --json "$OUT/results.json" --plots "$OUT" 2>&1 | tee "$OUT/log.txt"
echo "results in $OUT"
