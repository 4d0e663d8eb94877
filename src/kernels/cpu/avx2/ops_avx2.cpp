// AVX2 row kernels: BF16 conversions, rmsnorm, gated activations, softmax and
// the attention helpers (contracts in kernels.h). Lane sums reduce through
// avx2::hsum's fixed tree; a row's lanes depend only on its own length, so
// results are deterministic and independent of batching.

#include <cmath>
#include <limits>

#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx2/avx2_common.h"

namespace kvant::kernels::avx2 {
namespace {

// 8 FP32 -> 8 BF16 (as dwords), round to nearest even, NaN -> quiet NaN.
inline __m256i round_bf16(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  // Both sides are below 2^31, so the signed compare is an unsigned one.
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

inline uint16_t round_bf16_scalar(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline __m256 gated(__m256 g, __m256 up, __m256 z) {
  const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.f), exp_ps(z));
  return _mm256_mul_ps(_mm256_div_ps(g, den), up);
}

}  // namespace

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = round_bf16(_mm256_loadu_ps(src + i));
    const __m256i b = round_bf16(_mm256_loadu_ps(src + i + 8));
    // packus works per 128-bit lane: a0-3 b0-3 a4-7 b4-7; the permute restores order.
    const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = round_bf16_scalar(src[i]);
}

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(src + i));
  if (i < n) store_part(dst + i, load_bf16_part(src + i, n - i), n - i);
}

void rmsnorm(const float* x, const float* w, float w_offset, float eps, float* y, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = load_part(x + i, n - i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  const float inv = 1.f / std::sqrt(hsum(acc) / float(n) + eps);
  const __m256 s = _mm256_set1_ps(inv), off = _mm256_set1_ps(w_offset);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_mul_ps(load_part(x + i, n - i), s);
    store_part(y + i, _mm256_mul_ps(v, _mm256_add_ps(load_part(w + i, n - i), off)), n - i);
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = load_part(gate + i, n - i);
    const __m256 z = _mm256_sub_ps(_mm256_setzero_ps(), g);
    store_part(out + i, gated(g, load_part(up + i, n - i), z), n - i);
  }
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  // 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)): no cancellation for negative g.
  const __m256 c2 = _mm256_set1_ps(-2.f * 0.7978845608028654f), c3 = _mm256_set1_ps(0.044715f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = load_part(gate + i, n - i);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(c3, g), _mm256_mul_ps(g, g), g);
    store_part(out + i, gated(g, load_part(up + i, n - i), _mm256_mul_ps(c2, inner)), n - i);
  }
}

// As avx512's argmax: the largest value, then the first index holding it.
int64_t argmax(const float* x, int64_t n) {
  if (n <= 1 || std::isnan(x[0])) return 0;
  const __m256 first = _mm256_set1_ps(x[0]);
  __m256 mx = first;
  for (int64_t i = 0; i < n; i += 8) mx = _mm256_max_ps(load_part_fill(x + i, n - i, first), mx);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const __m256 m = _mm256_set1_ps(_mm_cvtss_f32(m4));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), m, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(unsigned(hit));
  }
  for (; i < n; ++i)
    if (x[i] == _mm256_cvtss_f32(m)) return i;
  return 0;  // not reached: the maximum is one of the values
}

void softmax(float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  __m256 mx = ninf;
  for (int64_t i = 0; i < n; i += 8) mx = _mm256_max_ps(mx, load_part_fill(x + i, n - i, ninf));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float mxs = _mm_cvtss_f32(m4);  // max is exact in any order
  if (mxs == kNegInf) {
    for (int64_t i = 0; i < n; i += 8) store_part(x + i, _mm256_setzero_ps(), n - i);
    return;
  }
  const __m256 vmx = _mm256_set1_ps(mxs);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(load_part_fill(x + i, n - i, ninf), vmx));
    sum = _mm256_add_ps(sum, e);  // lanes past n are exp(-inf) = 0
    store_part(x + i, e, n - i);
  }
  const __m256 inv = _mm256_set1_ps(1.f / hsum(sum));
  for (int64_t i = 0; i < n; i += 8)
    store_part(x + i, _mm256_mul_ps(load_part(x + i, n - i), inv), n - i);
}

void attn_scores(const float* q, const uint16_t* k, int64_t ldk, int64_t n, int64_t head_dim,
                 float scale, float* scores) {
  // Four rows at a time share the q loads; each row keeps its own accumulator
  // and chunk order, the same as when it runs alone.
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t d = 0; d < head_dim; d += 8) {
      const __m256 qv = load_part(q + d, head_dim - d);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
        acc[r] = _mm256_fmadd_ps(qv, load_bf16_part(k + (t + r) * ldk + d, head_dim - d), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) scores[t + r] = hsum(acc[r]) * scale;
  }
  for (; t < n; ++t) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 8)
      acc = _mm256_fmadd_ps(load_part(q + d, head_dim - d),
                            load_bf16_part(k + t * ldk + d, head_dim - d), acc);
    scores[t] = hsum(acc) * scale;
  }
}

namespace {
// out[d0 : d0 + 8C] (last chunk clipped to `last` lanes), sequential over t.
template <int C>
void weighted_sum_block(const float* p, const uint16_t* v, int64_t ldv, int64_t n, int64_t d0,
                        int64_t last, float* out) {
  __m256 acc[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const __m256 pt = _mm256_broadcast_ss(p + t);
    const uint16_t* vt = v + t * ldv + d0;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m256 vv = c == C - 1 ? load_bf16_part(vt + 8 * c, last) : load_bf16(vt + 8 * c);
      acc[c] = _mm256_fmadd_ps(pt, vv, acc[c]);
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) store_part(out + d0 + 8 * c, acc[c], c == C - 1 ? last : 8);
}
}  // namespace

namespace {
// The multi-query kernels take the rows in blocks: each block of K (then V)
// is widened to FP32 once into a stack buffer (rows padded with zeros to a
// multiple of 8 lanes) and then serves every query of the call, so the
// inner loops are loads and FMAs only. The arithmetic is the one-query
// kernels' own, term for term.
constexpr int64_t kBlockFloats = 8192;  // 32 KB: one block stays in L1

inline int64_t padded_dim(int64_t hd) { return (hd + 7) / 8 * 8; }
// Rows per block for a head of hd (a multiple of 4, at least 4).
inline int64_t block_rows(int64_t hd) {
  return std::max<int64_t>(4, kBlockFloats / padded_dim(hd) / 4 * 4);
}

// Rows [0, n) of BF16 x (stride ld, hd values each) -> FP32 rows of hdp
// floats, zero past hd.
void widen_rows(const uint16_t* x, int64_t ld, int64_t n, int64_t hd, float* out) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < hdp; d += 8)
      _mm256_store_ps(out + t * hdp + d, d + 8 <= hd ? load_bf16(x + t * ld + d)
                                                     : load_bf16_part(x + t * ld + d, hd - d));
}

// Four rows' dot-product accumulators (lane l holds the terms d = l mod 8)
// -> their four hsum() values, each summed in hsum's own tree:
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), so the bits are equal.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  // [a: l_i + l_i+4 | b: ...], [c | d]
  const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  // [a: b0 + b2, b1 + b3, c: ..., | b: ..., d: ...]
  const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // lanes 0, 2, 4, 6: a, c, b, d summed
  const __m256 s = _mm256_add_ps(w, _mm256_shuffle_ps(w, w, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 2, 6, 0, 0, 0, 0)));
}

// Scores of M (1 or 2) queries against 4 widened rows kb (stride hdp).
template <int M>
inline void scores_tile(const float* q, int64_t ldq, int64_t hd, const float* kb, int64_t hdp,
                        __m128 scale, float* s, int64_t lds) {
  __m256 acc[M][4];
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hdp; d += 8) {
    __m256 qv[M];
#pragma GCC unroll 2
    for (int i = 0; i < M; ++i) qv[i] = load_part(q + i * ldq + d, hd - d);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      __m256 kv = _mm256_load_ps(kb + r * hdp + d);
      // One load per row for both queries (GCC would fold it into each FMA,
      // loading it M times).
      asm("" : "+x"(kv));
#pragma GCC unroll 2
      for (int i = 0; i < M; ++i) acc[i][r] = _mm256_fmadd_ps(qv[i], kv, acc[i][r]);
    }
  }
#pragma GCC unroll 2
  for (int i = 0; i < M; ++i)
    _mm_storeu_ps(s + i * lds, _mm_mul_ps(hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), scale));
}

// Weighted sums of M queries, lanes [d0, d0 + 8C) (last chunk: `last` lanes),
// over widened rows [t0, t1) of V (vb holds row t0 first, stride hdp), each
// query clipped to its own n[i]. out holds the sums over rows before t0 when
// `accumulate` (stored as FP32 and reloaded: the same bits). Every lane sums
// its terms in order t = 0, 1, ..., one FMA each, as weighted_sum_block does.
template <int M, int C>
void weighted_sum_multi_block(const float* p, int64_t ldp, const int64_t* n, int64_t t0, int64_t t1,
                              const float* vb, int64_t hdp, int64_t d0, int64_t last, float* out,
                              int64_t ldo, bool accumulate) {
  __m256 acc[M][C];
  int64_t n_min = t1;
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i) {
    n_min = std::min(n_min, n[i]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      acc[i][c] = accumulate ? load_part(out + i * ldo + d0 + 8 * c, c == C - 1 ? last : 8)
                             : _mm256_setzero_ps();
  }
  for (int64_t t = t0; t < n_min; ++t) {
    const float* vt = vb + (t - t0) * hdp + d0;
    __m256 vv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) vv[c] = _mm256_load_ps(vt + 8 * c);
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) {
      const __m256 pt = _mm256_broadcast_ss(p + i * ldp + t);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[i][c] = _mm256_fmadd_ps(pt, vv[c], acc[i][c]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i) {
    const int64_t end = std::min(n[i], t1);
    for (int64_t t = std::max(n_min, t0); t < end; ++t) {
      const __m256 pt = _mm256_broadcast_ss(p + i * ldp + t);
      const float* vt = vb + (t - t0) * hdp + d0;
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[i][c] = _mm256_fmadd_ps(pt, _mm256_load_ps(vt + 8 * c), acc[i][c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      store_part(out + i * ldo + d0 + 8 * c, acc[i][c], c == C - 1 ? last : 8);
  }
}

// M queries' sums over rows [t0, t1), every 32-lane block of the head.
template <int M>
void weighted_sum_multi_rows(const float* p, int64_t ldp, const int64_t* n, int64_t t0, int64_t t1,
                             const float* vb, int64_t hd, float* out, int64_t ldo, bool accumulate) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t d0 = 0; d0 < hd; d0 += 32) {
    const int64_t width = std::min<int64_t>(32, hd - d0);
    const int chunks = int((width + 7) / 8);
    const int64_t last = width - 8 * (chunks - 1);
    switch (chunks) {
      case 1:
        weighted_sum_multi_block<M, 1>(p, ldp, n, t0, t1, vb, hdp, d0, last, out, ldo, accumulate);
        break;
      case 2:
        weighted_sum_multi_block<M, 2>(p, ldp, n, t0, t1, vb, hdp, d0, last, out, ldo, accumulate);
        break;
      case 3:
        weighted_sum_multi_block<M, 3>(p, ldp, n, t0, t1, vb, hdp, d0, last, out, ldo, accumulate);
        break;
      default:
        weighted_sum_multi_block<M, 4>(p, ldp, n, t0, t1, vb, hdp, d0, last, out, ldo, accumulate);
        break;
    }
  }
}
}  // namespace

void attn_scores_multi(const float* q, int64_t ldq, int64_t m, const uint16_t* k, int64_t ldk,
                       int64_t n, int64_t head_dim, float scale, float* scores, int64_t lds) {
  // Each (query, row) score is computed on its own, with attn_scores' lanes,
  // term order and hsum tree: blocking and tiling change no bits.
  alignas(32) float kb[kBlockFloats];
  const int64_t hdp = padded_dim(head_dim), rows = block_rows(head_dim);
  const __m128 sc = _mm_set1_ps(scale);
  const int64_t n4 = n / 4 * 4;
  for (int64_t t0 = 0; t0 < n4; t0 += rows) {
    const int64_t nb = std::min(rows, n4 - t0);
    widen_rows(k + t0 * ldk, ldk, nb, head_dim, kb);
    int64_t i = 0;
    for (; i + 2 <= m; i += 2)
      for (int64_t t = 0; t < nb; t += 4)
        scores_tile<2>(q + i * ldq, ldq, head_dim, kb + t * hdp, hdp, sc, scores + i * lds + t0 + t, lds);
    if (i < m)
      for (int64_t t = 0; t < nb; t += 4)
        scores_tile<1>(q + i * ldq, ldq, head_dim, kb + t * hdp, hdp, sc, scores + i * lds + t0 + t, lds);
  }
  if (n4 < n)
    for (int64_t i = 0; i < m; ++i)
      attn_scores(q + i * ldq, k + n4 * ldk, ldk, n - n4, head_dim, scale, scores + i * lds + n4);
}

void attn_weighted_sum_multi(const float* p, int64_t ldp, const int64_t* n, int64_t m,
                             const uint16_t* v, int64_t ldv, int64_t head_dim, float* out,
                             int64_t ldo) {
  // Rows in widened blocks (outer), two queries x four 8-lane chunks per
  // pass (8 accumulators); partial sums pass through out as FP32.
  alignas(32) float vb[kBlockFloats];
  const int64_t rows = block_rows(head_dim);
  int64_t n_max = 0;
  for (int64_t i = 0; i < m; ++i) n_max = std::max(n_max, n[i]);
  // (One pass even with no rows: the sums are then zero.)
  for (int64_t t0 = 0; t0 == 0 || t0 < n_max; t0 += rows) {
    const int64_t t1 = std::min(t0 + rows, n_max);
    widen_rows(v + t0 * ldv, ldv, t1 - t0, head_dim, vb);
    int64_t i = 0;
    for (; i + 2 <= m; i += 2)
      weighted_sum_multi_rows<2>(p + i * ldp, ldp, n + i, t0, t1, vb, head_dim, out + i * ldo, ldo,
                                 t0 > 0);
    if (i < m)
      weighted_sum_multi_rows<1>(p + i * ldp, ldp, n + i, t0, t1, vb, head_dim, out + i * ldo, ldo,
                                 t0 > 0);
  }
}

void attn_weighted_sum(const float* p, const uint16_t* v, int64_t ldv, int64_t n, int64_t head_dim,
                       float* out) {
  constexpr int64_t kBlock = 8 * 8;  // 8 accumulators per pass over t
  for (int64_t d0 = 0; d0 < head_dim; d0 += kBlock) {
    const int64_t width = std::min(kBlock, head_dim - d0);
    const int chunks = int((width + 7) / 8);
    const int64_t last = width - 8 * (chunks - 1);
    switch (chunks) {
      case 1:
        weighted_sum_block<1>(p, v, ldv, n, d0, last, out);
        break;
      case 2:
        weighted_sum_block<2>(p, v, ldv, n, d0, last, out);
        break;
      case 3:
        weighted_sum_block<3>(p, v, ldv, n, d0, last, out);
        break;
      case 4:
        weighted_sum_block<4>(p, v, ldv, n, d0, last, out);
        break;
      case 5:
        weighted_sum_block<5>(p, v, ldv, n, d0, last, out);
        break;
      case 6:
        weighted_sum_block<6>(p, v, ldv, n, d0, last, out);
        break;
      case 7:
        weighted_sum_block<7>(p, v, ldv, n, d0, last, out);
        break;
      default:
        weighted_sum_block<8>(p, v, ldv, n, d0, last, out);
        break;
    }
  }
}

}  // namespace kvant::kernels::avx2
