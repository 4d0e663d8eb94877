#!/usr/bin/env bash
# The chat-template interpreter's libFuzzer target (src/tokenizer/jinja.h):
# scripts/fuzz_jinja.sh [SECONDS] (default 30; longer by hand, e.g. 3600).
# Seeds: the real templates in tests/fixtures/jinja/templates.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/fuzz.sh fuzz_jinja "${1:-30}" tests/fixtures/jinja/templates -dict=fuzz/jinja.dict \
  -max_len=16384
