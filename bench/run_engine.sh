#!/usr/bin/env bash
# The engine benchmarks docs/BENCHMARKS.md quotes (SmolLM2-135M, 2 threads),
# each writing JSON into bench/out/. Run on a quiet machine: with two cores,
# any other busy process slows OpenMP's fork/join steps severalfold.
#   bench/run_engine.sh [build-dir] [all|depth|batch|integrity|accuracy]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
what="${2:-all}"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$root/bench/out"
mkdir -p "$out"
kv="$build/kvant"
echo "load: $(uptime)"

if [[ $what == all || $what == depth ]]; then
  # Decode at depth: one request, a 4,096-token prompt, 128 tokens decoded
  # over a 4,096..4,224-token context; TPOT is the decode step time.
  "$kv" bench -m "$model" --concurrency 1 --requests-per-client 2 --kv-dtype bf16,fp8_e4m3,fp8_e5m2 \
    --kv-memory 1GiB --prompt-tokens 4096 --gen-tokens 128 --json >"$out/engine_depth4096.json"
fi
if [[ $what == all || $what == batch ]]; then
  # A KV budget in which BF16 cannot hold 64 requests of 256 tokens but FP8 can.
  "$kv" bench -m "$model" --concurrency 1,8,32,64 --kv-dtype bf16,fp8_e4m3 --kv-memory 192MiB \
    --prompt-tokens 128 --gen-tokens 128 --requests-per-client 2 --json >"$out/engine_batch.json"
fi
if [[ $what == all || $what == integrity ]]; then
  # The integrity pass on and off, twice each in alternation.
  for rep in 1 2; do
    "$kv" bench -m "$model" --concurrency 1,8,64 --kv-dtype bf16 --integrity on,off --kv-memory 1GiB \
      --prompt-tokens 128 --gen-tokens 128 --requests-per-client 2 --json >"$out/engine_integrity_$rep.json"
  done
fi
if [[ $what == all || $what == accuracy ]]; then
  "$kv" eval-kv -m "$model" --text "$root/../shared/data/wikitext-2-raw/wiki.test.raw" \
    --windows 16 --ctx 512 --calib-tokens 16384 --json "$out/eval_kv_smollm2.json"
fi
echo "load: $(uptime)"
