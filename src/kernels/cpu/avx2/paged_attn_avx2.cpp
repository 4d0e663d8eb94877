// AVX2 paged_attn_decode (contract in kernels.h): the AVX-512 version's
// structure at 8 lanes. FP8 is decoded as there (paged_attn_common.h's
// F8Lanes): a 32-byte load holds codes 4j .. 4j+3 in 32-bit lane j, and
// chunk t (0 .. 3) is code 4j+t shifted to the lane's top byte, shifted back
// arithmetically and masked, the code's value times 2^-bias exactly; q is
// permuted to the chunks' order and multiplied by 2^K, the probabilities by
// 2^bias (the V fold), and the weighted sums un-permute their accumulators once.
// Special codes (e4m3 NaN, e5m2 Inf/NaN) are found with one byte compare per
// 32 codes; a score block that meets one is recomputed decoding them, a V
// row with one decodes them.
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

// FP8 lanes (F8Lanes): `top` holds a code in bits 31..24 of each lane.
template <KvDType E>
inline __m256 f8_lanes(__m256i top) {
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(top, F8Lanes<E>::shift),
                                              _mm256_set1_epi32(int(F8Lanes<E>::mask))));
}
// Special codes' lanes of f8_lanes' result as FP32 Inf/NaN.
template <KvDType E>
inline __m256 f8_fix_special(__m256 x) {
  const __m256i b = _mm256_castps_si256(x), sp = _mm256_set1_epi32(int(F8Lanes<E>::special));
  const __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(b, sp), sp);
  return _mm256_castsi256_ps(_mm256_or_si256(b, _mm256_and_si256(m, _mm256_set1_epi32(0x7f800000))));
}
// Byte lanes of c that are special codes, as all-ones (zero bytes never are).
template <KvDType E>
inline __m256i f8_special_bytes(__m256i c) {
  const __m256i sb = _mm256_set1_epi8(char(F8Lanes<E>::special_byte));
  return _mm256_cmpeq_epi8(_mm256_and_si256(c, sb), sb);
}

// First n bytes of p (n may exceed 32) into a vector, the rest 0.
inline __m256i load32_part(const uint8_t* p, int64_t n) {
  if (n >= 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  alignas(32) uint8_t t[32] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
}
inline __m128i load16_part(const uint8_t* p, int64_t n) {
  if (n >= 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  alignas(16) uint8_t t[16] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i];
  return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}

// 8 elements (past n: 0) of a row as exact FP32 values (FP8: specials
// included), in order: the plain path's decode.
template <KvDType E>
inline __m256 decode8(const uint8_t* p, int64_t n) {
  if constexpr (E == KvDType::kBf16) {
    return load_bf16_part(reinterpret_cast<const uint16_t*>(p), n);
  } else {
    const __m256i top = _mm256_slli_epi32(_mm256_cvtepu8_epi32(load8_part(p, n)), 24);
    return _mm256_mul_ps(f8_fix_special<E>(f8_lanes<E>(top)), _mm256_set1_ps(F8Lanes<E>::unbias));
  }
}

// 32 codes of a row (past n: 0): lane j holds codes 4j .. 4j+3; chunk t
// (0 .. 3) is codes 4j+t as FP32 times 2^-bias. `special` gains the bytes
// that are special codes.
template <KvDType E>
struct Block32 {
  __m256i w;
  Block32(const uint8_t* p, int64_t n, __m256i* special) {
    w = load32_part(p, n);
    *special = _mm256_or_si256(*special, f8_special_bytes<E>(w));
  }
  template <bool Exact = false>
  __m256 chunk(int t) const {
    const __m256 x = f8_lanes<E>(t == 3 ? w : _mm256_slli_epi32(w, unsigned(24 - 8 * t)));
    return Exact ? f8_fix_special<E>(x) : x;
  }
};
// 16 codes: lane j holds codes 2j, 2j+1; chunk t (0, 1) is codes 2j+t.
template <KvDType E>
struct Block16 {
  __m256i w;
  Block16(const uint8_t* p, int64_t n, __m256i* special) {
    const __m128i c = load16_part(p, n);
    *special = _mm256_or_si256(*special, f8_special_bytes<E>(_mm256_zextsi128_si256(c)));
    w = _mm256_cvtepu16_epi32(c);
  }
  template <bool Exact = false>
  __m256 chunk(int t) const {
    const __m256 x = f8_lanes<E>(_mm256_slli_epi32(w, unsigned(24 - 8 * t)));
    return Exact ? f8_fix_special<E>(x) : x;
  }
};

// out[0 .. n) from a weighted sum block's chunks: C = 4 (Block32: out[4j + t]
// = a[t][j]) or C = 2 (Block16: out[2j + t] = a[t][j]).
template <int C>
inline void store_perm(float* out, const __m256* a, int64_t n) {
  if constexpr (C == 4) {
    const __m256 ab_lo = _mm256_unpacklo_ps(a[0], a[1]), ab_hi = _mm256_unpackhi_ps(a[0], a[1]);
    const __m256 cd_lo = _mm256_unpacklo_ps(a[2], a[3]), cd_hi = _mm256_unpackhi_ps(a[2], a[3]);
    auto pd = [](__m256 x) { return _mm256_castps_pd(x); };
    auto ps = [](__m256d x) { return _mm256_castpd_ps(x); };
    // x_m: codes 4m .. 4m+3 | 4(m+4) .. +3.
    const __m256 x0 = ps(_mm256_unpacklo_pd(pd(ab_lo), pd(cd_lo)));
    const __m256 x1 = ps(_mm256_unpackhi_pd(pd(ab_lo), pd(cd_lo)));
    const __m256 x2 = ps(_mm256_unpacklo_pd(pd(ab_hi), pd(cd_hi)));
    const __m256 x3 = ps(_mm256_unpackhi_pd(pd(ab_hi), pd(cd_hi)));
    store_part(out, _mm256_permute2f128_ps(x0, x1, 0x20), n);
    store_part(out + 8, _mm256_permute2f128_ps(x2, x3, 0x20), n - 8);
    store_part(out + 16, _mm256_permute2f128_ps(x0, x1, 0x31), n - 16);
    store_part(out + 24, _mm256_permute2f128_ps(x2, x3, 0x31), n - 24);
  } else {
    const __m256 lo = _mm256_unpacklo_ps(a[0], a[1]), hi = _mm256_unpackhi_ps(a[0], a[1]);
    store_part(out, _mm256_permute2f128_ps(lo, hi, 0x20), n);
    store_part(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31), n - 8);
  }
}

// Permuted q of a head block lives on the stack: up to this many floats.
constexpr int64_t kQpFloats = 8 * 1024;

// The same slot kPrefetchPages pages on (see paged_attn_common.h).
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + b), _MM_HINT_T0);
}

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

// s[h * lds + t] for heads [0, H) of the block starting at q (row stride
// ldq). Perm (FP8 only): q is permute_q's layout (fold[h]: its 2^(bias -
// K_h)) and rows are read as Block32s; otherwise rows are decoded in order to
// exact values.
// HD: the head size when it is a compile-time constant (64, 128: loops
// unrolled, no partial blocks), else 0.
template <KvDType E, int H, bool Perm, int HD>
void scores_block(const float* q, int64_t ldq, int64_t hd_arg, float scale, const PagedKv& kv,
                  float* s, int64_t lds, const float* fold) {
  const int64_t hd = HD ? HD : hd_arg;
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E), pt = kv.page_tokens;
  const int64_t pages = (n + pt - 1) / pt;
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const float static_c = E == KvDType::kBf16 ? scale : scale * kv.k_scale;
  int64_t pg = 0, i = 0;  // where token t0 lives
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    const int nb = int(std::min<int64_t>(8, n - t0));
    const uint8_t* rows[8];
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
      if (++i2 == pt) i2 = 0, ++p2;
    }
    for (int j = nb; j < 8; ++j) rows[j] = rows[0];  // lanes not stored
    __m256 c = _mm256_set1_ps(static_c);
    if (E != KvDType::kBf16 && kv.k_scales)
      c = _mm256_mul_ps(_mm256_set1_ps(scale), block_scales(kv.k_scales, kv, pg, i, nb));
    __m256 e[H];
    __m256i special = _mm256_setzero_si256();
    // The 8 tokens' dot products into e[]; Exact decodes special codes
    // (taken again for a block where the first pass met one).
    auto pass = [&](auto exact) {
      constexpr bool kExact = decltype(exact)::value;
      __m256 b_even[H], c_first[H];
#pragma GCC unroll 4
      for (int pr = 0; pr < 4; ++pr) {
        __m256 acc0[H], acc1[H];
#pragma GCC unroll 4
        for (int h = 0; h < H; ++h) acc0[h] = acc1[h] = _mm256_setzero_ps();
        const uint8_t* r0 = rows[2 * pr];
        const uint8_t* r1 = rows[2 * pr + 1];
        if constexpr (Perm) {
          for (int64_t d = 0; d < hd; d += 32) {
            const Block32<E> k0(r0 + d, hd - d, &special), k1(r1 + d, hd - d, &special);
#pragma GCC unroll 4
            for (int cc = 0; cc < 4; ++cc) {
              const __m256 kc0 = k0.template chunk<kExact>(cc), kc1 = k1.template chunk<kExact>(cc);
#pragma GCC unroll 4
              for (int h = 0; h < H; ++h) {
                const __m256 qv = _mm256_loadu_ps(q + h * ldq + d + 8 * cc);
                acc0[h] = _mm256_fmadd_ps(qv, kc0, acc0[h]);
                acc1[h] = _mm256_fmadd_ps(qv, kc1, acc1[h]);
              }
            }
          }
        } else {
          for (int64_t d = 0; d < hd; d += 8) {
            const __m256 k0 = decode8<E>(r0 + d * eb, hd - d);
            const __m256 k1 = decode8<E>(r1 + d * eb, hd - d);
#pragma GCC unroll 4
            for (int h = 0; h < H; ++h) {
              const __m256 qv = load_part(q + h * ldq + d, hd - d);
              acc0[h] = _mm256_fmadd_ps(qv, k0, acc0[h]);
              acc1[h] = _mm256_fmadd_ps(qv, k1, acc1[h]);
            }
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
    };
    pass(std::false_type());
    if (E != KvDType::kBf16 && Perm && !_mm256_testz_si256(special, special))
      pass(std::true_type());  // rare
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const __m256 ch = Perm && fold[h] != 1.f ? _mm256_mul_ps(c, _mm256_set1_ps(fold[h])) : c;
      store_part(s + h * lds + t0, _mm256_mul_ps(_mm256_permutevar8x32_ps(e[h], unshuffle), ch), nb);
    }
    pg = p2, i = i2;
  }
}

// out[h * hd + d0 .. d0 + width) for heads [0, H), C chunks of 8. FP8 (C =
// 4 or 2): a Block32 or Block16 per row, chunks in its order. Every 8 tokens
// the V scales are read to find the tokens whose w = p * vs_t takes the V fold's
// 2^bias (all but those with huge scales, whose codes are widened to exact
// values instead); with scale_p (FP8, first pass) p[h, t] is multiplied
// there by vs_t and that fold, 8 tokens ahead of its use, so the V scales
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
  int wide = 0;  // FP8: bit t % 8 set where token t keeps w unfolded
  for (int64_t t = 0; t < n; ++t) {
    if constexpr (E != KvDType::kBf16) {
      if (t % 8 == 0) {
        using L = F8Lanes<E>;
        const int nb = int(std::min<int64_t>(8, n - t));
        const __m256 vs =
            kv.v_scales ? block_scales(kv.v_scales, kv, pg, i, nb) : _mm256_set1_ps(kv.v_scale);
        const __m256 folded = _mm256_cmp_ps(
            _mm256_andnot_ps(_mm256_set1_ps(-0.f), vs), _mm256_set1_ps(L::fold_limit), _CMP_LT_OQ);
        wide = ~_mm256_movemask_ps(folded) & ((1 << nb) - 1);
        if (scale_p) {
          const __m256 f = _mm256_blendv_ps(_mm256_set1_ps(1.f), _mm256_set1_ps(L::unbias), folded);
#pragma GCC unroll 4
          for (int h = 0; h < H; ++h) {
            float* ph = p + h * ldp + t;
            store_part(ph, _mm256_mul_ps(_mm256_mul_ps(load_part(ph, nb), vs), f), nb);
          }
        }
      }
      prefetch_next_scales(kv.v_scales, pg, i, kv);
    }
    const uint8_t* row = kv.v_pages[pg] + i * kv.token_stride + d0 * eb;
    if (pg + kPrefetchPages < pages)
      prefetch_row(kv.v_pages[pg + kPrefetchPages] + i * kv.token_stride + d0 * eb, width * eb);
    if constexpr (E == KvDType::kBf16) {
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
    } else {
      using Blk = std::conditional_t<C == 4, Block32<E>, Block16<E>>;
      __m256i special = _mm256_setzero_si256();
      const Blk b(row, width, &special);
      const bool exact = !_mm256_testz_si256(special, special);  // rare
      const bool unfold = wide >> (t % 8) & 1;                   // rare: exact codes
      // One chunk at a time (registers: H * C accumulators, the codes, a
      // chunk, a broadcast).
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        __m256 v = exact ? b.template chunk<true>(c) : b.chunk(c);
        if (unfold) v = _mm256_mul_ps(v, _mm256_set1_ps(F8Lanes<E>::unbias));
#pragma GCC unroll 4
        for (int h = 0; h < H; ++h)
          acc[h][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + h * ldp + t), v, acc[h][c]);
      }
    }
    if (++i == pt) i = 0, ++pg;
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    if constexpr (E == KvDType::kBf16) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c)
        if (8 * c < width) store_part(out + h * hd + d0 + 8 * c, acc[h][c], width - 8 * c);
    } else {
      store_perm<C>(out + h * hd + d0, acc[h], width);
    }
  }
}

// out[h * hd + d] for d in [d0, d1); with scale_first, the first block scales p.
template <KvDType E, int H>
void wsum_heads(float* p, int64_t ldp, int64_t hd, const PagedKv& kv, int64_t d0, int64_t d1,
                float* out, bool scale_first) {
  // BF16: H * C accumulators + C decoded chunks + 1 broadcast within 16
  // registers; FP8: 32 codes a row (Block32) up to 3 heads, 16 for 4.
  constexpr int C = E == KvDType::kBf16 ? (H <= 2 ? 4 : (H == 3 ? 3 : 2)) : (H <= 3 ? 4 : 2);
  for (int64_t d = d0; d < d1; d += 8 * C)
    wsum_block<E, H, C>(p, ldp, hd, kv, d, std::min<int64_t>(8 * C, d1 - d), out,
                        scale_first && d == d0);
}

// s for heads [0, H) of the block starting at q: FP8 through a permuted copy
// of q on the stack where it fits.
template <KvDType E, int H>
void scores_heads(const float* q, int64_t hd, float scale, const PagedKv& kv, float* s,
                  int64_t lds) {
  const int64_t ldp = (hd + 31) / 32 * 32;
  if constexpr (E != KvDType::kBf16) {
    if (H * ldp <= kQpFloats) {
      alignas(32) float qp[kQpFloats];
      float fold[H];
      permute_q<E, 8>(q, H, hd, qp, ldp, fold);
      // (Not specialized by head size: with 16 registers the unrolled form
      // measured slower here once rows come from memory.)
      return scores_block<E, H, true, 0>(qp, ldp, hd, scale, kv, s, lds, fold);
    }
  }
  if (hd == 64) return scores_block<E, H, false, 64>(q, hd, hd, scale, kv, s, lds, nullptr);
  if (hd == 128) return scores_block<E, H, false, 128>(q, hd, hd, scale, kv, s, lds, nullptr);
  scores_block<E, H, false, 0>(q, hd, hd, scale, kv, s, lds, nullptr);
}

template <KvDType E>
void scores(const float* q, int64_t group, int64_t hd, float scale, const PagedKv& kv, float* s,
            int64_t lds) {
  for (int64_t h0 = 0; h0 < group; h0 += 4) {
    const float* qb = q + h0 * hd;
    float* sb = s + h0 * lds;
    switch (std::min<int64_t>(4, group - h0)) {
      case 1:
        scores_heads<E, 1>(qb, hd, scale, kv, sb, lds);
        break;
      case 2:
        scores_heads<E, 2>(qb, hd, scale, kv, sb, lds);
        break;
      case 3:
        scores_heads<E, 3>(qb, hd, scale, kv, sb, lds);
        break;
      default:
        scores_heads<E, 4>(qb, hd, scale, kv, sb, lds);
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

// paged_attn_probs' FP8 step: p[h, t] = (p[h, t] * vs_t) * (V fold of vs_t), 8
// tokens at a time, as wsum_block's first pass multiplies (the same bits).
template <KvDType E>
void scale_probs_block(float* p, int64_t ldp, int64_t group, const PagedKv& kv) {
  using L = F8Lanes<E>;
  const int64_t n = kv.n_tokens, pt = kv.page_tokens;
  int64_t pg = 0, i = 0;
  for (int64_t t = 0; t < n; t += 8) {
    const int nb = int(std::min<int64_t>(8, n - t));
    prefetch_next_scales(kv.v_scales, pg, i, kv);
    const __m256 vs =
        kv.v_scales ? block_scales(kv.v_scales, kv, pg, i, nb) : _mm256_set1_ps(kv.v_scale);
    const __m256 folded = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), vs),
                                        _mm256_set1_ps(L::fold_limit), _CMP_LT_OQ);
    const __m256 f = _mm256_blendv_ps(_mm256_set1_ps(1.f), _mm256_set1_ps(L::unbias), folded);
    for (int64_t h = 0; h < group; ++h) {
      float* ph = p + h * ldp + t;
      store_part(ph, _mm256_mul_ps(_mm256_mul_ps(load_part(ph, nb), vs), f), nb);
    }
    for (i += nb; i >= pt; i -= pt) ++pg;
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
  for (int64_t h = 0; h < group; ++h) softmax(s + h * lds, kv.n_tokens);
  with_elem(kv.elem, [&](auto E) {
    if constexpr (E() != KvDType::kBf16) scale_probs_block<E()>(s, lds, group, kv);
  });
}

void paged_attn_wsum(const float* p, int64_t lds, int64_t group, int64_t head_dim,
                     const PagedKv& kv, int64_t d0, int64_t d1, float* out) {
  float* pm = const_cast<float*>(p);  // not written: no scaling pass
  with_elem(kv.elem, [&](auto E) { wsum<E()>(pm, lds, group, head_dim, kv, d0, d1, out, false); });
}

}  // namespace kvant::kernels::avx2
