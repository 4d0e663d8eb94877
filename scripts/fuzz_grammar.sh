#!/usr/bin/env bash
# The structured-output compilers' libFuzzer target (src/grammar: JSON
# Schema and regular expressions to grammars, and the matcher):
# scripts/fuzz_grammar.sh [SECONDS] (default 30; longer by hand).
# Seeds: fuzz/grammar_seeds (first byte: even = schema, odd = regex).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/fuzz.sh fuzz_grammar "${1:-30}" fuzz/grammar_seeds -dict=fuzz/grammar.dict \
  -max_len=4096
