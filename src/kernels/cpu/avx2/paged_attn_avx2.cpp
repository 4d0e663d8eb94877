// AVX2 paged_attn_decode (contract in kernels.h): the AVX-512 version's
// structure at 8 lanes. FP8 is decoded through FP16 by bit manipulation
// (e5m2 is FP16's top byte; e4m3 shifted into FP16's fields is its value
// times 2^-8, the 2^8 folded into the per-token factors) and widened with
// F16C's VCVTPH2PS, exactly. e4m3 NaN codes: scores find them per row (one
// byte compare per 32 codes; rows without one skip the per-element select),
// the weighted sum selects per element (as cheap there as a row check).
// Scores go 8 tokens at a time for blocks of up to 4 heads: the tokens' 8-lane
// partial dot products are reduced together by a transpose-and-add tree whose
// levels pair lane l with l+4, l+2, l+1 (avx2::hsum's tree, so every score is
// bitwise attn_scores'), then scaled by the 8 tokens' factors in one multiply.
// The weighted sum reads each V row once per block of up to 4 heads (16
// registers) and is the sequential FMA over t of attn_weighted_sum; FP8
// probabilities take their V scales 8 tokens at a time inside that pass.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx2/avx2_common.h"
#include "kernels/cpu/paged_attn_common.h"

namespace kvant::kernels::avx2 {
namespace {

// First n bytes of p (n may exceed 8) into the low 8 bytes, the rest 0.
inline __m128i load8_part(const uint8_t* p, int64_t n) {
  if (n >= 8) return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  alignas(16) uint8_t t[16] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i];
  return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}

// 8 elements (past n: 0) of a row as FP32; e4m3 comes out times 2^-8. With
// Exact false an e4m3 NaN code decodes as a finite value (callers check rows
// with e4m3_has_nan first).
template <KvDType E, bool Exact = true>
inline __m256 decode8(const uint8_t* p, int64_t n) {
  if constexpr (E == KvDType::kBf16) {
    return load_bf16_part(reinterpret_cast<const uint16_t*>(p), n);
  } else {
    const __m128i w = _mm_unpacklo_epi8(_mm_setzero_si128(), load8_part(p, n));  // code << 8
    if constexpr (E == KvDType::kFp8E5m2) {
      return _mm256_cvtph_ps(w);
    } else {
      // S.EEEE.MMM << 8, arithmetic >> 1 copies S into bit 14; clear it.
      const __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16(short(0xbfff)));
      if constexpr (!Exact) return _mm256_cvtph_ps(h);
      // NaN codes (FP16 bits x.01111.111.0000000) become all-ones, an FP16 NaN.
      const __m128i nan16 =
          _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x3f80)), _mm_set1_epi16(0x3f80));
      return _mm256_cvtph_ps(_mm_or_si128(h, nan16));
    }
  }
}

// Whether bytes [0, n) of p hold an e4m3 NaN code (S.1111.111).
inline bool e4m3_has_nan(const uint8_t* p, int64_t n) {
  __m256i any = _mm256_setzero_si256();
  int64_t d = 0;
  for (; d + 32 <= n; d += 32)
    any = _mm256_or_si256(
        any, _mm256_cmpeq_epi8(
                 _mm256_or_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + d)),
                                 _mm256_set1_epi8(-128)),
                 _mm256_set1_epi8(-1)));
  __m128i tail = _mm_setzero_si128();
  for (; d < n; d += 8)  // bytes past n load as 0, never a NaN code
    tail = _mm_or_si128(tail, _mm_cmpeq_epi8(_mm_or_si128(load8_part(p + d, n - d),
                                                          _mm_set1_epi8(-128)),
                                             _mm_set1_epi8(-1)));
  return (_mm256_movemask_epi8(any) | _mm_movemask_epi8(tail)) != 0;
}

// The same slot kPrefetchPages pages on (see paged_attn_common.h).
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + b), _MM_HINT_T0);
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

template <KvDType E>
constexpr float kFold = E == KvDType::kFp8E4m3 ? 256.f : 1.f;

// 8 BF16 scales (uint16 bits) -> FP32, exact.
inline __m256 bf16x8_to_ps(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Scales of tokens t0 .. t0+nb-1 (token t0 at page pg, slot i); lanes past nb are 0.
inline __m256 block_scales(const uint16_t* const* sc, const PagedKv& kv, int64_t pg, int64_t i,
                           int nb) {
  const int64_t ss = kv.scale_stride;
  alignas(16) uint16_t tmp[8] = {};
  if (i + nb <= kv.page_tokens) {  // one page
    const uint16_t* b = sc[pg] + i * ss;
    if (ss == 1 && nb == 8) return bf16x8_to_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    // Strided: scalar loads (a gather is slower on CPUs with the GDS mitigation).
    if (nb == 8) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) tmp[j] = b[j * ss];
    } else {
      for (int j = 0; j < nb; ++j) tmp[j] = b[j * ss];
    }
    return bf16x8_to_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
  }
  for (int j = 0; j < nb; ++j) {
    tmp[j] = sc[pg][i * kv.scale_stride];
    if (++i == kv.page_tokens) i = 0, ++pg;
  }
  return bf16x8_to_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

// The reduction tree: inputs are per-token 8-lane partial sums. Each level
// adds lane l to lane l + w of the same token (w = 4, 2, 1: hsum's tree).
// [a0 (4 partials) | a1 (4)]
inline __m256 tree1(__m256 a0, __m256 a1) {
  return _mm256_add_ps(_mm256_blend_ps(a0, a1, 0xf0), _mm256_permute2f128_ps(a0, a1, 0x21));
}
// [b0 = T0 | T1] [b1 = T2 | T3] -> half k: [T_k x2 | T_{k+2} x2].
inline __m256 tree2(__m256 b0, __m256 b1) {
  return _mm256_add_ps(_mm256_blend_ps(b0, b1, 0xcc),
                       _mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(1, 0, 3, 2)));
}
// [c0 = T0..T3] [c1 = T4..T7] -> lane 4k + m holds token k + 2m.
inline __m256 tree3(__m256 c0, __m256 c1) {
  return _mm256_add_ps(_mm256_shuffle_ps(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(c0, c1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// s[h * lds + t] for heads [0, H) of the block starting at q.
template <KvDType E, int H>
void scores_block(const float* q, int64_t hd, float scale, const PagedKv& kv, float* s,
                  int64_t lds) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E), pt = kv.page_tokens;
  const int64_t pages = (n + pt - 1) / pt;
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const float static_c = E == KvDType::kBf16 ? scale : scale * kv.k_scale * kFold<E>;
  int64_t pg = 0, i = 0;  // where token t0 lives
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    const int nb = int(std::min<int64_t>(8, n - t0));
    const uint8_t* rows[8];
    bool nan = false;
    int64_t p2 = pg, i2 = i;
    for (int j = 0; j < nb; ++j) {
      rows[j] = kv.k_pages[p2] + i2 * kv.token_stride;
      if (p2 + kPrefetchPages < pages)
        prefetch_row(kv.k_pages[p2 + kPrefetchPages] + i2 * kv.token_stride, hd * eb);
      if constexpr (E != KvDType::kBf16) {
          // The V scales too: the pass that reads them is too short to hide misses.
          prefetch_next_scales(kv.k_scales, p2, i2, kv);
          prefetch_next_scales(kv.v_scales, p2, i2, kv);
        }
      if constexpr (E == KvDType::kFp8E4m3) nan |= e4m3_has_nan(rows[j], hd);
      if (++i2 == pt) i2 = 0, ++p2;
    }
    for (int j = nb; j < 8; ++j) rows[j] = rows[0];  // lanes not stored
    __m256 c = _mm256_set1_ps(static_c);
    if (E != KvDType::kBf16 && kv.k_scales)
      c = _mm256_mul_ps(
          _mm256_mul_ps(_mm256_set1_ps(scale), block_scales(kv.k_scales, kv, pg, i, nb)),
          _mm256_set1_ps(kFold<E>));
    __m256 b_even[H], c_first[H], e[H];
#pragma GCC unroll 4
    for (int pr = 0; pr < 4; ++pr) {
      __m256 acc0[H], acc1[H];
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) acc0[h] = acc1[h] = _mm256_setzero_ps();
      const uint8_t* r0 = rows[2 * pr];
      const uint8_t* r1 = rows[2 * pr + 1];
      for (int64_t d = 0; d < hd; d += 8) {
        const __m256 k0 = decode8<E, false>(r0 + d * eb, hd - d);
        const __m256 k1 = decode8<E, false>(r1 + d * eb, hd - d);
#pragma GCC unroll 4
        for (int h = 0; h < H; ++h) {
          const __m256 qv = load_part(q + h * hd + d, hd - d);
          acc0[h] = _mm256_fmadd_ps(qv, k0, acc0[h]);
          acc1[h] = _mm256_fmadd_ps(qv, k1, acc1[h]);
        }
      }
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        const __m256 b = tree1(acc0[h], acc1[h]);
        if (pr % 2 == 0) {
          b_even[h] = b;
          continue;
        }
        const __m256 cc = tree2(b_even[h], b);
        if (pr == 1)
          c_first[h] = cc;
        else
          e[h] = tree3(c_first[h], cc);
      }
    }
    __m256 nm = _mm256_setzero_ps();  // rare: NaN scores for the rows holding a NaN code
    if (nan) {
      alignas(32) int32_t flags[8] = {};
      for (int j = 0; j < nb; ++j) flags[j] = e4m3_has_nan(rows[j], hd) ? -1 : 0;
      nm = _mm256_load_ps(reinterpret_cast<const float*>(flags));
    }
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const __m256 v = _mm256_mul_ps(_mm256_permutevar8x32_ps(e[h], unshuffle), c);
      store_part(s + h * lds + t0, _mm256_blendv_ps(v, _mm256_set1_ps(kNan), nm), nb);
    }
    pg = p2, i = i2;
  }
}

// out[h * hd + d0 .. d0 + width) for heads [0, H). With scale_p (FP8, first
// pass), p[h, t] *= vs_t * kFold 8 tokens ahead of their use, so the V scales
// stream in with the V rows.
template <KvDType E, int H, int C>
void wsum_block(float* p, int64_t ldp, int64_t hd, const PagedKv& kv, int64_t d0, int64_t width,
                float* out, bool scale_p) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E);
  __m256 acc[H][C];
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[h][c] = _mm256_setzero_ps();
  const int64_t pt = kv.page_tokens, pages = (n + pt - 1) / pt;
  int64_t pg = 0, i = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (E != KvDType::kBf16 && scale_p && t % 8 == 0) {
      const int nb = int(std::min<int64_t>(8, n - t));
      const __m256 vs =
          kv.v_scales ? block_scales(kv.v_scales, kv, pg, i, nb) : _mm256_set1_ps(kv.v_scale);
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        float* ph = p + h * ldp + t;
        store_part(ph, _mm256_mul_ps(_mm256_mul_ps(load_part(ph, nb), vs), _mm256_set1_ps(kFold<E>)),
                   nb);
      }
    }
    if constexpr (E != KvDType::kBf16) prefetch_next_scales(kv.v_scales, pg, i, kv);
    const uint8_t* row = kv.v_pages[pg] + i * kv.token_stride + d0 * eb;
    if (pg + kPrefetchPages < pages)
      prefetch_row(kv.v_pages[pg + kPrefetchPages] + i * kv.token_stride + d0 * eb, width * eb);
    // e4m3 NaN codes: the per-element select costs about what a per-row
    // check would here, so it is always taken.
    __m256 v[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      v[c] = 8 * c < width ? decode8<E>(row + 8 * c * eb, width - 8 * c) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m256 w = _mm256_broadcast_ss(p + h * ldp + t);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[h][c] = _mm256_fmadd_ps(w, v[c], acc[h][c]);
    }
    if (++i == pt) i = 0, ++pg;
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      if (8 * c < width) store_part(out + h * hd + d0 + 8 * c, acc[h][c], width - 8 * c);
}

// out[h * hd + d] for d in [d0, d1); with scale_first, the first block scales p.
template <KvDType E, int H>
void wsum_heads(float* p, int64_t ldp, int64_t hd, const PagedKv& kv, int64_t d0, int64_t d1,
                float* out, bool scale_first) {
  // H * C accumulators + C decoded chunks + 1 broadcast within 16 registers.
  constexpr int C = H <= 2 ? 4 : (H == 3 ? 3 : 2);
  for (int64_t d = d0; d < d1; d += 8 * C)
    wsum_block<E, H, C>(p, ldp, hd, kv, d, std::min<int64_t>(8 * C, d1 - d), out,
                        scale_first && d == d0);
}

template <KvDType E>
void scores(const float* q, int64_t group, int64_t hd, float scale, const PagedKv& kv, float* s,
            int64_t lds) {
  for (int64_t h0 = 0; h0 < group; h0 += 4) {
    const float* qb = q + h0 * hd;
    float* sb = s + h0 * lds;
    switch (std::min<int64_t>(4, group - h0)) {
      case 1:
        scores_block<E, 1>(qb, hd, scale, kv, sb, lds);
        break;
      case 2:
        scores_block<E, 2>(qb, hd, scale, kv, sb, lds);
        break;
      case 3:
        scores_block<E, 3>(qb, hd, scale, kv, sb, lds);
        break;
      default:
        scores_block<E, 4>(qb, hd, scale, kv, sb, lds);
        break;
    }
  }
}

template <KvDType E>
void wsum(float* p, int64_t ldp, int64_t group, int64_t hd, const PagedKv& kv, int64_t d0,
          int64_t d1, float* out, bool scale_first) {
  for (int64_t h0 = 0; h0 < group; h0 += 4) {
    float* pb = p + h0 * ldp;
    float* ob = out + h0 * hd;
    switch (std::min<int64_t>(4, group - h0)) {
      case 1:
        wsum_heads<E, 1>(pb, ldp, hd, kv, d0, d1, ob, scale_first);
        break;
      case 2:
        wsum_heads<E, 2>(pb, ldp, hd, kv, d0, d1, ob, scale_first);
        break;
      case 3:
        wsum_heads<E, 3>(pb, ldp, hd, kv, d0, d1, ob, scale_first);
        break;
      default:
        wsum_heads<E, 4>(pb, ldp, hd, kv, d0, d1, ob, scale_first);
        break;
    }
  }
}

template <KvDType E>
void run(const float* q, int64_t group, int64_t hd, float scale, const PagedKv& kv, float* scratch,
         float* out) {
  const int64_t n = kv.n_tokens;
  prefetch_lead_pages(kv, hd * kv_elem_bytes(E));
  scores<E>(q, group, hd, scale, kv, scratch, n);
  for (int64_t h = 0; h < group; ++h) softmax(scratch + h * n, n);
  // FP8: the first d block scales the probabilities as it streams the V scales.
  wsum<E>(scratch, n, group, hd, kv, 0, hd, out, true);
}

}  // namespace

void paged_attn_decode(const float* q, int64_t group, int64_t head_dim, float scale,
                       const PagedKv& kv, float* scratch, float* out) {
  with_elem(kv.elem, [&](auto E) { run<E()>(q, group, head_dim, scale, kv, scratch, out); });
}

void paged_attn_scores(const float* q, int64_t group, int64_t head_dim, float scale,
                       const PagedKv& kv, float* s, int64_t lds) {
  with_elem(kv.elem, [&](auto E) { scores<E()>(q, group, head_dim, scale, kv, s, lds); });
}

void paged_attn_probs(float* s, int64_t lds, int64_t group, const PagedKv& kv) {
  const float fold = kv.elem == KvDType::kFp8E4m3 ? kFold<KvDType::kFp8E4m3> : 1.f;
  probs_pass(s, lds, group, kv, fold, [](float* x, int64_t n) { softmax(x, n); });
}

void paged_attn_wsum(const float* p, int64_t lds, int64_t group, int64_t head_dim,
                     const PagedKv& kv, int64_t d0, int64_t d1, float* out) {
  float* pm = const_cast<float*>(p);  // not written: no scaling pass
  with_elem(kv.elem, [&](auto E) { wsum<E()>(pm, lds, group, head_dim, kv, d0, d1, out, false); });
}

}  // namespace kvant::kernels::avx2
