// The CUDA backend's row and product kernels (cuda_kernels.h): row
// operations one block per row, the products as a warp-per-output GEMV over
// BF16 activation rows (8 rows per pass; INT4 and FP8 decoded in registers)
// or, for shapes it does not take, a shared-memory tiled kernel; RoPE. The
// KV pages and attention are in cuda_attention.cu. Element conversions are
// device_math.h's, checked on the CPU by tests/unit/cuda_math_test.cpp.
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_util.cuh"

namespace kvant::cuda {
namespace {

// ---- rows ---------------------------------------------------------------

__global__ void embed_k(const uint16_t* table, int64_t rows, int64_t cols, int64_t row0,
                        const int32_t* tokens, float scale, float* out, int64_t ldo) {
  const int64_t t = blockIdx.x;
  const int64_t r = int64_t(tokens[t]) - row0;
  float* o = out + t * ldo;
  const bool in = r >= 0 && r < rows;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = in ? cm::bf16_to_f32(table[r * cols + c]) * scale : 0.f;
}

// Each row split into `segs` segments of cols / segs values (RMSNorm per
// head when segs > 1), one block per (row, segment).
__global__ void rmsnorm_k(const float* x, int64_t ldx, const float* w, float eps, float* y,
                          int64_t ldy, int64_t n, int64_t segs) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x / segs, sg = blockIdx.x % segs;
  const float* xr = x + r * ldx + sg * n;
  float* yr = y + r * ldy + sg * n;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = float(1.0 / sqrt(double(ss) / double(n) + double(eps)));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

__global__ void layernorm_k(float* x, int64_t ld, const float* w, const float* b, double eps,
                            int64_t n) {
  __shared__ double red[32];
  float* k = x + int64_t(blockIdx.x) * ld;
  const int lane = threadIdx.x % kWarp, wi = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  auto dsum = [&](double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[wi] = v;
    __syncthreads();
    double t = lane < nw ? red[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
  };
  double s = 0;
  for (int64_t d = threadIdx.x; d < n; d += blockDim.x) s += k[d];
  const double mean = dsum(s) / double(n);
  double v = 0;
  for (int64_t d = threadIdx.x; d < n; d += blockDim.x) v += (k[d] - mean) * (k[d] - mean);
  const float inv = float(1.0 / sqrt(dsum(v) / double(n) + eps));
  for (int64_t d = threadIdx.x; d < n; d += blockDim.x)
    k[d] = (k[d] - float(mean)) * inv * w[d] + b[d];
}

__global__ void add_k(float* x, int64_t ldx, const float* y, int64_t ldy, const float* bias,
                      int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    x[r * ldx + c] += y ? y[r * ldy + c] : bias[c];
  }
}

__global__ void gated_k(int act, const float* gu, int64_t ldg, float* out, int64_t ldo, int64_t rows,
                        int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const double g = gu[r * ldg + c], u = gu[r * ldg + cols + c];
    double a;
    if (act == 0) {
      a = g / (1.0 + exp(-g));
    } else {
      const double k = 0.7978845608028654;  // sqrt(2 / pi)
      a = 0.5 * g * (1.0 + tanh(k * (g + 0.044715 * g * g * g)));
    }
    out[r * ldo + c] = float(a * u);
  }
}

__global__ void softcap_k(float* x, int64_t ld, float cap, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float* p = x + (i / cols) * ld + i % cols;
    *p = tanhf(*p / cap) * cap;
  }
}

__global__ void copy_rows_k(const float* src, int64_t lds, const int64_t* sr, float* dst, int64_t ldd,
                            const int64_t* dr, int64_t cols) {
  const int64_t i = blockIdx.x;
  const float* s = src + (sr ? sr[i] : i) * lds;
  float* d = dst + (dr ? dr[i] : i) * ldd;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

// ---- linear products ----------------------------------------------------

__device__ __forceinline__ float w_at(const DevWeights& w, int64_t n, int64_t k) {
  switch (w.kind) {
    case WKind::kInt4: {
      const int64_t G = (w.k + w.group - 1) / w.group, g = n * G + k / w.group;
      const uint8_t b = w.q[n * (w.k / 2) + k / 2];
      return cm::int4_value(cm::nibble(b, int(k & 1)), w.zeros ? w.zeros[g] : 0, w.scales[g]);
    }
    case WKind::kFp8: {
      const int64_t G = (w.k + w.group - 1) / w.group;
      return cm::e4m3_to_f32(w.q[n * w.k + k]) * w.scales[n * G + k / w.group];
    }
    default:
      return cm::bf16_to_f32(w.bf16[n * w.k + k]);
  }
}

// Weights per 16-byte chunk of a row: 8 BF16, 16 FP8, 32 INT4.
template <WKind K>
constexpr int kChunk = K == WKind::kBf16 ? 8 : K == WKind::kFp8 ? 16 : 32;

// The 16-byte chunk of row n at column k (k % kChunk == 0, the chunk in one
// scale group) and its group's scale and zero point. `grow` is row n's first
// scale index (n * groups); groups are a power of two (gshift) here.
template <WKind K>
__device__ __forceinline__ uint4 w_load(const DevWeights& w, int64_t n, int64_t grow, int64_t k,
                                        float& s, int& z) {
  if constexpr (K == WKind::kBf16) {
    s = 1.f;
    z = 0;
    return *reinterpret_cast<const uint4*>(w.bf16 + n * w.k + k);
  } else if constexpr (K == WKind::kInt4) {
    const int64_t g = grow + (k >> w.gshift);
    s = w.scales[g];
    z = w.zeros ? w.zeros[g] : 0;
    return *reinterpret_cast<const uint4*>(w.q + n * (w.k >> 1) + (k >> 1));
  } else {
    s = w.scales[grow + (k >> w.gshift)];
    z = 0;
    return *reinterpret_cast<const uint4*>(w.q + n * w.k + k);
  }
}

// Eight weights of a loaded chunk (words 2 * sub .. for FP8, word sub for
// INT4, the whole chunk for BF16) times eight BF16 activations, summed in
// order into `acc`. INT4: (q - z) as exact small integers by the magic-number
// trick (no integer-to-float conversion), their dot product with x, then
// times the group scale. FP8: e4m3 codes placed into FP16 bit patterns and
// scaled by 2^8 (exact for every finite code), then times the group scale.
template <WKind K>
__device__ __forceinline__ float dot8(const uint4& v, int sub, float s, int z, const uint4& xb,
                                      float acc) {
  const uint32_t xw[4] = {xb.x, xb.y, xb.z, xb.w};
  float xv[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    xv[2 * i] = cm::bits_f32(xw[i] << 16);
    xv[2 * i + 1] = cm::bits_f32(xw[i] & 0xffff0000u);
  }
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  if constexpr (K == WKind::kBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc = fmaf(xv[2 * i], cm::bits_f32(u[i] << 16), acc);
      acc = fmaf(xv[2 * i + 1], cm::bits_f32(u[i] & 0xffff0000u), acc);
    }
    return acc;
  } else if constexpr (K == WKind::kInt4) {
    const uint32_t word = u[sub];
    const float off = 8388608.f + 8.f + float(z);  // 2^23 + 8 + zero
    float t = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      t = fmaf(cm::bits_f32(0x4B000000u | ((word >> (4 * e)) & 0xfu)) - off, xv[e], t);
    return fmaf(t, s, acc);
  } else {
    float t = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w4 = u[2 * sub + h];
      // Codes 0,1 and 2,3 of the word as FP16 pairs: sign to bit 15, the
      // exponent and mantissa bits to 14..7.
      const uint32_t lo = ((w4 & 0x7fu) << 7) | ((w4 & 0x80u) << 8) | ((w4 & 0x7f00u) << 15) |
                          ((w4 & 0x8000u) << 16);
      const uint32_t hi = ((w4 & 0x7f0000u) >> 9) | ((w4 & 0x800000u) >> 8) |
                          ((w4 & 0x7f000000u) >> 1) | (w4 & 0x80000000u);
      const float2 a = __half22float2(__hmul2(*reinterpret_cast<const __half2*>(&lo), __float2half2_rn(256.f)));
      const float2 b = __half22float2(__hmul2(*reinterpret_cast<const __half2*>(&hi), __float2half2_rn(256.f)));
      t = fmaf(a.x, xv[4 * h], t);
      t = fmaf(a.y, xv[4 * h + 1], t);
      t = fmaf(b.x, xv[4 * h + 2], t);
      t = fmaf(b.y, xv[4 * h + 3], t);
    }
    return fmaf(t, s, acc);
  }
}

// One warp per output row and M activation rows (BF16, dense, ld = k) at
// once: each lane takes 16-byte chunks of the weight row (lane, lane + 32,
// ...), 8 weights at a time, and the warp sums its lanes by butterfly. A
// row's arithmetic is the same for any M, so a row's result does not depend
// on how many rows share the pass.
template <int M, WKind K>
__global__ void __launch_bounds__(256, 2) gemv_k(const uint16_t* x, DevWeights w, float* y,
                                                 int64_t ldy) {
  constexpr int C = kChunk<K>;
  const int64_t n = int64_t(blockIdx.x) * 8 + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (n >= w.n) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  const int64_t grow = K == WKind::kBf16 ? 0 : n * ((w.k + (int64_t(1) << w.gshift) - 1) >> w.gshift);
  for (int64_t k = int64_t(lane) * C; k < w.k; k += C * kWarp) {
    float s;
    int z;
    const uint4 v = w_load<K>(w, n, grow, k, s, z);
#pragma unroll
    for (int sub = 0; sub < C / 8; ++sub)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 xb = *reinterpret_cast<const uint4*>(x + m * w.k + k + 8 * sub);
        acc[m] = dot8<K>(v, sub, s, z, xb, acc[m]);
      }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float t = warp_sum(acc[m]);
    if (lane == 0) y[m * ldy + n] = t;
  }
}

// Activation rows to BF16 (dense), once per product.
__global__ void to_bf16_k(const float* x, int64_t ldx, uint16_t* out, int64_t k) {
  const int64_t r = blockIdx.x;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) out[r * k + c] = cm::f32_to_bf16(x[r * ldx + c]);
}

// ---- INT4 products as the CPU computes them (W4A8) ---------------------
// kernels/cpu/kernels.h's contract: activations quantized per 32-block
// (sa = amax / 127, a = round-half-even(x * 127 / amax), sum = sum of a),
// then for each group in order: acc = fma(float(sum_c u a - o sum_b), sa_b,
// acc) over its blocks in order, y = fma(acc, s_g, y). The integer sums are
// exact (DP4A), so the GPU gives the CPU backend's bits.

// One warp per 32-block of an activation row. Within each 8 columns the
// int8 values are stored even columns first ([a0 a2 a4 a6 a1 a3 a5 a7]), the
// order a weight word's low and high nibbles take.
__global__ void quantize_q8_k(const float* x, int64_t ldx, int64_t k, int8_t* q, float* sa,
                              int32_t* sum) {
  const int64_t r = blockIdx.y, nblk = k / 32;
  const int64_t b = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (b >= nblk) return;
  const float v = x[r * ldx + b * 32 + lane];
  const float amax = warp_max(fabsf(v));
  int a = 0;
  if (amax != 0.f) a = int(rintf(v * (127.f / amax)));
  int t = a;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  const int j = lane % 8;
  q[r * k + b * 32 + (lane / 8) * 8 + (j % 2 == 0 ? j / 2 : 4 + j / 2)] = int8_t(a);
  if (lane == 0) {
    sa[r * nblk + b] = amax != 0.f ? amax / 127.f : 0.f;
    sum[r * nblk + b] = t;
  }
}

struct Q8Dev {
  const int8_t* q;
  const float* sa;
  const int32_t* sum;
};

// One warp per output row, M activation rows: lane L takes block 32 i + L
// (its 16 weight bytes and 32 activation bytes, eight DP4As); the lanes of a
// group chain their blocks in order, then lane order chains the groups.
template <int M>
__global__ void __launch_bounds__(256, 2) gemv_q4_k(Q8Dev x, DevWeights w, float* y, int64_t ldy) {
  const int64_t n = int64_t(blockIdx.x) * 8 + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (n >= w.n) return;
  const int64_t nblk = w.k / 32, G = (w.k + w.group - 1) / w.group;
  const int bpg = int(w.group / 32);  // 1, 2 or 4
  float yv[M];
#pragma unroll
  for (int m = 0; m < M; ++m) yv[m] = 0.f;
  for (int64_t base = 0; base < nblk; base += kWarp) {
    const int64_t b = base + lane, g = b / bpg;
    const bool valid = b < nblk;
    uint4 wq = make_uint4(0, 0, 0, 0);
    int o = 8;
    if (valid) {
      wq = *reinterpret_cast<const uint4*>(w.q + n * (w.k / 2) + b * 16);
      if (w.zeros) o = 8 + w.zeros[n * G + g];
    }
    const float sg = valid ? w.scales[n * G + g] : 0.f;
    const uint32_t ww[4] = {wq.x, wq.y, wq.z, wq.w};
    float v[M], sab[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      v[m] = 0.f;
      sab[m] = 0.f;
      if (!valid) continue;
      const int4* ap = reinterpret_cast<const int4*>(x.q + m * w.k + b * 32);
      const int4 a0 = ap[0], a1 = ap[1];
      const int aw[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      int isum = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        isum = __dp4a(int(ww[j] & 0x0f0f0f0fu), aw[2 * j], isum);
        isum = __dp4a(int((ww[j] >> 4) & 0x0f0f0f0fu), aw[2 * j + 1], isum);
      }
      v[m] = float(isum - o * x.sum[m * nblk + b]);
      sab[m] = x.sa[m * nblk + b];
    }
    // The group's blocks in order, from its first lane.
    const int first = (lane / bpg) * bpg;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    for (int bb = 0; bb < bpg; ++bb) {
      const bool ok = __shfl_sync(0xffffffffu, valid ? 1 : 0, first + bb) != 0;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float vb = __shfl_sync(0xffffffffu, v[m], first + bb);
        const float sb = __shfl_sync(0xffffffffu, sab[m], first + bb);
        if (ok) acc[m] = fmaf(vb, sb, acc[m]);
      }
    }
    // Then the groups of this pass in order.
    for (int q = 0; q < kWarp; q += bpg) {
      const bool ok = __shfl_sync(0xffffffffu, valid ? 1 : 0, q) != 0;
      const float s_q = __shfl_sync(0xffffffffu, sg, q);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float a_q = __shfl_sync(0xffffffffu, acc[m], q);
        if (ok) yv[m] = fmaf(a_q, s_q, yv[m]);
      }
    }
  }
  if (lane == 0)
#pragma unroll
    for (int m = 0; m < M; ++m) y[m * ldy + n] = yv[m];
}

void gemv_q4_launch(const Q8Dev& x, int64_t m, const DevWeights& w, float* y, int64_t ldy,
                    cudaStream_t s) {
  const dim3 g(unsigned(cdiv(w.n, 8)));
  const int64_t nblk = w.k / 32;
  for (int64_t r = 0; r < m;) {
    const Q8Dev xr{x.q + r * w.k, x.sa + r * nblk, x.sum + r * nblk};
    float* yr = y + r * ldy;
    int64_t mm = m - r >= 8 ? 8 : m - r;
    switch (mm) {
      case 1: gemv_q4_k<1><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 2: gemv_q4_k<2><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 3: gemv_q4_k<3><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 4: gemv_q4_k<4><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 5: gemv_q4_k<5><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 6: gemv_q4_k<6><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 7: gemv_q4_k<7><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      default: mm = 8; gemv_q4_k<8><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
    }
    r += mm;
  }
}

// Any shape: 64x64 output tiles, 16 columns of k per stage, 4x4 per thread.
__global__ void __launch_bounds__(256) gemm_k(const float* x, int64_t ldx, int64_t m, DevWeights w,
                                              float* y, int64_t ldy) {
  __shared__ float xs[16][65];
  __shared__ float ws[16][65];
  const int64_t m0 = int64_t(blockIdx.y) * 64, n0 = int64_t(blockIdx.x) * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < w.k; k0 += 16) {
    for (int i = threadIdx.x; i < 16 * 64; i += 256) {
      const int kk = i % 16, r = i / 16;
      const int64_t gm = m0 + r, gn = n0 + r, gk = k0 + kk;
      xs[kk][r] = gm < m && gk < w.k ? cm::round_bf16(x[gm * ldx + gk]) : 0.f;
      ws[kk][r] = gn < w.n && gk < w.k ? w_at(w, gn, gk) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[kk][ty * 4 + i];
        b[i] = ws[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gm = m0 + ty * 4 + i, gn = n0 + tx * 4 + j;
      if (gm < m && gn < w.n) y[gm * ldy + gn] = acc[i][j];
    }
}

template <WKind K>
void gemv_launch(const uint16_t* x, int64_t m, const DevWeights& w, float* y, int64_t ldy,
                 cudaStream_t s) {
  const dim3 g(unsigned(cdiv(w.n, 8)));
  // Passes of 8 rows, then the rest at once (M only groups rows; each
  // row's arithmetic is the same in every pass).
  for (int64_t r = 0; r < m;) {
    const uint16_t* xr = x + r * w.k;
    float* yr = y + r * ldy;
    int64_t mm = m - r >= 8 ? 8 : m - r;
    switch (mm) {
      case 1: gemv_k<1, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 2: gemv_k<2, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 3: gemv_k<3, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 4: gemv_k<4, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 5: gemv_k<5, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 6: gemv_k<6, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      case 7: gemv_k<7, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
      default: mm = 8; gemv_k<8, K><<<g, 256, 0, s>>>(xr, w, yr, ldy); break;
    }
    r += mm;
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------

// ---- launchers ----------------------------------------------------------

void embed(const uint16_t* table, int64_t rows, int64_t cols, int64_t row0, const int32_t* tokens,
           float scale, float* out, int64_t ldo, int64_t n, cudaStream_t s) {
  if (n > 0) embed_k<<<unsigned(n), 256, 0, s>>>(table, rows, cols, row0, tokens, scale, out, ldo);
}

void rmsnorm(const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy,
             int64_t rows, int64_t cols, int64_t segs, cudaStream_t s) {
  if (rows == 0) return;
  const int64_t n = cols / segs;
  const int th = n >= 1024 ? 1024 : n >= 256 ? 256 : 64;
  rmsnorm_k<<<unsigned(rows * segs), th, 0, s>>>(x, ldx, w, eps, y, ldy, n, segs);
}

void layernorm(float* x, int64_t ld, const float* w, const float* b, double eps, int64_t rows,
               int64_t cols, cudaStream_t s) {
  if (rows > 0) layernorm_k<<<unsigned(rows), 256, 0, s>>>(x, ld, w, b, eps, cols);
}

void add(float* x, int64_t ldx, const float* y, int64_t ldy, const float* bias, int64_t rows,
         int64_t cols, cudaStream_t s) {
  if (rows * cols > 0) add_k<<<grid1(rows * cols, 256), 256, 0, s>>>(x, ldx, y, ldy, bias, rows, cols);
}

void gated_act(int act, const float* gu, int64_t ldg, float* out, int64_t ldo, int64_t rows,
               int64_t cols, cudaStream_t s) {
  if (rows * cols > 0) gated_k<<<grid1(rows * cols, 256), 256, 0, s>>>(act, gu, ldg, out, ldo, rows, cols);
}

void softcap(float* x, int64_t ld, float cap, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0) softcap_k<<<grid1(rows * cols, 256), 256, 0, s>>>(x, ld, cap, rows, cols);
}

void copy_rows(const float* src, int64_t lds, const int64_t* src_rows, float* dst, int64_t ldd,
               const int64_t* dst_rows, int64_t n, int64_t cols, cudaStream_t s) {
  if (n > 0) copy_rows_k<<<unsigned(n), 256, 0, s>>>(src, lds, src_rows, dst, ldd, dst_rows, cols);
}

// INT4 as the CPU computes it (quantize_q8 + gemm_q4's order) when the
// shape allows: k a multiple of 32, group 32, 64 or 128.
bool q4_dp4a(const DevWeights& w) {
  return w.kind == WKind::kInt4 && w.k % 32 == 0 && (w.group == 32 || w.group == 64 || w.group == 128);
}

int64_t linear_scratch_bytes(int64_t m, const DevWeights& w) {
  return q4_dp4a(w) ? m * w.k + 16 + m * (w.k / 32) * 8 : m * w.k * 2;
}

void linear(const float* x, int64_t ldx, int64_t m, const DevWeights& w, float* y, int64_t ldy,
            uint16_t* scratch, cudaStream_t s) {
  if (m == 0 || w.n == 0) return;
  const int64_t chunk = w.kind == WKind::kBf16 ? 8 : w.kind == WKind::kFp8 ? 16 : 32;
  const bool vec = w.k % chunk == 0 && !w.nan_codes &&
                   (w.kind == WKind::kBf16 || (w.group % chunk == 0 && w.gshift >= 0));
  if (q4_dp4a(w)) {
    auto* q = reinterpret_cast<int8_t*>(scratch);
    const int64_t nblk = w.k / 32, qb = (m * w.k + 15) / 16 * 16;
    auto* sa = reinterpret_cast<float*>(q + qb);
    auto* sum = reinterpret_cast<int32_t*>(sa + m * nblk);
    quantize_q8_k<<<dim3(unsigned(cdiv(nblk, 8)), unsigned(m)), 256, 0, s>>>(x, ldx, w.k, q, sa, sum);
    gemv_q4_launch({q, sa, sum}, m, w, y, ldy, s);
    return;
  }
  if (vec) {
    to_bf16_k<<<unsigned(m), 256, 0, s>>>(x, ldx, scratch, w.k);
    if (w.kind == WKind::kBf16) gemv_launch<WKind::kBf16>(scratch, m, w, y, ldy, s);
    else if (w.kind == WKind::kInt4) gemv_launch<WKind::kInt4>(scratch, m, w, y, ldy, s);
    else gemv_launch<WKind::kFp8>(scratch, m, w, y, ldy, s);
    return;
  }
  const dim3 g(unsigned(cdiv(w.n, 64)), unsigned(cdiv(m, 64)));
  gemm_k<<<g, 256, 0, s>>>(x, ldx, m, w, y, ldy);
}

// out.row(t) = sum over j < k, in order, of w[t k + j] * ys.row(slot[t k + j])
// (fma from zero, as the CPU backend sums them: the same bits).
__global__ void moe_combine_k(const float* ys, int64_t ldy, const float* w, const int64_t* slot,
                              int64_t k, float* out, int64_t ldo, int64_t cols) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < cols; d += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) acc = fmaf(w[t * k + j], ys[slot[t * k + j] * ldy + d], acc);
    out[t * ldo + d] = acc;
  }
}

void moe_combine(const float* ys, int64_t ldy, const float* w, const int64_t* slot, int64_t k,
                 float* out, int64_t ldo, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows > 0) moe_combine_k<<<unsigned(rows), 256, 0, s>>>(ys, ldy, w, slot, k, out, ldo, cols);
}

__global__ void rope_k(float* x, int64_t ldx, int64_t heads, int64_t stride, int64_t dim,
                       const float* cosv, int64_t ldc, const float* sinv, int64_t lds, int interleave) {
  const int64_t t = blockIdx.x, half = dim / 2;
  const float* c = cosv + t * ldc;
  const float* s = sinv + t * lds;
  for (int64_t i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int64_t h = i / half, j = i % half;
    float* p = x + t * ldx + h * stride;
    const int64_t ia = interleave ? 2 * j : j, ib = interleave ? 2 * j + 1 : j + half;
    const float va = p[ia], vb = p[ib];
    p[ia] = va * c[j] - vb * s[j];
    p[ib] = vb * c[j] + va * s[j];
  }
}

void rope(float* x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_stride, int64_t dim,
          const float* cos, int64_t ldc, const float* sin, int64_t lds, int interleave,
          cudaStream_t s) {
  if (rows > 0) rope_k<<<unsigned(rows), 128, 0, s>>>(x, ldx, heads, head_stride, dim, cos, ldc, sin, lds, interleave);
}

}  // namespace kvant::cuda
