#!/usr/bin/env bash
# Runs the kernel micro-benchmarks and writes bench/out/kernels.json (Google
# Benchmark JSON) plus bench/out/kernels.md (the tables docs/BENCHMARKS.md
# quotes). Figures are noisy when other processes compete for the two cores:
# the load average is recorded in the JSON context and printed here.
# usage: bench/run_kernels.sh [build-dir] [extra Google Benchmark flags]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
mkdir -p "$root/bench/out"
echo "load before: $(uptime)"
"$build/bench/kvant_bench_kernels" --benchmark_format=json --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true "$@" >"$root/bench/out/kernels.json"
echo "load after: $(uptime)"
python3 "$root/bench/summarize_kernels.py" "$root/bench/out/kernels.json" | tee "$root/bench/out/kernels.md"
