#!/usr/bin/env bash
# The request-path libFuzzer target (HTTP, header checks, the OpenAI parser):
# scripts/fuzz_request.sh [SECONDS] (default 30; longer by hand, e.g. 3600).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/fuzz.sh fuzz_request "${1:-30}" fuzz/request_seeds -dict=fuzz/request.dict \
  -max_len=65536
