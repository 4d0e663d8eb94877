// Device helpers the CUDA backend's kernel files share (cuda_kernels.cu,
// cuda_attention.cu): warp reductions, the FP8 pair conversion, sizes.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/device_math.h"

namespace kvant::cuda {
namespace {

namespace cm = kvant::cuda_math;

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Two FP8 codes (low byte first) to FP32: the conversion instruction on
// sm_89 and later, exact (every e4m3 and e5m2 value is an FP16 value); the
// same values as device_math.h's decoders, NaN codes included.
__device__ __forceinline__ float2 fp8x2_to_f32(uint16_t two, int elem) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, elem == 1 ? __NV_E4M3 : __NV_E5M2);
  return __half22float2(__half2(h));
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024).
__device__ inline float block_sum(float v, float* red) {
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline unsigned grid1(int64_t n, int threads) {
  return unsigned(cdiv(n, threads) < 65535 * 32 ? cdiv(n, threads) : 65535 * 32);
}

}  // namespace
}  // namespace kvant::cuda
