#!/usr/bin/env bash
# Builds the KV transfer protocol's libFuzzer target with clang (ASan +
# UBSan) in build-fuzz/ and runs it: scripts/fuzz_kv_wire.sh [SECONDS]
# (default 30). A crash leaves its input in build-fuzz/fuzz_kv_wire-findings/
# and exits non-zero. Longer runs by hand: scripts/fuzz_kv_wire.sh 3600.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-30}"
if ! command -v clang++ >/dev/null; then
  echo "fuzz_kv_wire: clang++ is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVANT_FUZZ=ON -DKVANT_TESTS=OFF -DKVANT_BENCH=OFF >/dev/null
ninja -C build-fuzz fuzz_kv_wire >/dev/null
corpus=build-fuzz/fuzz_kv_wire-corpus
findings=build-fuzz/fuzz_kv_wire-findings
mkdir -p "$corpus" "$findings"
build-fuzz/fuzz/fuzz_kv_wire -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -rss_limit_mb=2048 \
  -artifact_prefix="$findings/" -print_final_stats=1 "$corpus" fuzz/kv_wire_seeds 2>&1 | tail -n 12
