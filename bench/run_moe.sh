#!/usr/bin/env bash
# The synthetic Mixture-of-Experts benchmark docs/BENCHMARKS.md quotes:
# checkpoints shaped like Kimi K2.6 and GLM 5.2 (tests/fixtures/plan/), scaled
# down with `kvant synth`, their routed experts quantized to INT4 g32 the way
# Kimi ships them (everything else stays BF16), then `kvant bench` at
# concurrency 1..64: BF16 vs FP8 KV pages, BF16 vs INT4 experts. JSON into
# bench/out/. Run on a quiet machine.
#   bench/run_moe.sh [build-dir] [kimi|glm|all] [scale]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
what="${2:-all}"
scale="${3:-0.125}"
kv="$build/kvant"
out="$root/bench/out"
work="${KVANT_SYNTH_DIR:-/tmp/kvant-synth}"
tok="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$out" "$work"
echo "load: $(uptime)"
for name in kimi_k2.6 glm_5.2; do
  [[ $what == all || $name == ${what}* ]] || continue
  dir="$work/$name-$scale"
  "$kv" synth --like "$root/tests/fixtures/plan/${name}_config.json" --scale "$scale" \
    --tokenizer "$tok" -o "$dir"
  # Routed experts INT4 (group 32, symmetric); attention, shared experts,
  # dense layers, the indexer and lm_head kept BF16.
  "$kv" quantize --in "$dir" --out "$dir-int4e" --group-size 32 \
    --keep 'self_attn|shared_experts|mlp\.(gate|up|down)_proj|lm_head' --json >"$out/moe_${name}_quantize.json"
  # bf16: every weight BF16 (the experts dequantized); native: INT4 experts.
  "$kv" bench -m "$dir-int4e" --weights bf16,native --concurrency 1,8,32,64 \
    --kv-dtype bf16,fp8_e4m3 --kv-memory 1GiB --prompt-tokens 64 --gen-tokens 32 \
    --requests-per-client 1 --json >"$out/moe_${name}_bench.json"
done
echo "load: $(uptime)"
