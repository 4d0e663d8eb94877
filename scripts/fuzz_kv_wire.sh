#!/usr/bin/env bash
# The KV transfer protocol's libFuzzer target (src/disagg/kv_wire.h):
# scripts/fuzz_kv_wire.sh [SECONDS] (default 30; longer by hand, e.g. 3600).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/fuzz.sh fuzz_kv_wire "${1:-30}" fuzz/kv_wire_seeds -max_len=4096
