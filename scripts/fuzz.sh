#!/usr/bin/env bash
# Builds one libFuzzer target with clang (ASan + UBSan) in build-fuzz/ and
# runs it: scripts/fuzz.sh TARGET SECONDS SEED_DIR [libFuzzer flags...]. A
# crash leaves its input in build-fuzz/TARGET-findings/ and exits non-zero.
# scripts/fuzz_request.sh and scripts/fuzz_kv_wire.sh call it.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1 seconds=$2 seeds=$3
shift 3
if ! command -v clang++ >/dev/null; then
  echo "$target: clang++ is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVANT_FUZZ=ON -DKVANT_TESTS=OFF -DKVANT_BENCH=OFF >/dev/null
ninja -C build-fuzz "$target" >/dev/null
corpus=build-fuzz/$target-corpus
findings=build-fuzz/$target-findings
mkdir -p "$corpus" "$findings"
# -rss_limit_mb: a parse that needs more memory than this is a finding too.
build-fuzz/fuzz/"$target" "$@" -max_total_time="$seconds" -rss_limit_mb=2048 \
  -artifact_prefix="$findings/" -print_final_stats=1 "$corpus" "$seeds" 2>&1 | tail -n 12
