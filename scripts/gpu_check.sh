#!/usr/bin/env bash
# Everything the CUDA backend claims, proved on a GPU in one short run (about
# a minute on an H200 with prebuilt binaries), writing a log and JSON under $OUT:
#  1. the GPU test suite: every backend operation on "cuda" against the CPU
#     reference, the golden-logit tests of every architecture on "cuda", and
#     the shared element arithmetic (CudaMath);
#  2. the hot kernels' bandwidth against the HBM peak (kvant_bench_cuda):
#     BF16 / INT4 / FP8 GEMV on large matrices, paged decode attention over
#     BF16 and FP8 pages at long contexts;
#  3. kvant bench on a random-weight SmolLM2-135M-shaped checkpoint (kvant
#     synth --scale 1): one stream on CPU and CUDA, BF16 and INT4 weights;
#     then through the engine on CUDA, BF16 vs FP8 KV at 1-64 concurrent.
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

step "memcheck of the op tests (where compute-sanitizer runs: not on gVisor)"
if command -v compute-sanitizer >/dev/null; then
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$BIN/kvant_tests" \
    --gtest_filter='*BackendOps*cuda*' --gtest_brief=1 2>&1 | tail -15 || true
fi

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

step "kvant bench: Qwen3-30B-A3B-shaped MoE at a quarter scale (random weights), CPU and CUDA"
Q=/tmp/kvant-moe
"$BIN/kvant" synth --like tests/fixtures/plan/qwen3_30b_a3b_config.json --scale 0.25 -o "$Q" || status=1
for dev in cuda cpu; do
  timeout 90 "$BIN/kvant" bench -m "$Q" --device "$dev" --weights bf16 --prompt-tokens 512 \
    --gen-tokens 64 --reps 2 --json | tee -a "$OUT/bench.jsonl" || status=1
done

step "kvant bench through the engine on CUDA: BF16 vs FP8 KV, BF16 vs INT4 weights, 1-64 concurrent"
# The engine needs a tokenizer; the tiny test one will do for random prompts.
cp tests/fixtures/tokenizer/hf_tiny/tokenizer.json tests/fixtures/tokenizer/hf_tiny/tokenizer_config.json "$M"/
timeout 240 "$BIN/kvant" bench -m "$M" --device cuda --concurrency 1,16,64 --kv-dtype bf16,fp8_e4m3 \
  --weights bf16,int4 --kv-memory 8GiB --prompt-tokens 256 --gen-tokens 64 --requests-per-client 1 \
  --json > "$OUT/bench_engine.json" || status=1
python3 - "$OUT/bench_engine.json" <<'PY' || true
import json, sys
j = json.load(open(sys.argv[1]))
for c in j["configs"]:
    print({k: c.get(k) for k in ("weights", "kv_dtype", "concurrency", "output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "failed", "kv_capacity_tokens")})
PY

step "done: status $status"
exit $status
