// The CUDA backend's kernels (cuda_kernels.h). Straightforward forms first,
// each checked against the CPU reference by tests/unit/backend_ops_test.cpp:
// row operations one block per row, a warp-per-output GEMV for up to 8
// rows and a shared-memory tiled GEMM above that, split-context paged decode
// attention that decodes FP8 pages in the kernel, and a tiled causal prefill
// attention over the gathered BF16 rows. Element conversions are
// device_math.h's, so page bytes are bitwise the CPU backend's.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_kernels.h"
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
__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
unsigned grid1(int64_t n, int threads) {
  return unsigned(cdiv(n, threads) < 65535 * 32 ? cdiv(n, threads) : 65535 * 32);
}

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

// ---- KV pages -----------------------------------------------------------

__device__ __forceinline__ float kv_decode(int32_t elem, const uint8_t* row, int64_t d) {
  if (elem == 0) return cm::bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[d]);
  return elem == 1 ? cm::e4m3_to_f32(row[d]) : cm::e5m2_to_f32(row[d]);
}

__device__ __forceinline__ uint8_t* page_of(const DevStep& st, const DevKvFormat& f, const DevChunk& c,
                                            int64_t pos) {
  return st.pages[c.page0 + pos / f.page_tokens] + f.layer_off;
}

// One block per token, one warp per KV head.
__global__ void kv_store_k(DevStep st, DevKvFormat f, const float* k, int64_t ldk, const float* v,
                           int64_t ldv) {
  const int64_t t = blockIdx.x;
  if (!st.tok_writes[t]) return;
  const int lane = threadIdx.x % kWarp;
  const DevChunk& c = st.chunks[st.tok_chunk[t]];
  const int64_t pos = st.tok_pos[t], slot = pos % f.page_tokens;
  uint8_t* page = page_of(st, f, c, pos);
  const int64_t hd = f.head_dim;
  const float max_finite = f.elem == 1 ? 448.f : 57344.f;
  for (int h = threadIdx.x / kWarp; h < f.kv_heads; h += blockDim.x / kWarp) {
    for (int which = 0; which < (v ? 2 : 1); ++which) {
      const float* x = (which == 0 ? k + t * ldk : v + t * ldv) + h * hd;
      uint8_t* dst = page + (which == 0 ? f.k_offset : f.v_offset) + slot * f.row_bytes;
      if (f.elem == 0) {
        auto* o = reinterpret_cast<uint16_t*>(dst) + h * hd;
        for (int64_t d = lane; d < hd; d += kWarp) o[d] = cm::f32_to_bf16(x[d]);
        continue;
      }
      float s;
      if (f.dynamic) {
        float amax = 0.f;
        for (int64_t d = lane; d < hd; d += kWarp) amax = fmaxf(amax, cm::finite_abs(x[d]));
        s = cm::kv_scale_from_amax(warp_max(amax), max_finite);
        auto* sc = reinterpret_cast<uint16_t*>(page + (which == 0 ? f.k_scale_offset : f.v_scale_offset));
        if (lane == 0) sc[slot * f.kv_heads + h] = cm::f32_to_bf16(s);
      } else {
        s = which == 0 ? f.static_k[h] : f.static_v[h];
      }
      const uint32_t mb = f.elem == 1 ? 3u : 2u;
      for (int64_t d = lane; d < hd; d += kWarp) dst[h * hd + d] = cm::f32_to_fp8(x[d] / s, mb);
    }
  }
}

__global__ void kv_store_index_k(DevStep st, DevKvFormat f, const float* k, int64_t ldk) {
  const int64_t t = blockIdx.x;
  if (!st.tok_writes[t]) return;
  const DevChunk& c = st.chunks[st.tok_chunk[t]];
  const int64_t pos = st.tok_pos[t], slot = pos % f.page_tokens;
  auto* o = reinterpret_cast<uint16_t*>(page_of(st, f, c, pos) + f.index_offset) + slot * f.index_dim;
  for (int64_t d = threadIdx.x; d < f.index_dim; d += blockDim.x) o[d] = cm::f32_to_bf16(k[t * ldk + d]);
}

// One block per gathered row: a position of a prefill chunk, from its page
// (earlier positions) or from the fresh FP32 rows (the chunk's own).
__global__ void kv_gather_k(DevStep st, DevKvFormat f, const float* kn, int64_t ldkn, const float* vn,
                            int64_t ldvn, uint16_t* gk, int64_t ldgk, uint16_t* gv, int64_t ldgv) {
  const int64_t e = st.gather_rows[blockIdx.x];
  const DevChunk& c = st.chunks[e >> 40];
  const int64_t j = e & ((int64_t(1) << 40) - 1);
  const int64_t row = c.gather_off + j - c.gather_j0, kvd = int64_t(f.kv_heads) * f.head_dim;
  uint16_t* dk = gk + row * ldgk;
  uint16_t* dv = vn ? gv + row * ldgv : nullptr;
  if (j >= c.pos0) {
    const int64_t t = c.t0 + j - c.pos0;
    for (int64_t d = threadIdx.x; d < kvd; d += blockDim.x) {
      dk[d] = cm::f32_to_bf16(kn[t * ldkn + d]);
      if (dv) dv[d] = cm::f32_to_bf16(vn[t * ldvn + d]);
    }
    return;
  }
  const uint8_t* page = page_of(st, f, c, j);
  const int64_t slot = j % f.page_tokens;
  const uint8_t* kr = page + f.k_offset + slot * f.row_bytes;
  const uint8_t* vr = page + f.v_offset + slot * f.row_bytes;
  const auto* ks = reinterpret_cast<const uint16_t*>(page + f.k_scale_offset) + slot * f.kv_heads;
  const auto* vs = reinterpret_cast<const uint16_t*>(page + f.v_scale_offset) + slot * f.kv_heads;
  for (int64_t d = threadIdx.x; d < kvd; d += blockDim.x) {
    if (f.elem == 0) {
      dk[d] = reinterpret_cast<const uint16_t*>(kr)[d];
      if (dv) dv[d] = reinterpret_cast<const uint16_t*>(vr)[d];
      continue;
    }
    const int64_t h = d / f.head_dim;
    const float sk = f.dynamic ? cm::bf16_to_f32(ks[h]) : f.static_k[h];
    dk[d] = cm::f32_to_bf16(kv_decode(f.elem, kr, d) * sk);
    if (dv) {
      const float sv = f.dynamic ? cm::bf16_to_f32(vs[h]) : f.static_v[h];
      dv[d] = cm::f32_to_bf16(kv_decode(f.elem, vr, d) * sv);
    }
  }
}

// ---- decode attention ---------------------------------------------------

constexpr int kDecThreads = 256;
constexpr int kDecTile = 64;   // positions per pass: K and V rows staged in shared memory
constexpr int kDecHeads = 8;   // query heads per block (one warp each in the softmax)
constexpr int64_t kSplitTokens = 512;  // positions per split: a sequence's own count decides

// Positions a decoding chunk attends over: its window (or the sparse choice).
struct DecodeSpan {
  int64_t j0, n;
  const int32_t* sel;
};
__device__ DecodeSpan decode_span(const DecodeArgs& a, const DevChunk& c) {
  if (a.topk > 0 && a.sparse[c.t0]) return {0, a.topk, a.sel + c.t0 * a.topk};
  const int64_t j0 = a.window > 0 ? max(int64_t(0), c.pos0 - a.window + 1) : 0;
  return {j0, c.pos0 - j0 + 1, nullptr};
}

// Dynamic shared memory of a decode block: q rows, the tile's scores and
// per-position scales and row pointers, then the K and V tiles (each row
// padded by 16 bytes so rows fall in different banks), reused at the end for
// the token groups' partial sums.
struct DecSmem {
  int64_t rs;  // bytes per staged row
  int64_t q, sc, ksc, vsc, kp, vp, kt, vt, total;
};
__host__ __device__ inline DecSmem dec_smem(int64_t hd, int64_t eb) {
  DecSmem m;
  m.rs = hd * eb + 16;
  m.q = 0;
  m.sc = m.q + kDecHeads * hd * 4;
  m.ksc = m.sc + kDecHeads * kDecTile * 4;
  m.vsc = m.ksc + kDecTile * 4;
  m.kp = m.vsc + kDecTile * 4;
  m.vp = m.kp + kDecTile * 8;
  m.kt = m.vp + kDecTile * 8;
  m.vt = m.kt + kDecTile * m.rs;
  const int64_t red = kDecHeads * kDecThreads * 2 * 4;
  m.total = m.kt + (2 * kDecTile * m.rs > red ? 2 * kDecTile * m.rs : red);
  return m;
}

__device__ __forceinline__ void decode2(int32_t elem, const uint8_t* row, int d, float& x0, float& x1) {
  if (elem == 0) {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(row + 2 * d);
    x0 = cm::bits_f32(u << 16);
    x1 = cm::bits_f32(u & 0xffff0000u);
  } else {
    const float2 f = fp8x2_to_f32(*reinterpret_cast<const uint16_t*>(row + d), elem);
    x0 = f.x;
    x1 = f.y;
  }
}

// Block (decode chunk, KV head x head block, split): for each tile of
// positions, the K and V rows are copied into shared memory (16-byte loads
// where the rows allow, 4-byte otherwise), the scores computed there (each
// thread one position for up to two heads), an online softmax per head (one
// warp per head), then the weighted V rows (threads over dimension pairs and
// token groups). Writes the split's unnormalized output, its max and sum.
// A sequence's splits and tiles depend on its own length only, so its result
// does not depend on the batch.
template <bool kVec16>
__global__ void __launch_bounds__(kDecThreads, 2) decode_k(DevStep st, DevKvFormat f, DecodeArgs a,
                                                        float* partial, int64_t max_splits) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float m_run[kDecHeads], l_run[kDecHeads], alpha[kDecHeads];
  const int64_t d_idx = blockIdx.x, split = blockIdx.z;
  const DevChunk& c = st.chunks[st.decode_chunks[d_idx]];
  const DecodeSpan sp = decode_span(a, c);
  const int64_t i0 = split * kSplitTokens, i1 = min(sp.n, i0 + kSplitTokens);
  if (i0 >= sp.n) return;  // past this sequence's own splits
  const int group = a.heads / a.kv_heads;
  const int hblocks = (group + kDecHeads - 1) / kDecHeads;
  const int kvh = int(blockIdx.y) / hblocks, hb = int(blockIdx.y) % hblocks;
  const int h0 = kvh * group + hb * kDecHeads;
  const int nh = min(kDecHeads, group - hb * kDecHeads);
  const int hd = a.head_dim;
  const int64_t eb = f.elem == 0 ? 2 : 1;
  const DecSmem L = dec_smem(hd, eb);
  float* qs = reinterpret_cast<float*>(smem + L.q);
  float* sc = reinterpret_cast<float*>(smem + L.sc);
  float* ksc = reinterpret_cast<float*>(smem + L.ksc);
  float* vsc = reinterpret_cast<float*>(smem + L.vsc);
  const uint8_t** kp = reinterpret_cast<const uint8_t**>(smem + L.kp);
  const uint8_t** vp = reinterpret_cast<const uint8_t**>(smem + L.vp);
  uint8_t* kt = smem + L.kt;
  uint8_t* vt = smem + L.vt;
  const int64_t row = a.rows_by_token ? c.t0 : d_idx;

  for (int i = threadIdx.x; i < kDecHeads * hd; i += blockDim.x) {
    const int h = i / hd, d = i % hd;
    qs[i] = h < nh ? a.q[row * a.ldq + int64_t(h0 + h) * hd + d] : 0.f;
  }
  if (threadIdx.x < kDecHeads) {
    m_run[threadIdx.x] = -INFINITY;
    l_run[threadIdx.x] = 0.f;
    alpha[threadIdx.x] = 1.f;
  }
  const int np = hd / 2;  // dimension pairs
  int npp = 1;
  while (npp < np) npp <<= 1;
  const int tg_n = kDecThreads / npp;  // token groups in the V pass
  const int dp = threadIdx.x % npp, tg = threadIdx.x / npp;
  float o[kDecHeads][2];
#pragma unroll
  for (int h = 0; h < kDecHeads; ++h) o[h][0] = o[h][1] = 0.f;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t rb = int64_t(hd) * eb;  // bytes of one head's row
  __syncthreads();

  for (int64_t base = i0; base < i1; base += kDecTile) {
    const int tn = int(min(int64_t(kDecTile), i1 - base));
    if (threadIdx.x < tn) {
      const int j = threadIdx.x;
      const int64_t pos = sp.sel ? int64_t(sp.sel[base + j]) : sp.j0 + base + j;
      const uint8_t* page = page_of(st, f, c, pos);
      const int64_t slot = pos % f.page_tokens;
      kp[j] = page + f.k_offset + slot * f.row_bytes + int64_t(kvh) * rb;
      vp[j] = page + f.v_offset + slot * f.row_bytes + int64_t(kvh) * rb;
      float ks = 1.f, vs = 1.f;
      if (f.elem != 0) {
        if (f.dynamic) {
          const int64_t si = slot * f.kv_heads + kvh;
          ks = cm::bf16_to_f32(reinterpret_cast<const uint16_t*>(page + f.k_scale_offset)[si]);
          vs = cm::bf16_to_f32(reinterpret_cast<const uint16_t*>(page + f.v_scale_offset)[si]);
        } else {
          ks = f.static_k[kvh];
          vs = f.static_v[kvh];
        }
      }
      ksc[j] = ks;
      vsc[j] = vs;
    }
    __syncthreads();
    // Stage the tile's K and V rows.
    if constexpr (kVec16) {
      const int cpr = int(rb / 16);
      for (int i = threadIdx.x; i < 2 * tn * cpr; i += blockDim.x) {
        const int which = i / (tn * cpr), r = i % (tn * cpr), j = r / cpr, q = r % cpr;
        const uint8_t* src = (which ? vp[j] : kp[j]) + q * 16;
        *reinterpret_cast<uint4*>((which ? vt : kt) + j * L.rs + q * 16) = *reinterpret_cast<const uint4*>(src);
      }
    } else {
      const int cpr = int(rb / 4);
      for (int i = threadIdx.x; i < 2 * tn * cpr; i += blockDim.x) {
        const int which = i / (tn * cpr), r = i % (tn * cpr), j = r / cpr, q = r % cpr;
        const uint8_t* src = (which ? vp[j] : kp[j]) + q * 4;
        *reinterpret_cast<uint32_t*>((which ? vt : kt) + j * L.rs + q * 4) = *reinterpret_cast<const uint32_t*>(src);
      }
    }
    __syncthreads();
    // Scores: four adjacent lanes per position, each over every fourth
    // dimension pair for all heads, joined by two butterfly steps.
    {
      const int j = threadIdx.x / 4, part = threadIdx.x % 4;
      const uint8_t* kr = kt + j * L.rs;
      float acc[kDecHeads];
#pragma unroll
      for (int h = 0; h < kDecHeads; ++h) acc[h] = 0.f;
      if (j < tn)
        for (int p = part; p < np; p += 4) {
          float k0, k1;
          decode2(f.elem, kr, 2 * p, k0, k1);
#pragma unroll
          for (int h = 0; h < kDecHeads; ++h)
            acc[h] = fmaf(qs[h * hd + 2 * p + 1], k1, fmaf(qs[h * hd + 2 * p], k0, acc[h]));
        }
#pragma unroll
      for (int h = 0; h < kDecHeads; ++h) {
        acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
        acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
      }
      if (part == 0) {
        const float cs = a.scale * (j < tn ? ksc[j] : 1.f);
#pragma unroll
        for (int h = 0; h < kDecHeads; ++h) sc[h * kDecTile + j] = j < tn ? acc[h] * cs : -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax: warp h owns head h.
    if (warp < nh) {
      const int h = warp;
      float* srow = sc + h * kDecTile;
      float mx = -INFINITY;
      for (int i = lane; i < tn; i += kWarp) mx = fmaxf(mx, srow[i]);
      mx = warp_max(mx);
      const float m_new = fmaxf(m_run[h], mx);
      float sum = 0.f;
      for (int i = lane; i < tn; i += kWarp) {
        const float p = m_new == -INFINITY ? 0.f : __expf(srow[i] - m_new);
        sum += p;
        srow[i] = p * vsc[i];
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float al = m_run[h] == -INFINITY ? 0.f : __expf(m_run[h] - m_new);
        alpha[h] = al;
        l_run[h] = l_run[h] * al + sum;
        m_run[h] = m_new;
      }
    }
    __syncthreads();
    // Weighted V: this thread's dimension pair over its token group.
    if (dp < np) {
#pragma unroll
      for (int h = 0; h < kDecHeads; ++h) {
        o[h][0] *= alpha[h];
        o[h][1] *= alpha[h];
      }
      for (int i = tg; i < tn; i += tg_n) {
        float v0, v1;
        decode2(f.elem, vt + i * L.rs, 2 * dp, v0, v1);
#pragma unroll
        for (int h = 0; h < kDecHeads; ++h) {
          o[h][0] = fmaf(sc[h * kDecTile + i], v0, o[h][0]);
          o[h][1] = fmaf(sc[h * kDecTile + i], v1, o[h][1]);
        }
      }
    }
    __syncthreads();
  }
  // Sum the token groups (in group order) and write the split's partial result.
  float* red = reinterpret_cast<float*>(smem + L.kt);
#pragma unroll
  for (int h = 0; h < kDecHeads; ++h) {
    red[(h * kDecThreads + threadIdx.x) * 2] = o[h][0];
    red[(h * kDecThreads + threadIdx.x) * 2 + 1] = o[h][1];
  }
  __syncthreads();
  const int64_t stride = hd + 2;
  for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) {
    const int h = i / hd, d = i % hd, p = d / 2, e = d % 2;
    float s = 0.f;
    for (int g = 0; g < tg_n; ++g) s += red[(h * kDecThreads + g * npp + p) * 2 + e];
    partial[((d_idx * a.heads + h0 + h) * max_splits + split) * stride + d] = s;
  }
  if (threadIdx.x < nh) {
    float* dst = partial + ((d_idx * a.heads + h0 + threadIdx.x) * max_splits + split) * stride;
    dst[hd] = m_run[threadIdx.x];
    dst[hd + 1] = l_run[threadIdx.x];
  }
}

// Joins a sequence's own splits for each (decode chunk, head).
__global__ void decode_combine_k(DevStep st, DecodeArgs a, const float* partial, int64_t max_splits) {
  const int64_t d_idx = blockIdx.x, h = blockIdx.y, hd = a.head_dim, stride = hd + 2;
  const DevChunk& c = st.chunks[st.decode_chunks[d_idx]];
  const int64_t splits = cdiv(decode_span(a, c).n, kSplitTokens);
  const int64_t row = a.rows_by_token ? c.t0 : d_idx;
  const float* p = partial + (d_idx * a.heads + h) * max_splits * stride;
  float M = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) M = fmaxf(M, p[s * stride + hd]);
  float L = 0.f;
  for (int64_t s = 0; s < splits; ++s) {
    const float m = p[s * stride + hd];
    if (m != -INFINITY) L += p[s * stride + hd + 1] * __expf(m - M);
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int64_t s = 0; s < splits; ++s) {
      const float m = p[s * stride + hd];
      if (m != -INFINITY) o += p[s * stride + d] * __expf(m - M);
    }
    a.out[row * a.ldo + h * hd + d] = L > 0.f ? o / L : 0.f;
  }
}

// ---- prefill attention --------------------------------------------------

constexpr int kPreKeys = 16;
constexpr int kPreThreads = 128;

__device__ bool selected(const int32_t* sel, int64_t topk, int64_t j) {
  int64_t lo = 0, hi = topk;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sel[mid] < j) lo = mid + 1; else hi = mid;
  }
  return lo < topk && sel[lo] == j;
}

// Block (task, head): up to kPrefillQ consecutive tokens of one chunk and
// one head, over tiles of kPreKeys gathered rows; online softmax per token.
__global__ void __launch_bounds__(kPreThreads) prefill_k(DevStep st, PrefillArgs a, const int64_t* tasks) {
  __shared__ float qs[kPrefillQ][kMaxAttnDim];
  __shared__ float os[kPrefillQ][kMaxAttnDim];
  __shared__ uint16_t ks[kPreKeys][kMaxAttnDim];
  __shared__ uint16_t vs[kPreKeys][kMaxAttnDim];
  __shared__ float sc[kPrefillQ][kPreKeys];
  __shared__ float m_run[kPrefillQ], l_run[kPrefillQ], alpha[kPrefillQ];
  __shared__ int64_t qpos[kPrefillQ], qj0[kPrefillQ];

  const int64_t e = tasks[blockIdx.x];
  const DevChunk& c = st.chunks[e >> 40];
  const int64_t t0 = e & ((int64_t(1) << 40) - 1);
  const int nq = int(min(int64_t(kPrefillQ), c.t0 + c.n_tokens - t0));
  const int h = blockIdx.y, kvh = h / a.group, hd = a.head_dim, vd = a.v_dim;
  const int64_t g0 = c.gather_off - c.gather_j0;
  for (int i = threadIdx.x; i < kPrefillQ * hd; i += blockDim.x) {
    const int q = i / hd, d = i % hd;
    qs[q][d] = q < nq ? a.q[(t0 + q) * a.ldq + int64_t(h) * a.q_head_stride + d] : 0.f;
  }
  for (int i = threadIdx.x; i < kPrefillQ * vd; i += blockDim.x) os[i / vd][i % vd] = 0.f;
  if (threadIdx.x < kPrefillQ) {
    const int q = threadIdx.x;
    const int64_t p = q < nq ? st.tok_pos[t0 + q] : 0;
    qpos[q] = p;
    qj0[q] = a.window > 0 ? max(int64_t(0), p - a.window + 1) : 0;
    m_run[q] = -INFINITY;
    l_run[q] = 0.f;
  }
  __syncthreads();
  // Key tiles aligned to absolute positions, so a token's arithmetic does not
  // depend on which tokens share its block (chunking leaves its bits alone);
  // rows outside [gather_j0, hi) are zeros and masked.
  const int64_t lo = qj0[0] / kPreKeys * kPreKeys, hi = qpos[nq - 1] + 1;
  for (int64_t kb = lo; kb < hi; kb += kPreKeys) {
    const int kn = int(min(int64_t(kPreKeys), hi - kb));
    for (int i = threadIdx.x; i < kn * hd; i += blockDim.x) {
      const int j = i / hd, d = i % hd;
      ks[j][d] = kb + j >= c.gather_j0 ? a.k[(g0 + kb + j) * a.ldk + int64_t(kvh) * a.k_head_stride + d] : 0;
    }
    for (int i = threadIdx.x; i < kn * vd; i += blockDim.x) {
      const int j = i / vd, d = i % vd;
      vs[j][d] = kb + j >= c.gather_j0 ? a.v[(g0 + kb + j) * a.ldv + int64_t(kvh) * a.v_head_stride + d] : 0;
    }
    __syncthreads();
    {
      const int q = threadIdx.x / kPreKeys, j = threadIdx.x % kPreKeys;
      float s = -INFINITY;
      const int64_t pj = kb + j;
      if (q < nq && j < kn && pj >= qj0[q] && pj <= qpos[q]) {
        float acc = 0.f;
        for (int d = 0; d < hd; ++d) acc = fmaf(qs[q][d], cm::bf16_to_f32(ks[j][d]), acc);
        s = acc * a.scale;
        if (a.softcap > 0.f) s = tanhf(s / a.softcap) * a.softcap;
        if (a.topk > 0 && a.sparse[t0 + q] && !selected(a.sel + (t0 + q) * a.topk, a.topk, pj))
          s = -INFINITY;
      }
      sc[q][j] = s;
    }
    __syncthreads();
    if (threadIdx.x < nq) {
      const int q = threadIdx.x;
      float mx = m_run[q];
      for (int j = 0; j < kn; ++j) mx = fmaxf(mx, sc[q][j]);
      float sum = 0.f;
      for (int j = 0; j < kn; ++j) {
        const float p = mx == -INFINITY ? 0.f : __expf(sc[q][j] - mx);
        sc[q][j] = p;
        sum += p;
      }
      const float al = m_run[q] == -INFINITY ? 0.f : __expf(m_run[q] - mx);
      alpha[q] = al;
      l_run[q] = l_run[q] * al + sum;
      m_run[q] = mx;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nq * vd; i += blockDim.x) {
      const int q = i / vd, d = i % vd;
      float o = os[q][d] * alpha[q];
      for (int j = 0; j < kn; ++j) o = fmaf(sc[q][j], cm::bf16_to_f32(vs[j][d]), o);
      os[q][d] = o;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < nq * vd; i += blockDim.x) {
    const int q = i / vd, d = i % vd;
    a.out[(t0 + q) * a.ldo + int64_t(h) * vd + d] = l_run[q] > 0.f ? os[q][d] / l_run[q] : 0.f;
  }
}

}  // namespace

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

int64_t linear_scratch_bytes(int64_t m, const DevWeights& w) { return m * w.k * 2; }

void linear(const float* x, int64_t ldx, int64_t m, const DevWeights& w, float* y, int64_t ldy,
            uint16_t* scratch, cudaStream_t s) {
  if (m == 0 || w.n == 0) return;
  const int64_t chunk = w.kind == WKind::kBf16 ? 8 : w.kind == WKind::kFp8 ? 16 : 32;
  const bool vec = w.k % chunk == 0 && !w.nan_codes &&
                   (w.kind == WKind::kBf16 || (w.group % chunk == 0 && w.gshift >= 0));
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

void kv_store(const DevStep& st, const DevKvFormat& f, const float* k, int64_t ldk, const float* v,
              int64_t ldv, cudaStream_t s) {
  if (st.n_tokens == 0) return;
  const int th = f.kv_heads >= 8 ? 256 : 32 * f.kv_heads;
  kv_store_k<<<unsigned(st.n_tokens), th, 0, s>>>(st, f, k, ldk, v, ldv);
}

void kv_store_index(const DevStep& st, const DevKvFormat& f, const float* k, int64_t ldk,
                    cudaStream_t s) {
  if (st.n_tokens > 0) kv_store_index_k<<<unsigned(st.n_tokens), 128, 0, s>>>(st, f, k, ldk);
}

void kv_gather(const DevStep& st, const DevKvFormat& f, const float* k_new, int64_t ldkn,
               const float* v_new, int64_t ldvn, uint16_t* gk, int64_t ldgk, uint16_t* gv,
               int64_t ldgv, cudaStream_t s) {
  if (st.n_gather > 0)
    kv_gather_k<<<unsigned(st.n_gather), 256, 0, s>>>(st, f, k_new, ldkn, v_new, ldvn, gk, ldgk, gv, ldgv);
}

int64_t decode_partial_floats(int64_t n_decode, int64_t heads, int64_t head_dim, int64_t max_ctx) {
  return n_decode * heads * cdiv(max_ctx > 0 ? max_ctx : 1, kSplitTokens) * (head_dim + 2);
}

void attention_decode(const DevStep& st, const DevKvFormat& f, const DecodeArgs& a, float* partial,
                      cudaStream_t s) {
  if (st.n_decode == 0) return;
  const int64_t group = a.heads / a.kv_heads, hblocks = cdiv(group, kDecHeads);
  const int64_t max_splits = cdiv(st.max_ctx > 0 ? st.max_ctx : 1, kSplitTokens);
  const int64_t eb = f.elem == 0 ? 2 : 1, rb = int64_t(a.head_dim) * eb;
  const DecSmem L = dec_smem(a.head_dim, eb);
  // 16-byte row copies when every row of every page starts 16-byte aligned.
  const bool vec16 = rb % 16 == 0 && f.row_bytes % 16 == 0 && f.k_offset % 16 == 0 &&
                     f.v_offset % 16 == 0 && f.layer_off % 16 == 0 && f.layer_bytes % 16 == 0;
  static bool configured[2] = {false, false};
  if (!configured[vec16]) {
    const int bytes = int(dec_smem(kMaxAttnDim, 2).total);
    if (vec16)
      cudaFuncSetAttribute(decode_k<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    else
      cudaFuncSetAttribute(decode_k<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    configured[vec16] = true;
  }
  const dim3 g(unsigned(st.n_decode), unsigned(a.kv_heads * hblocks), unsigned(max_splits));
  if (vec16)
    decode_k<true><<<g, kDecThreads, size_t(L.total), s>>>(st, f, a, partial, max_splits);
  else
    decode_k<false><<<g, kDecThreads, size_t(L.total), s>>>(st, f, a, partial, max_splits);
  decode_combine_k<<<dim3(unsigned(st.n_decode), unsigned(a.heads)), 128, 0, s>>>(st, a, partial, max_splits);
}

void attention_prefill(const DevStep& st, const PrefillArgs& a, const int64_t* prefill_tasks,
                       int64_t n_tasks, cudaStream_t s) {
  if (n_tasks > 0)
    prefill_k<<<dim3(unsigned(n_tasks), unsigned(a.heads)), kPreThreads, 0, s>>>(st, a, prefill_tasks);
}

}  // namespace kvant::cuda
