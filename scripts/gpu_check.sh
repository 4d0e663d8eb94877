#!/usr/bin/env bash
# Everything the CUDA backend claims, proved on a GPU in one short run (about
# 5 minutes on an H200), writing a log and JSON under $OUT:
#  1. the GPU test suite: every backend operation on "cuda" against the CPU
#     reference, the golden-logit tests of every architecture on "cuda", and
#     the shared element arithmetic (CudaMath);
#  2. the hot kernels' bandwidth against the HBM peak (kvant_bench_cuda):
#     BF16 / INT4 / FP8 GEMV on large matrices, paged decode attention over
#     BF16 and FP8 pages at long contexts;
#  3. kvant bench on a random-weight SmolLM2-135M-shaped checkpoint (kvant
#     synth --scale 1): CPU against CUDA, BF16 and INT4 weights.
# Binaries: $KVANT_GPU_BIN (prebuilt by scripts/gpu_prepare.sh and carried
# over), or else a CUDA build made here (needs kvant's build dependencies).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
exec > >(tee "$LOG") 2>&1
BIN=${KVANT_GPU_BIN:-}
if [ -z "$BIN" ]; then
  bash scripts/gpu_prepare.sh || exit 1
  BIN=.gpu
fi
export LD_LIBRARY_PATH="$PWD/$BIN/lib:${LD_LIBRARY_PATH:-}"
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv || true

step "GPU tests"
# The test binary finds its fixtures where it was built; point that path here.
src=$(cat "$BIN/source_dir" 2>/dev/null || true)
if [ -n "$src" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"
fi
timeout 240 "$BIN/kvant_tests" --gtest_filter='*cuda*:*CudaMath*:-*GreedyGguf*' --gtest_brief=1 \
  --gtest_output="json:$OUT/gpu_tests.json" || status=1

step "kernel bandwidth (H200 HBM3e peak 4800 GB/s)"
timeout 120 "$BIN/kvant_bench_cuda" --peak-gbs 4800 --reps 30 > "$OUT/kernels.jsonl" || status=1
cat "$OUT/kernels.jsonl"

step "kvant bench: SmolLM2-135M-shaped random weights, CPU and CUDA"
M=/tmp/kvant-smol
"$BIN/kvant" synth --like tests/fixtures/plan/smollm2_135m_config.json --scale 1 -o "$M" || status=1
: > "$OUT/bench.jsonl"
for dev in cuda cpu; do
  for w in bf16 int4; do
    timeout 90 "$BIN/kvant" bench -m "$M" --device "$dev" --weights "$w" --prompt-tokens 512 \
      --gen-tokens 64 --reps 2 --json | tee -a "$OUT/bench.jsonl" || status=1
  done
done

step "done: status $status"
exit $status
