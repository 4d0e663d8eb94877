// AVX-512 row kernels: BF16 conversions, rmsnorm, gated activations, softmax
// and the attention helpers (contracts in kernels.h). Lane sums always reduce
// through avx512::hsum's fixed tree, and a row's lanes depend only on its own
// length, so results are deterministic and independent of batching.

#include <cmath>
#include <limits>

#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/avx512_common.h"

namespace kvant::kernels::avx512 {
namespace {

// 16 FP32 -> 16 BF16 (as dwords), round to nearest even, NaN -> quiet NaN.
inline __m512i round_bf16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

// g * up / (1 + exp(-s * g')) where the caller supplies z = -s * g'.
inline __m512 gated(__m512 g, __m512 up, __m512 z) {
  const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.f), exp_ps(z));
  return _mm512_mul_ps(_mm512_div_ps(g, den), up);
}

}  // namespace

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, 0xffff, round_bf16(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 m = mask16(n - i);
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, round_bf16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(src + i));
  if (i < n) {
    const __mmask16 m = mask16(n - i);
    _mm512_mask_storeu_ps(dst + i, m, maskz_load_bf16(m, src + i));
  }
}

void rmsnorm(const float* x, const float* w, float w_offset, float eps, float* y, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(mask16(n - i), x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float inv = 1.f / std::sqrt(hsum(acc) / float(n) + eps);
  const __m512 s = _mm512_set1_ps(inv), off = _mm512_set1_ps(w_offset);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_mul_ps(v, _mm512_add_ps(_mm512_maskz_loadu_ps(m, w + i), off)));
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 z = _mm512_sub_ps(_mm512_setzero_ps(), g);
    _mm512_mask_storeu_ps(out + i, m, gated(g, _mm512_maskz_loadu_ps(m, up + i), z));
  }
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  // 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)): no cancellation for negative g.
  const __m512 c2 = _mm512_set1_ps(-2.f * 0.7978845608028654f), c3 = _mm512_set1_ps(0.044715f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(c3, g), _mm512_mul_ps(g, g), g);
    _mm512_mask_storeu_ps(out + i, m,
                          gated(g, _mm512_maskz_loadu_ps(m, up + i), _mm512_mul_ps(c2, inner)));
  }
}

// Two passes: the largest value (MAXPS with x first passes over NaN lanes,
// and max is exact in any order), then the first index holding it; equal to
// the scalar loop's index (kernels.h).
int64_t argmax(const float* x, int64_t n) {
  if (n <= 1 || std::isnan(x[0])) return 0;
  __m512 mx = _mm512_set1_ps(x[0]);
  for (int64_t i = 0; i < n; i += 16)
    mx = _mm512_max_ps(_mm512_mask_loadu_ps(mx, mask16(n - i), x + i), mx);
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 hit =
        _mm512_mask_cmp_ps_mask(mask16(n - i), _mm512_maskz_loadu_ps(mask16(n - i), x + i), m, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(unsigned(hit));
  }
  return 0;  // not reached: the maximum is one of the values
}

void softmax(float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mx = ninf;
  for (int64_t i = 0; i < n; i += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, mask16(n - i), x + i));
  const float mxs = _mm512_reduce_max_ps(mx);  // max is exact in any order
  if (mxs == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; i += 16)
      _mm512_mask_storeu_ps(x + i, mask16(n - i), _mm512_setzero_ps());
    return;
  }
  const __m512 vmx = _mm512_set1_ps(mxs);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, m, x + i), vmx));
    sum = _mm512_add_ps(sum, e);  // masked-off lanes are exp(-inf) = 0
    _mm512_mask_storeu_ps(x + i, m, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / hsum(sum));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

void attn_scores(const float* q, const uint16_t* k, int64_t ldk, int64_t n, int64_t head_dim,
                 float scale, float* scores) {
  // Sixteen rows at a time: each row keeps its own accumulator and chunk
  // order, and the sixteen 16-lane sums are reduced together by the tree of
  // avx512_common.h, which adds lanes in hsum's order, so every score is
  // bitwise what the row gives alone (and what paged_attn_decode gives).
  const __m512i unshuffle = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    __m512 b_even = _mm512_setzero_ps(), c_even = _mm512_setzero_ps(),
           d_first = _mm512_setzero_ps();
    __m512 e = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int pr = 0; pr < 8; ++pr) {
      __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      const uint16_t* r0 = k + (t + 2 * pr) * ldk;
      const uint16_t* r1 = r0 + ldk;
      for (int64_t d = 0; d < head_dim; d += 16) {
        const __mmask16 m = mask16(head_dim - d);
        const __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
        acc0 = _mm512_fmadd_ps(qv, maskz_load_bf16(m, r0 + d), acc0);
        acc1 = _mm512_fmadd_ps(qv, maskz_load_bf16(m, r1 + d), acc1);
      }
      const __m512 b = tree1(acc0, acc1);
      if (pr % 2 == 0) {
        b_even = b;
        continue;
      }
      const __m512 cc = tree2(b_even, b);
      if (pr % 4 == 1) {
        c_even = cc;
        continue;
      }
      const __m512 dd = tree3(c_even, cc);
      if (pr == 3)
        d_first = dd;
      else
        e = tree4(d_first, dd);
    }
    _mm512_storeu_ps(scores + t, _mm512_mul_ps(_mm512_permutexvar_ps(unshuffle, e), sc));
  }
  for (; t + 4 <= n; t += 4) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int64_t d = 0; d < head_dim; d += 16) {
      const __mmask16 m = mask16(head_dim - d);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
        acc[r] = _mm512_fmadd_ps(qv, maskz_load_bf16(m, k + (t + r) * ldk + d), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) scores[t + r] = hsum(acc[r]) * scale;
  }
  for (; t < n; ++t) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 16) {
      const __mmask16 m = mask16(head_dim - d);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), maskz_load_bf16(m, k + t * ldk + d),
                            acc);
    }
    scores[t] = hsum(acc) * scale;
  }
}

namespace {
// out[d0 : d0 + 16C] (last chunk clipped to `last` lanes), sequential over t.
template <int C>
void weighted_sum_block(const float* p, const uint16_t* v, int64_t ldv, int64_t n, int64_t d0,
                        __mmask16 last, float* out) {
  __m512 acc[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const __m512 pt = _mm512_set1_ps(p[t]);
    const uint16_t* vt = v + t * ldv + d0;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512 vv = c == C - 1 ? maskz_load_bf16(last, vt + 16 * c) : load_bf16(vt + 16 * c);
      acc[c] = _mm512_fmadd_ps(pt, vv, acc[c]);
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c)
    _mm512_mask_storeu_ps(out + d0 + 16 * c, c == C - 1 ? last : __mmask16(0xffff), acc[c]);
}
}  // namespace

namespace {
// The multi-query kernels take the rows in blocks: each block of K (then V)
// is widened to FP32 once into a stack buffer (rows padded with zeros to a
// multiple of 16 lanes; K in quads, below) and then serves every query of
// the call, so the inner loops are loads, FMAs and the reduction tree. The
// arithmetic is the one-query kernels' own, term for term (a padded zero is
// what the masked BF16 load gives).
constexpr int64_t kBlockFloats = 8192;  // 32 KB: one block stays in L1
constexpr int64_t kScoreBlockFloats = 4096;

inline int64_t padded_dim(int64_t hd) { return (hd + 15) / 16 * 16; }
// Rows per block for a head of hd (a multiple of 16); 0: the head is too
// wide for the buffer (over 512), and the rows are read as BF16 directly.
inline int64_t block_rows(int64_t hd) { return kBlockFloats / padded_dim(hd) / 16 * 16; }

// Rows [0, n) of BF16 x (stride ld, hd values each) -> FP32 rows of hdp
// floats, zero past hd.
void widen_rows(const uint16_t* x, int64_t ld, int64_t n, int64_t hd, float* out) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < hdp; d += 16)
      _mm512_store_ps(out + t * hdp + d, maskz_load_bf16(mask16(hd - d), x + t * ld + d));
}

// Scores of M (up to four) queries against BF16 rows [0, n), n a multiple
// of 16, row t at k + t * ldk (heads too wide for the staging buffer): the
// rows of a pair are loaded once and feed every query's own accumulators;
// each query's sums follow attn_scores exactly (same chunk order, same
// tree), so results are bitwise its one-query values.
template <int M>
void scores_multi_pass(const float* q, int64_t ldq, const uint16_t* k, int64_t ldk, int64_t n,
                       int64_t hd, float scale, float* scores, int64_t lds) {
  const __m512i unshuffle = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t t = 0; t + 16 <= n; t += 16) {
    __m512 b_even[M], c_even[M], d_first[M], e[M];
#pragma GCC unroll 8
    for (int pr = 0; pr < 8; ++pr) {
      __m512 acc0[M], acc1[M];
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
      const uint16_t* r0 = k + (t + 2 * pr) * ldk;
      const uint16_t* r1 = r0 + ldk;
      for (int64_t d = 0; d < hd; d += 16) {
        const __mmask16 m = mask16(hd - d);
        const __m512 k0 = maskz_load_bf16(m, r0 + d), k1 = maskz_load_bf16(m, r1 + d);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          const __m512 qv = _mm512_maskz_loadu_ps(m, q + i * ldq + d);
          acc0[i] = _mm512_fmadd_ps(qv, k0, acc0[i]);
          acc1[i] = _mm512_fmadd_ps(qv, k1, acc1[i]);
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        const __m512 b = tree1(acc0[i], acc1[i]);
        if (pr % 2 == 0) {
          b_even[i] = b;
          continue;
        }
        const __m512 cc = tree2(b_even[i], b);
        if (pr % 4 == 1) {
          c_even[i] = cc;
          continue;
        }
        const __m512 dd = tree3(c_even[i], cc);
        if (pr == 3)
          d_first[i] = dd;
        else
          e[i] = tree4(d_first[i], dd);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i)
      _mm512_storeu_ps(scores + i * lds + t,
                       _mm512_mul_ps(_mm512_permutexvar_ps(unshuffle, e[i]), sc));
  }
}

// All m queries against BF16 rows [0, n) (n a multiple of 16), four at a time.
void scores_multi_rows(const float* q, int64_t ldq, int64_t m, const uint16_t* k, int64_t ldk, int64_t n,
                       int64_t hd, float scale, float* scores, int64_t lds) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    scores_multi_pass<4>(q + i * ldq, ldq, k, ldk, n, hd, scale, scores + i * lds, lds);
  switch (m - i) {
    case 3:
      scores_multi_pass<3>(q + i * ldq, ldq, k, ldk, n, hd, scale, scores + i * lds, lds);
      break;
    case 2:
      scores_multi_pass<2>(q + i * ldq, ldq, k, ldk, n, hd, scale, scores + i * lds, lds);
      break;
    case 1:
      scores_multi_pass<1>(q + i * ldq, ldq, k, ldk, n, hd, scale, scores + i * lds, lds);
      break;
    default:
      break;
  }
}

// K rows staged for the multi-query scores in quads: for every 4 rows and
// 16-lane chunk j, four vectors, vector a holding lanes 4a .. 4a+3 of chunk
// j of rows 0, 1, 2 and 3 side by side (a 4 x 4 transpose of 128-bit
// blocks). A query's 16 lane partials of those rows then lie in four
// accumulators, and the first two levels of hsum's tree (lane l with l+8,
// then with l+4) are vertical adds of whole vectors: the tree's shuffles are
// left for its last two levels only. Rows [0, n), n a multiple of 4; a quad
// takes 4 * padded_dim(hd) floats, zero past hd.
void widen_quads(const uint16_t* x, int64_t ld, int64_t n, int64_t hd, float* out) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t t = 0; t < n; t += 4, out += 4 * hdp)
    for (int64_t d = 0; d < hdp; d += 16) {
      const __mmask16 m = mask16(hd - d);
      const uint16_t* r = x + t * ld + d;
      const __m512 z0 = maskz_load_bf16(m, r), z1 = maskz_load_bf16(m, r + ld);
      const __m512 z2 = maskz_load_bf16(m, r + 2 * ld), z3 = maskz_load_bf16(m, r + 3 * ld);
      const __m512 t0 = _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(1, 0, 1, 0));
      const __m512 t1 = _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 2, 3, 2));
      const __m512 t2 = _mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(1, 0, 1, 0));
      const __m512 t3 = _mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(3, 2, 3, 2));
      float* o = out + 4 * d;
      _mm512_store_ps(o, _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0)));
      _mm512_store_ps(o + 16, _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1)));
      _mm512_store_ps(o + 32, _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0)));
      _mm512_store_ps(o + 48, _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1)));
    }
}

// Scores of M queries (qp: their rows zero-padded to hdp) against quad-staged
// rows [0, n), n a multiple of 16, G quads at a time. Per row and lane the
// FMA chain over the chunks is scores_multi_pass's; levels 1-2 add the same
// pairs (P[l] + P[l+8], then + (P[l+4] + P[l+12])) as tree1 and tree2, and
// tree3 / tree4 finish as there: bitwise attn_scores' values.
template <int M, int G>
void scores_quads_pass(const float* qp, int64_t hdp, const float* kq, int64_t n, float scale,
                       float* scores, int64_t lds) {
  const __m512i unshuffle = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t t = 0; t + 16 <= n; t += 16) {
    __m512 c_prev[M], d_first[M], e[M];
#pragma GCC unroll 4
    for (int qg = 0; qg < 4; qg += G) {
      __m512 acc[M][G][4];
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
          for (int a = 0; a < 4; ++a) acc[i][g][a] = _mm512_setzero_ps();
      const float* base = kq + (t + 4 * qg) * hdp;
      for (int64_t d = 0; d < hdp; d += 16) {
        __m512 kv[G][4];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
          for (int a = 0; a < 4; ++a) kv[g][a] = _mm512_load_ps(base + g * 4 * hdp + 4 * d + 16 * a);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
          for (int a = 0; a < 4; ++a) {
            const __m512 qb = _mm512_load_ps(qp + 4 * (i * hdp + d) + 16 * a);
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) acc[i][g][a] = _mm512_fmadd_ps(qb, kv[g][a], acc[i][g][a]);
          }
      }
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512 c = _mm512_add_ps(_mm512_add_ps(acc[i][g][0], acc[i][g][2]),
                                         _mm512_add_ps(acc[i][g][1], acc[i][g][3]));
          const int quad = qg + g;
          if (quad % 2 == 0)
            c_prev[i] = c;
          else if (quad == 1)
            d_first[i] = tree3(c_prev[i], c);
          else
            e[i] = tree4(d_first[i], tree3(c_prev[i], c));
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i)
      _mm512_storeu_ps(scores + i * lds + t,
                       _mm512_mul_ps(_mm512_permutexvar_ps(unshuffle, e[i]), sc));
  }
}

// One query, head 64 (four chunks): its 16 broadcast quarters stay in
// registers and the rows come in as FMA memory operands, G quads at a time.
template <int G>
void scores_quads_q64(const float* qp, const float* kq, int64_t n, float scale, float* scores) {
  const __m512i unshuffle = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 qv[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) qv[j] = _mm512_load_ps(qp + 16 * j);
  for (int64_t t = 0; t + 16 <= n; t += 16) {
    __m512 c_prev = _mm512_setzero_ps(), d_first = c_prev, e = c_prev;
#pragma GCC unroll 4
    for (int qg = 0; qg < 4; qg += G) {
      const float* base = kq + (t + 4 * qg) * 64;
      __m512 acc[G][4];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
        for (int a = 0; a < 4; ++a) acc[g][a] = _mm512_fmadd_ps(qv[a], _mm512_load_ps(base + g * 256 + 16 * a), _mm512_setzero_ps());
#pragma GCC unroll 4
      for (int j = 1; j < 4; ++j)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
          for (int a = 0; a < 4; ++a)
            acc[g][a] = _mm512_fmadd_ps(qv[4 * j + a], _mm512_load_ps(base + g * 256 + 64 * j + 16 * a), acc[g][a]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m512 c = _mm512_add_ps(_mm512_add_ps(acc[g][0], acc[g][2]), _mm512_add_ps(acc[g][1], acc[g][3]));
        const int quad = qg + g;
        if (quad % 2 == 0)
          c_prev = c;
        else if (quad == 1)
          d_first = tree3(c_prev, c);
        else
          e = tree4(d_first, tree3(c_prev, c));
      }
    }
    _mm512_storeu_ps(scores + t, _mm512_mul_ps(_mm512_permutexvar_ps(unshuffle, e), sc));
  }
}

// All m queries against quad-staged rows [0, n) (n a multiple of 16).
// qp[4 * (i * hdp + d) + 16 * a + l] = q[i * ldq + d + 4 * a + l % 4] for
// 16-lane chunks d of each query i < m (zero past hd): every 4-lane quarter
// of a chunk broadcast to a whole vector, once per call.
void broadcast_quarters(const float* q, int64_t ldq, int64_t m, int64_t hd, float* qp) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t d = 0; d < hdp; d += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(mask16(hd - d), q + i * ldq + d);
      float* o = qp + 4 * (i * hdp + d);
      _mm512_store_ps(o, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(0, 0, 0, 0)));
      _mm512_store_ps(o + 16, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 1, 1, 1)));
      _mm512_store_ps(o + 32, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 2, 2, 2)));
      _mm512_store_ps(o + 48, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 3, 3, 3)));
    }
}

// All m queries (qp: broadcast_quarters) against quad-staged rows [0, n)
// (n a multiple of 16).
void scores_quads(const float* qp, int64_t m, const float* kq, int64_t n, int64_t hd, float scale,
                  float* scores, int64_t lds) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t i0 = 0; i0 < m; i0 += 4) {
    const int64_t mm = std::min<int64_t>(4, m - i0);
    const float* qi = qp + 4 * i0 * hdp;
    float* s = scores + i0 * lds;
    if (hdp == 64) {
      for (int64_t i = 0; i < mm; ++i)
        scores_quads_q64<2>(qi + 4 * i * hdp, kq, n, scale, s + i * lds);
      continue;
    }
    switch (mm) {
      case 4:
        scores_quads_pass<4, 1>(qi, hdp, kq, n, scale, s, lds);
        break;
      case 3:
        scores_quads_pass<3, 1>(qi, hdp, kq, n, scale, s, lds);
        break;
      case 2:
        scores_quads_pass<2, 2>(qi, hdp, kq, n, scale, s, lds);
        break;
      default:
        scores_quads_pass<1, 2>(qi, hdp, kq, n, scale, s, lds);
        break;
    }
  }
}

// Weighted sums of M queries, lanes [d0, d0 + 16C) (last chunk: `last`
// lanes), over widened rows [t0, t1) of V (vb holds row t0 first, stride
// hdp), each query clipped to its own n[i]. out holds the sums over rows
// before t0 when `accumulate` (stored as FP32 and reloaded: the same bits).
// Every lane sums its terms in order t = 0, 1, ..., one FMA each, as
// weighted_sum_block does.
template <int M, int C>
void weighted_sum_multi_block(const float* p, int64_t ldp, const int64_t* n, int64_t t0, int64_t t1,
                              const float* vb, int64_t hdp, int64_t d0, __mmask16 last, float* out,
                              int64_t ldo, bool accumulate) {
  __m512 acc[M][C];
  int64_t n_min = t1;
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) {
    n_min = std::min(n_min, n[i]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      acc[i][c] = accumulate ? _mm512_maskz_loadu_ps(c == C - 1 ? last : __mmask16(0xffff),
                                                     out + i * ldo + d0 + 16 * c)
                             : _mm512_setzero_ps();
  }
  for (int64_t t = t0; t < n_min; ++t) {
    const float* vt = vb + (t - t0) * hdp + d0;
    __m512 vv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) vv[c] = _mm512_load_ps(vt + 16 * c);
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const __m512 pt = _mm512_set1_ps(p[i * ldp + t]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[i][c] = _mm512_fmadd_ps(pt, vv[c], acc[i][c]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) {
    const int64_t end = std::min(n[i], t1);
    for (int64_t t = std::max(n_min, t0); t < end; ++t) {
      const __m512 pt = _mm512_set1_ps(p[i * ldp + t]);
      const float* vt = vb + (t - t0) * hdp + d0;
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c)
        acc[i][c] = _mm512_fmadd_ps(pt, _mm512_load_ps(vt + 16 * c), acc[i][c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      _mm512_mask_storeu_ps(out + i * ldo + d0 + 16 * c, c == C - 1 ? last : __mmask16(0xffff),
                            acc[i][c]);
  }
}

// M queries' sums over rows [t0, t1), every 64-lane block of the head.
template <int M>
void weighted_sum_multi_rows(const float* p, int64_t ldp, const int64_t* n, int64_t t0, int64_t t1,
                             const float* vb, int64_t hd, float* out, int64_t ldo, bool accumulate) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    const int64_t width = std::min<int64_t>(64, hd - d0);
    const int chunks = int((width + 15) / 16);
    const __mmask16 last = mask16(width - 16 * (chunks - 1));
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

// Eight queries x two 16-lane chunks per pass (16 accumulators, one
// broadcast probability per two FMAs): on Zen 4 25% faster than four x four.
void weighted_sum_multi_rows8(const float* p, int64_t ldp, const int64_t* n, int64_t t0,
                              int64_t t1, const float* vb, int64_t hd, float* out, int64_t ldo,
                              bool accumulate) {
  const int64_t hdp = padded_dim(hd);
  for (int64_t d0 = 0; d0 < hd; d0 += 32) {
    const int64_t width = std::min<int64_t>(32, hd - d0);
    if (width > 16)
      weighted_sum_multi_block<8, 2>(p, ldp, n, t0, t1, vb, hdp, d0, mask16(width - 16), out, ldo,
                                     accumulate);
    else
      weighted_sum_multi_block<8, 1>(p, ldp, n, t0, t1, vb, hdp, d0, mask16(width), out, ldo,
                                     accumulate);
  }
}
}  // namespace

void attn_scores_multi(const float* q, int64_t ldq, int64_t m, const uint16_t* k, int64_t ldk,
                       int64_t n, int64_t head_dim, float scale, float* scores, int64_t lds) {
  const int64_t n16 = n / 16 * 16, rows = block_rows(head_dim);
  if (rows == 0) {
    scores_multi_rows(q, ldq, m, k, ldk, n16, head_dim, scale, scores, lds);
  } else {
    // Smaller blocks than the weighted sums': the rows of a block are read
    // once per query, with the broadcast queries beside them in L1.
    alignas(64) float kb[kBlockFloats];  // srows <= block_rows: 16 rows of up to 512
    const int64_t srows = std::max<int64_t>(16, kScoreBlockFloats / padded_dim(head_dim) / 16 * 16);
    // Not std::vector: its out-of-line members are shared between
    // translation units, and a copy built here with AVX-512 flags could be
    // the one the whole program links.
    struct QBuf {
      float* p = nullptr;
      size_t n = 0;
      ~QBuf() { delete[] p; }
    };
    thread_local QBuf qbuf;
    const size_t qfloats = size_t(4 * m * padded_dim(head_dim));
    if (qbuf.n < qfloats + 16) {
      delete[] qbuf.p;
      qbuf.p = new float[qfloats + 16];
      qbuf.n = qfloats + 16;
    }
    float* qp = qbuf.p + (16 - (reinterpret_cast<uintptr_t>(qbuf.p) / 4) % 16) % 16;
    broadcast_quarters(q, ldq, m, head_dim, qp);
    for (int64_t t0 = 0; t0 < n16; t0 += srows) {
      const int64_t nb = std::min(srows, n16 - t0);
      widen_quads(k + t0 * ldk, ldk, nb, head_dim, kb);
      scores_quads(qp, m, kb, nb, head_dim, scale, scores + t0, lds);
    }
  }
  // The tail (fewer than 16 rows): attn_scores' own paths, per query.
  if (n16 < n)
    for (int64_t i = 0; i < m; ++i)
      attn_scores(q + i * ldq, k + n16 * ldk, ldk, n - n16, head_dim, scale, scores + i * lds + n16);
}

void attn_weighted_sum_multi(const float* p, int64_t ldp, const int64_t* n, int64_t m,
                             const uint16_t* v, int64_t ldv, int64_t head_dim, float* out,
                             int64_t ldo) {
  // Rows in widened blocks (outer), four queries x four 16-lane chunks per
  // pass (16 accumulators); partial sums pass through out as FP32. Heads too
  // wide for the buffer take the one-query kernel per query.
  const int64_t rows = block_rows(head_dim);
  if (rows == 0) {
    for (int64_t i = 0; i < m; ++i)
      attn_weighted_sum(p + i * ldp, v, ldv, n[i], head_dim, out + i * ldo);
    return;
  }
  alignas(64) float vb[kBlockFloats];
  int64_t n_max = 0;
  for (int64_t i = 0; i < m; ++i) n_max = std::max(n_max, n[i]);
  // (One pass even with no rows: the sums are then zero.)
  for (int64_t t0 = 0; t0 == 0 || t0 < n_max; t0 += rows) {
    const int64_t t1 = std::min(t0 + rows, n_max);
    widen_rows(v + t0 * ldv, ldv, t1 - t0, head_dim, vb);
    int64_t i = 0;
    for (; i + 8 <= m; i += 8)
      weighted_sum_multi_rows8(p + i * ldp, ldp, n + i, t0, t1, vb, head_dim, out + i * ldo, ldo,
                               t0 > 0);
    for (; i + 4 <= m; i += 4)
      weighted_sum_multi_rows<4>(p + i * ldp, ldp, n + i, t0, t1, vb, head_dim, out + i * ldo, ldo,
                                 t0 > 0);
    switch (m - i) {
      case 3:
        weighted_sum_multi_rows<3>(p + i * ldp, ldp, n + i, t0, t1, vb, head_dim, out + i * ldo,
                                   ldo, t0 > 0);
        break;
      case 2:
        weighted_sum_multi_rows<2>(p + i * ldp, ldp, n + i, t0, t1, vb, head_dim, out + i * ldo,
                                   ldo, t0 > 0);
        break;
      case 1:
        weighted_sum_multi_rows<1>(p + i * ldp, ldp, n + i, t0, t1, vb, head_dim, out + i * ldo,
                                   ldo, t0 > 0);
        break;
      default:
        break;
    }
  }
}

void attn_weighted_sum(const float* p, const uint16_t* v, int64_t ldv, int64_t n, int64_t head_dim,
                       float* out) {
  constexpr int64_t kBlock = 8 * 16;  // 8 accumulators per pass over t
  for (int64_t d0 = 0; d0 < head_dim; d0 += kBlock) {
    const int64_t width = std::min(kBlock, head_dim - d0);
    const int chunks = int((width + 15) / 16);
    const __mmask16 last = mask16(width - 16 * (chunks - 1));
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

}  // namespace kvant::kernels::avx512
