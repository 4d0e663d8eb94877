#!/usr/bin/env bash
# Disaggregated serving against one server on the same cores (docs/
# BENCHMARKS.md, Disaggregated prefill and decode): `kvant bench serve`
# against (a) one colocated server with 2 threads, BF16 prefill and INT4
# decode weights, and (b) kvant router in front of a prefill server (1
# thread, BF16) and a decode server (1 thread, INT4), on loopback. Two
# workloads: short (128-token prompts, 128 generated, 1/8/32/64 clients)
# and long prompts (2,048 tokens, 128 generated, 1/4/8 clients). JSON into
# bench/out/disagg_*.json. Run on a quiet machine.
#   bench/disagg_serve.sh [build-dir] [rounds]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
rounds="${2:-1}"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$root/bench/out"
mkdir -p "$out"
kv="$build/kvant"
logs=$(mktemp -d)
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
trap 'stop_all; rm -rf "$logs"' EXIT
up() {  # LOG PID: waits for the server's address line
  for _ in $(seq 1 600); do
    grep -q "/v1" "$1" && return 0
    kill -0 "$2" 2>/dev/null || { cat "$1"; exit 1; }
    sleep 0.2
  done
  cat "$1"; exit 1
}
common=(-m "$model" --kv-memory 1GiB)
workload() {  # URL NAME
  "$kv" bench serve --url "$1" --concurrency 1,8,32,64 --prompt-tokens 128 --gen-tokens 128 \
    --requests-per-client 2 --out "$out/disagg_${2}_short.json"
  "$kv" bench serve --url "$1" --concurrency 1,4,8 --prompt-tokens 2048 --gen-tokens 128 \
    --requests-per-client 1 --out "$out/disagg_${2}_long.json"
}
echo "load: $(uptime)"
for round in $(seq 1 "$rounds"); do
  "$kv" serve "${common[@]}" -t 2 --port 8190 --prefill-weights bf16 --decode-weights int4 \
    2> "$logs/c.log" &
  pids+=($!); up "$logs/c.log" $!
  workload http://127.0.0.1:8190 "colocated_r$round"
  stop_all
  "$kv" serve "${common[@]}" -t 1 --port 8191 --role prefill --kv-port 8193 \
    --prefill-weights bf16 --decode-weights bf16 2> "$logs/p.log" &
  pids+=($!); up "$logs/p.log" $!
  "$kv" serve "${common[@]}" -t 1 --port 8192 --role decode --prefill-peer 127.0.0.1:8193 \
    --prefill-weights int4 --decode-weights int4 2> "$logs/d.log" &
  pids+=($!); up "$logs/d.log" $!
  "$kv" router --port 8190 --prefill http://127.0.0.1:8191 --decode http://127.0.0.1:8192 \
    2> "$logs/r.log" &
  pids+=($!); up "$logs/r.log" $!
  workload http://127.0.0.1:8190 "router_r$round"
  stop_all
done
