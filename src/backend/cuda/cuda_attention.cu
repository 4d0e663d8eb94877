// The CUDA backend's KV page and attention kernels (cuda_kernels.h): rows
// into page slots in the page dtype (bitwise the CPU backend's bytes), BF16
// context rows for prefill, split-context paged decode attention over K/V
// tiles staged in shared memory (FP8 decoded there), and a tiled causal
// prefill attention over the gathered BF16 rows.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_util.cuh"

namespace kvant::cuda {
namespace {

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

// Copies the tile's K and V rows (tn of rb bytes each) into the shared
// tiles (rows rs bytes apart): 16-byte copies where every row allows, else
// 4-byte ones.
template <bool kVec16>
__device__ __forceinline__ void stage_rows(const uint8_t* const* kp, const uint8_t* const* vp, uint8_t* kt,
                                           uint8_t* vt, int tn, int64_t rb, int64_t rs) {
  constexpr int kBytes = kVec16 ? 16 : 4;
  using Word = std::conditional_t<kVec16, uint4, uint32_t>;
  const int cpr = int(rb / kBytes);
  for (int i = threadIdx.x; i < 2 * tn * cpr; i += blockDim.x) {
    const int which = i / (tn * cpr), r = i % (tn * cpr), j = r / cpr, q = r % cpr;
    const uint8_t* src = (which ? vp[j] : kp[j]) + q * kBytes;
    *reinterpret_cast<Word*>((which ? vt : kt) + j * rs + q * kBytes) = *reinterpret_cast<const Word*>(src);
  }
}

// One head's online-softmax step over a tile's scores (one warp): the
// running max and sum move on, the scores become probabilities times each
// position's V scale, and alpha rescales what was accumulated before.
__device__ __forceinline__ void tile_softmax(float* srow, const float* vsc, int tn, int lane, float& m_run,
                                             float& l_run, float& alpha) {
  float mx = -INFINITY;
  for (int i = lane; i < tn; i += kWarp) mx = fmaxf(mx, srow[i]);
  mx = warp_max(mx);
  const float m_new = fmaxf(m_run, mx);
  float sum = 0.f;
  for (int i = lane; i < tn; i += kWarp) {
    const float p = m_new == -INFINITY ? 0.f : __expf(srow[i] - m_new);
    sum += p;
    srow[i] = p * vsc[i];
  }
  sum = warp_sum(sum);
  if (lane == 0) {
    const float al = m_run == -INFINITY ? 0.f : __expf(m_run - m_new);
    alpha = al;
    l_run = l_run * al + sum;
    m_run = m_new;
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
    stage_rows<kVec16>(kp, vp, kt, vt, tn, rb, L.rs);
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
    if (warp < nh) tile_softmax(sc + warp * kDecTile, vsc, tn, lane, m_run[warp], l_run[warp], alpha[warp]);
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
