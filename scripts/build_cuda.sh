#!/usr/bin/env bash
# The CUDA build's compile check (no GPU needed): configures build-cuda/ with
# -DKVANT_CUDA=ON (sm_90 and sm_80, warnings as errors) and builds the
# targets that hold CUDA code (the CUDA backend, the nccl communicator, the
# kernel bench), then fails if ptxas reported a register spill or local
# memory use for any kernel. Skipped, with a message, where nvcc is not
# installed.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
  echo "build_cuda: no nvcc here; the CUDA build is not checked"
  exit 0
fi
BUILD_DIR=${CUDA_BUILD_DIR:-build-cuda}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVANT_WERROR=ON -DKVANT_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DKVANT_TESTS=OFF -DKVANT_BENCH=OFF >/dev/null
# Every CUDA object is rebuilt, so that ptxas prints its report each time.
find "$BUILD_DIR" -name '*.cu.o' -delete
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The CUDA backend's own objects (its kernels and host side) and the nccl
# communicator: the compile and ptxas check without rebuilding the CPU kernels.
objs=$(ninja -C "$BUILD_DIR" -t targets all | sed -n 's#^\(CMakeFiles/kvant_backend.dir/src/backend/\(cuda/[^:]*\|registry.cpp\)\.o\):.*#\1#p')
ninja -C "$BUILD_DIR" -j "${JOBS:-$(nproc)}" $objs kvant_dist 2>&1 | tee "$log"
if grep -E "ptxas.*(spill|lmem|local memory)" "$log"; then
  echo "build_cuda: ptxas reports spills or local memory (above)"
  exit 1
fi
echo "build_cuda: $(grep -oE '[^ ]+\.cu\.o' "$log" | sort -u | wc -l) CUDA object(s) built clean (no spills)"
