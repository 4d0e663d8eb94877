#!/usr/bin/env bash
# Configures and builds kvant (Release, warnings as errors) into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVANT_WERROR=ON >/dev/null
ninja -C "$BUILD_DIR" -j "$JOBS"
