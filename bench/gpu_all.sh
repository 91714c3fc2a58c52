#!/usr/bin/env bash
# Every device check of hsd_torch in one command, sized for a lent GPU's short lease:
#
#   bash bench/gpu_all.sh OUT_DIR [BUDGET_S]     # default BUDGET_S 480
#
# 1. correctness, in parallel (they time nothing): bench/gpu_check_generate.py in float32 (greedy
#    identity of every method in float64, agreement with the CPU run, the sampled first-two-token
#    audits at N=20,000 and the lossy control) and in bfloat16 (sampled part), and
#    bench/kernel_speed.py --agreement (float32 / bfloat16 decisions against float64);
# 2. the kernels' speed, alone on the device (bench/kernel_speed.py --device cuda);
# 3. the end-to-end benchmark (bench/gpu.sh: batches 1, 16, 64, bfloat16) in the time left.
#
# HSD_GPU_PARTS picks parts (default "check kernels bench"; a lease can be split across two calls).
# Each part runs under its own timeout whatever the others did; everything lands in OUT_DIR/work
# (HSD_GPU_WORK: another folder), packed at the end (and on any exit) into OUT_DIR/gpu_all.tar.gz,
# with OUT_DIR/summary.txt beside it (a device returns few files). Exits 0; the summary says what failed. On a machine without CUDA it
# runs the same parts on the CPU (to check the script itself).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash bench/gpu_all.sh OUT_DIR [BUDGET_S]}
BUDGET=${2:-480}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
W=${HSD_GPU_WORK:-$OUT/work}  # the parts' files (elsewhere than OUT_DIR where few files may come back)
mkdir -p "$W" "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
pack() { tar -czf "$OUT/gpu_all.tar.gz" -C "$(dirname "$W")" "$(basename "$W")" 2>/dev/null; }
trap pack EXIT
DEV=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
{ date -u; git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -20; nproc
  "$PY" -c "import sys, torch, transformers, tokenizers, numpy; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'); print('transformers', transformers.__version__, transformers.__file__); print('tokenizers', tokenizers.__version__, 'numpy', numpy.__version__)"
  nvidia-smi 2>/dev/null || true; } > "$W/env.txt" 2>&1
run() {  # run NAME TIMEOUT CMD...: log to $W/NAME.txt, record the exit code and the seconds in summary
  local name=$1 t=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s (limit $t s)" >> "$OUT/summary.txt"
}
PARTS=" ${HSD_GPU_PARTS:-check kernels bench} "
echo "device $DEV, budget $BUDGET s, parts${PARTS}, $(date -u)" > "$OUT/summary.txt"
if [[ $PARTS == *" check "* ]]; then
  run check_float32 180 "$PY" bench/gpu_check_generate.py &
  run check_bfloat16 180 "$PY" bench/gpu_check_generate.py --dtype bfloat16 --skip-greedy &
  run kernels_agreement 180 "$PY" bench/kernel_speed.py --device "$DEV" --agreement --json "$W/kernels_agreement.json" &
  wait
fi
if [[ $PARTS == *" kernels "* ]]; then
  run kernels "$(( $(left) < 150 ? $(left) / 2 : 120 ))" "$PY" bench/kernel_speed.py --device "$DEV" --threads 8 --ref-rows 1 \
    --repeat 5 --json "$W/kernels.json"
fi
T=$(( $(left) - 15 ))
if [[ $PARTS != *" bench "* ]]; then
  echo "bench: not asked for" >> "$OUT/summary.txt"
elif [ "$T" -gt 30 ]; then
  export HSD_BENCH_TIMEOUT=$(( T - 5 ))
  run bench "$T" bash bench/gpu.sh "$W/bench"
else
  echo "bench: skipped, $T s left" >> "$OUT/summary.txt"
fi
for f in check_float32 check_bfloat16; do [ -f "$W/$f.txt" ] && echo "--- $f: $(tail -1 "$W/$f.txt")" >> "$OUT/summary.txt"; done
grep -h "FAIL\|MISMATCH\|Error\|error" "$W"/check_*.txt "$W"/kernels*.txt >> "$OUT/summary.txt" 2>/dev/null
echo "total $(( $(date +%s) - START )) s" >> "$OUT/summary.txt"
exit 0
