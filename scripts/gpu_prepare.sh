#!/usr/bin/env bash
# Builds the CUDA binaries here (no GPU needed) and gathers them, stripped,
# with every shared library they need beyond the C library, into .gpu/
# (git-ignored), so that scripts/gpu_check.sh can run them on a GPU machine
# that has the NVIDIA driver but none of kvant's build dependencies:
#   bash scripts/gpu_prepare.sh          # here
#   KVANT_GPU_BIN=.gpu bash scripts/gpu_check.sh   # there, from the repo root
# The binaries link the CUDA runtime statically; only libcuda (the driver)
# comes from the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "gpu_prepare: no nvcc here" >&2; exit 1; }
BUILD_DIR=${CUDA_GPU_BUILD_DIR:-build-cuda-gpu}
# MPI is left out: the GPU machine has no Open MPI to load.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVANT_WERROR=ON -DKVANT_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DKVANT_BENCH=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >/dev/null
ninja -C "$BUILD_DIR" -j "${JOBS:-$(nproc)}" kvant kvant_bench_cuda kvant_tests
rm -rf .gpu && mkdir -p .gpu/lib
for b in kvant kvant_bench_cuda tests/kvant_tests; do
  cp "$BUILD_DIR/$b" .gpu/
  strip ".gpu/$(basename "$b")"
done
# Shared libraries other than glibc's own and the driver's.
for b in .gpu/kvant .gpu/kvant_bench_cuda .gpu/kvant_tests; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
    *) cp -L "$lib" .gpu/lib/ ;;
  esac
done
# The test binary reads its fixtures from this checkout's path.
pwd > .gpu/source_dir
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
du -sh .gpu
echo "gpu_prepare: .gpu/ ready (carry it: run(carry=['.gpu'], command='KVANT_GPU_BIN=.gpu bash scripts/gpu_check.sh'))"
