// AVX-512 paged_attn_decode (contract in kernels.h). Each K/V row is decoded
// once into registers and used by up to 8 query heads of the group. FP8 is
// decoded by integer shifts and a mask (paged_attn_common.h's F8Lanes), not
// a table gather: a 64-byte load holds codes 4j .. 4j+3 in 32-bit lane j,
// and chunk t (0 .. 3) moves code 4j+t to the lane's top byte, shifts it
// right arithmetically and masks it, which gives the code's value times
// 2^-bias (e4m3 2^-120, e5m2 2^-112) exactly, subnormals included: three
// instructions per 16 codes, no shuffles. Scores meet chunk t with q
// permuted alike and multiplied by 2^K (q_scale_exp: K = bias unless q is
// very large), so products are q * k * 2^(K - bias), and the per-token score
// factor takes 2^(bias - K) back. The weighted sums take w = p * vs_t times
// 2^bias (the V fold of paged_attn_common.h: exact, so each FMA's product is the contract's w * v, bit
// for bit) and un-permute their accumulators once per block. So FP8 dot
// products sum their elements in another order than BF16's (allowed by the
// contract). Special codes (e4m3 NaN, e5m2 Inf/NaN) are found with one byte
// compare per 64 codes; blocks without one (all of them, in practice) skip
// the per-element select, and a score block that meets one is recomputed
// with it.
//
// Scores go 16 tokens at a time: each token's 16-lane partial dot product is
// reduced together with the others' by a transpose-and-add tree (levels pair
// lane l with l+8, l+4, l+2, l+1, as hsum does, so every token's sum is
// bitwise hsum's: BF16 scores stay attn_scores'), which leaves the 16 scores
// in one vector: one multiply by the 16 tokens' factors (dynamic scales
// loaded 16 at a time) and one store. The V sum is attn_weighted_sum's
// sequential FMA over t; FP8 probabilities take their V scales 16 tokens at a
// time inside that pass.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/paged_attn_common.h"

namespace kvant::kernels::avx512 {
namespace {

inline __mmask64 mask64(int64_t n) {
  return __mmask64(_bzhi_u64(~0ull, unsigned(std::clamp<int64_t>(n, 0, 64))));
}

// FP8 lanes (F8Lanes): `top` holds a code in bits 31..24 of each lane.
template <KvDType E>
inline __m512 f8_lanes(__m512i top) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(top, F8Lanes<E>::shift),
                                              _mm512_set1_epi32(int(F8Lanes<E>::mask))));
}
// Special codes' lanes of f8_lanes' result as FP32 Inf/NaN.
template <KvDType E>
inline __m512 f8_fix_special(__m512 x) {
  const __m512i b = _mm512_castps_si512(x), sp = _mm512_set1_epi32(int(F8Lanes<E>::special));
  const __mmask16 m = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, sp), sp);
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(b, m, b, _mm512_set1_epi32(0x7f800000)));
}
// The bytes of c that are special codes (zero bytes never are).
template <KvDType E>
inline __mmask64 f8_special_bytes(__m512i c) {
  const __m512i sb = _mm512_set1_epi8(char(F8Lanes<E>::special_byte));
  return _mm512_cmpeq_epi8_mask(_mm512_and_si512(c, sb), sb);
}

// 16 elements (lanes past m are 0) of a row as exact FP32 values (FP8:
// specials included), in order: the plain path's decode.
template <KvDType E>
inline __m512 decode16(const uint8_t* p, __mmask16 m) {
  if constexpr (E == KvDType::kBf16) {
    return maskz_load_bf16(m, reinterpret_cast<const uint16_t*>(p));
  } else {
    const __m512i top = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p)), 24);
    return _mm512_mul_ps(f8_fix_special<E>(f8_lanes<E>(top)), _mm512_set1_ps(F8Lanes<E>::unbias));
  }
}

// 64 codes of a row (past n: 0): lane j holds codes 4j .. 4j+3; chunk t
// (0 .. 3) is codes 4j+t as FP32 times 2^-bias. `special` gains the bytes
// that are special codes.
template <KvDType E>
struct Block64 {
  __m512i w;
  Block64(const uint8_t* p, int64_t n, __mmask64* special) {
    w = n >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(mask64(n), p);
    *special |= f8_special_bytes<E>(w);
  }
  template <bool Exact = false>
  __m512 chunk(int t) const {
    const __m512 x = f8_lanes<E>(t == 3 ? w : _mm512_slli_epi32(w, unsigned(24 - 8 * t)));
    return Exact ? f8_fix_special<E>(x) : x;
  }
};
// 32 codes: lane j holds codes 2j, 2j+1 (one zero-extending load); chunk t
// (0, 1) is codes 2j+t.
template <KvDType E>
struct Block32 {
  __m512i w;
  Block32(const uint8_t* p, int64_t n, __mmask64* special) {
    const __m256i c = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi8(mask32(n), p);
    *special |= f8_special_bytes<E>(_mm512_castsi256_si512(c)) & 0xffffffffull;
    w = _mm512_cvtepu16_epi32(c);
  }
  template <bool Exact = false>
  __m512 chunk(int t) const {
    const __m512 x = f8_lanes<E>(_mm512_slli_epi32(w, unsigned(24 - 8 * t)));
    return Exact ? f8_fix_special<E>(x) : x;
  }
};

// out[0 .. n) from the chunks of a weighted sum's block: C = 4 (Block64:
// out[4j + t] = a[t][j]) or C = 2 (Block32: out[2j + t] = a[t][j]).
template <int C>
inline void store_perm(float* out, const __m512* a, int64_t n) {
  if constexpr (C == 4) {
    const __m512 ab_lo = _mm512_unpacklo_ps(a[0], a[1]), ab_hi = _mm512_unpackhi_ps(a[0], a[1]);
    const __m512 cd_lo = _mm512_unpacklo_ps(a[2], a[3]), cd_hi = _mm512_unpackhi_ps(a[2], a[3]);
    auto pd = [](__m512 x) { return _mm512_castps_pd(x); };
    auto ps = [](__m512d x) { return _mm512_castpd_ps(x); };
    // x_m, 128-bit lane l: codes 4 (4l + m) .. +3, i.e. out[16 l + 4 m ..].
    const __m512 x0 = ps(_mm512_unpacklo_pd(pd(ab_lo), pd(cd_lo)));
    const __m512 x1 = ps(_mm512_unpackhi_pd(pd(ab_lo), pd(cd_lo)));
    const __m512 x2 = ps(_mm512_unpacklo_pd(pd(ab_hi), pd(cd_hi)));
    const __m512 x3 = ps(_mm512_unpackhi_pd(pd(ab_hi), pd(cd_hi)));
    const __m512 y0 = _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 y1 = _mm512_shuffle_f32x4(x2, x3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 y2 = _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 y3 = _mm512_shuffle_f32x4(x2, x3, _MM_SHUFFLE(3, 2, 3, 2));
    _mm512_mask_storeu_ps(out, mask16(n), _mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_mask_storeu_ps(out + 16, mask16(n - 16),
                          _mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_mask_storeu_ps(out + 32, mask16(n - 32),
                          _mm512_shuffle_f32x4(y2, y3, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_mask_storeu_ps(out + 48, mask16(n - 48),
                          _mm512_shuffle_f32x4(y2, y3, _MM_SHUFFLE(3, 1, 3, 1)));
  } else {
    const __m512 lo = _mm512_unpacklo_ps(a[0], a[1]), hi = _mm512_unpackhi_ps(a[0], a[1]);
    const __m512 y0 = _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 y1 = _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
    _mm512_mask_storeu_ps(out, mask16(n), _mm512_shuffle_f32x4(y0, y0, _MM_SHUFFLE(3, 1, 2, 0)));
    _mm512_mask_storeu_ps(out + 16, mask16(n - 16),
                          _mm512_shuffle_f32x4(y1, y1, _MM_SHUFFLE(3, 1, 2, 0)));
  }
}

// Permuted q of a head block lives on the stack: up to this many floats.
constexpr int64_t kQpFloats = 8 * 1024;

// The same slot kPrefetchPages pages on (see paged_attn_common.h).
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + b), _MM_HINT_T2);
}

// 16 BF16 scales (uint16 bits) -> FP32, exact.
inline __m512 bf16x16_to_ps(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Scales of tokens t0 .. t0+nb-1 (token t0 at page pg, slot i); lanes past nb are 0.
inline __m512 block_scales(const uint16_t* const* sc, const PagedKv& kv, int64_t pg, int64_t i,
                           int nb) {
  const int64_t ss = kv.scale_stride;
  if (i + nb <= kv.page_tokens && ss <= 4) {
    // One page, small stride (scales of a few KV heads side by side): load the
    // span, up to 64 scales, and pick every ss-th with one permute (no
    // gather: slow on CPUs with the GDS mitigation).
    const uint16_t* b = sc[pg] + i * ss;
    if (ss == 1) return bf16x16_to_ps(_mm256_maskz_loadu_epi16(mask16(nb), b));
    const int64_t len = (nb - 1) * ss + 1;
    const __mmask32 m0 = len >= 32 ? ~__mmask32(0) : __mmask32((uint32_t(1) << len) - 1);
    const __mmask32 m1 = len <= 32 ? __mmask32(0) : __mmask32((uint32_t(1) << (len - 32)) - 1);
    alignas(64) static const uint16_t kLane[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                                   11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                                   22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
    const __m512i idx = _mm512_mullo_epi16(_mm512_load_si512(kLane), _mm512_set1_epi16(short(ss)));
    const __m512i picked = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi16(m0, b), idx,
                                                     _mm512_maskz_loadu_epi16(m1, b + 32));
    return bf16x16_to_ps(_mm512_castsi512_si256(picked));
  }
  // Otherwise scalar loads.
  alignas(32) uint16_t tmp[16] = {};
  for (int j = 0; j < nb; ++j) {
    tmp[j] = sc[pg][i * kv.scale_stride];
    if (++i == kv.page_tokens) i = 0, ++pg;
  }
  return bf16x16_to_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(tmp)));
}

// The reduction tree (tree1..tree4): avx512_common.h.

// s[h * lds + t] for heads [0, H) of the block starting at q (row stride ldq).
// Perm (FP8 only): q is permute_q's layout (fold[h]: its 2^(bias - K_h)) and
// rows are read as Block64s; otherwise rows are decoded in order to exact
// values (fold unused).
// HD: the head size when it is a compile-time constant (64, 128: loops
// unrolled, no partial blocks), else 0.
template <KvDType E, int H, bool Perm, int HD>
void scores_block(const float* q, int64_t ldq, int64_t hd_arg, float scale, const PagedKv& kv,
                  float* s, int64_t lds, const float* fold) {
  const int64_t hd = HD ? HD : hd_arg;
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E), pt = kv.page_tokens;
  const int64_t pages = (n + pt - 1) / pt;
  const __m512i unshuffle = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const float static_c = E == KvDType::kBf16 ? scale : scale * kv.k_scale;
  int64_t pg = 0, i = 0;  // where token t0 lives
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int nb = int(std::min<int64_t>(16, n - t0));
    const uint8_t* rows[16];
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
    for (int j = nb; j < 16; ++j) rows[j] = rows[0];  // lanes not stored
    __m512 c = _mm512_set1_ps(static_c);
    if (E != KvDType::kBf16 && kv.k_scales)
      c = _mm512_mul_ps(_mm512_set1_ps(scale), block_scales(kv.k_scales, kv, pg, i, nb));
    __m512 e[H];
    __mmask64 special = 0;
    // The 16 tokens' dot products into e[]; Exact decodes special codes
    // (taken again for a block where the first pass met one).
    auto pass = [&](auto exact) {
      constexpr bool kExact = decltype(exact)::value;
      __m512 b_even[H], c_even[H], d_first[H];
#pragma GCC unroll 8
      for (int pr = 0; pr < 8; ++pr) {
        __m512 acc0[H], acc1[H];
#pragma GCC unroll 8
        for (int h = 0; h < H; ++h) acc0[h] = acc1[h] = _mm512_setzero_ps();
        const uint8_t* r0 = rows[2 * pr];
        const uint8_t* r1 = rows[2 * pr + 1];
        if constexpr (Perm) {
          for (int64_t d = 0; d < hd; d += 64) {
            const Block64<E> k0(r0 + d, hd - d, &special), k1(r1 + d, hd - d, &special);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
              const __m512 kc0 = k0.template chunk<kExact>(c), kc1 = k1.template chunk<kExact>(c);
#pragma GCC unroll 8
              for (int h = 0; h < H; ++h) {
                const __m512 qv = _mm512_loadu_ps(q + h * ldq + d + 16 * c);
                acc0[h] = _mm512_fmadd_ps(qv, kc0, acc0[h]);
                acc1[h] = _mm512_fmadd_ps(qv, kc1, acc1[h]);
              }
            }
          }
        } else {
          for (int64_t d = 0; d < hd; d += 16) {
            const __mmask16 m = mask16(hd - d);
            const __m512 k0 = decode16<E>(r0 + d * eb, m);
            const __m512 k1 = decode16<E>(r1 + d * eb, m);
#pragma GCC unroll 8
            for (int h = 0; h < H; ++h) {
              const __m512 qv = _mm512_maskz_loadu_ps(m, q + h * ldq + d);
              acc0[h] = _mm512_fmadd_ps(qv, k0, acc0[h]);
              acc1[h] = _mm512_fmadd_ps(qv, k1, acc1[h]);
            }
          }
        }
#pragma GCC unroll 8
        for (int h = 0; h < H; ++h) {
          const __m512 b = tree1(acc0[h], acc1[h]);
          if (pr % 2 == 0) {
            b_even[h] = b;
            continue;
          }
          const __m512 cc = tree2(b_even[h], b);
          if (pr % 4 == 1) {
            c_even[h] = cc;
            continue;
          }
          const __m512 dd = tree3(c_even[h], cc);
          if (pr == 3)
            d_first[h] = dd;
          else
            e[h] = tree4(d_first[h], dd);
        }
      }
    };
    pass(std::false_type());
    if (E != KvDType::kBf16 && Perm && special != 0) pass(std::true_type());  // rare
    const __mmask16 sm = mask16(nb);
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m512 ch = Perm && fold[h] != 1.f ? _mm512_mul_ps(c, _mm512_set1_ps(fold[h])) : c;
      _mm512_mask_storeu_ps(s + h * lds + t0, sm,
                            _mm512_mul_ps(_mm512_permutexvar_ps(unshuffle, e[h]), ch));
    }
    pg = p2, i = i2;
  }
}

// out[h * hd + d0 .. d0 + width) for heads [0, H), C chunks of 16 at a time.
// FP8 (C = 4 or 2): a Block64 or Block32 per row, chunks in its order. Every
// 16 tokens the V scales are read to find the tokens whose w = p * vs_t takes
// the V fold's 2^bias (all but those with huge scales, whose codes are widened
// to exact values instead); with scale_p (FP8, first pass) p[h, t] is
// multiplied there by vs_t and that fold, 16 tokens ahead of its use, so the
// V scales stream in with the V rows.
template <KvDType E, int H, int C>
void wsum_block(float* p, int64_t ldp, int64_t hd, const PagedKv& kv, int64_t d0, int64_t width,
                float* out, bool scale_p) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E);
  __mmask16 mc[C];
  __m512 acc[H][C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) mc[c] = mask16(width - 16 * c);
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[h][c] = _mm512_setzero_ps();
  const int64_t pt = kv.page_tokens, pages = (n + pt - 1) / pt;
  int64_t pg = 0, i = 0;
  uint32_t wide = 0;  // FP8: bit t % 16 set where token t keeps w unfolded
  for (int64_t t = 0; t < n; ++t) {
    if constexpr (E != KvDType::kBf16) {
      if (t % 16 == 0) {
        using L = F8Lanes<E>;
        const int nb = int(std::min<int64_t>(16, n - t));
        const __mmask16 m = mask16(nb);
        const __m512 vs =
            kv.v_scales ? block_scales(kv.v_scales, kv, pg, i, nb) : _mm512_set1_ps(kv.v_scale);
        const __mmask16 folded =
            _mm512_cmp_ps_mask(_mm512_abs_ps(vs), _mm512_set1_ps(L::fold_limit), _CMP_LT_OQ);
        wide = uint32_t(m & ~folded);
        if (scale_p) {
          const __m512 f = _mm512_mask_blend_ps(folded, _mm512_set1_ps(1.f), _mm512_set1_ps(L::unbias));
#pragma GCC unroll 8
          for (int h = 0; h < H; ++h) {
            float* ph = p + h * ldp + t;
            _mm512_mask_storeu_ps(ph, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, ph), vs), f));
          }
        }
      }
      prefetch_next_scales(kv.v_scales, pg, i, kv);
    }
    const uint8_t* row = kv.v_pages[pg] + i * kv.token_stride + d0 * eb;
    if (pg + kPrefetchPages < pages)
      prefetch_row(kv.v_pages[pg + kPrefetchPages] + i * kv.token_stride + d0 * eb, width * eb);
    __m512 v[C];
    if constexpr (E == KvDType::kBf16) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) v[c] = decode16<E>(row + 16 * c * eb, mc[c]);
    } else {
      using Blk = std::conditional_t<C == 4, Block64<E>, Block32<E>>;
      __mmask64 special = 0;
      const Blk b(row, width, &special);
      if (special) {  // rare: decode special codes per element
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) v[c] = b.template chunk<true>(c);
      } else {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) v[c] = b.chunk(c);
      }
      if (wide >> (t % 16) & 1) {  // rare: w not folded, so exact codes
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) v[c] = _mm512_mul_ps(v[c], _mm512_set1_ps(F8Lanes<E>::unbias));
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m512 w = _mm512_set1_ps(p[h * ldp + t]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
    }
    if (++i == pt) i = 0, ++pg;
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    if constexpr (E == KvDType::kBf16) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c)
        _mm512_mask_storeu_ps(out + h * hd + d0 + 16 * c, mc[c], acc[h][c]);
    } else {
      store_perm<C>(out + h * hd + d0, acc[h], width);
    }
  }
}

template <KvDType E, int H>
void scores_heads(const float* q, int64_t hd, float scale, const PagedKv& kv, float* s,
                  int64_t lds) {
  const int64_t ldp = (hd + 63) / 64 * 64;
  if constexpr (E != KvDType::kBf16) {
    if (H * ldp <= kQpFloats) {
      alignas(64) float qp[kQpFloats];
      float fold[H];
      permute_q<E, 16>(q, H, hd, qp, ldp, fold);
      if (hd == 64) return scores_block<E, H, true, 64>(qp, ldp, hd, scale, kv, s, lds, fold);
      if (hd == 128) return scores_block<E, H, true, 128>(qp, ldp, hd, scale, kv, s, lds, fold);
      return scores_block<E, H, true, 0>(qp, ldp, hd, scale, kv, s, lds, fold);
    }
  }
  if (hd == 64) return scores_block<E, H, false, 64>(q, hd, hd, scale, kv, s, lds, nullptr);
  if (hd == 128) return scores_block<E, H, false, 128>(q, hd, hd, scale, kv, s, lds, nullptr);
  scores_block<E, H, false, 0>(q, hd, hd, scale, kv, s, lds, nullptr);
}

// out[h * hd + d] for d in [d0, d1); with scale_first (FP8), the first block
// scales p as it streams the V scales.
template <KvDType E, int H>
void wsum_heads(float* p, int64_t ldp, int64_t hd, const PagedKv& kv, int64_t d0, int64_t d1,
                float* out, bool scale_first) {
  // H * C accumulators + C decoded chunks + 1 broadcast stay within 32
  // registers; FP8 takes whole 32- or 64-code blocks.
  constexpr int C = E == KvDType::kBf16 ? (H <= 6 ? 4 : 3) : (H <= 6 ? 4 : 2);
  for (int64_t d = d0; d < d1; d += 16 * C) {
    const int64_t width = std::min<int64_t>(16 * C, d1 - d);
    const bool sp = scale_first && d == d0;
    if (C > 2 && width <= 32)  // a 32-wide tail or range: half the registers
      wsum_block<E, H, 2>(p, ldp, hd, kv, d, width, out, sp);
    else
      wsum_block<E, H, C>(p, ldp, hd, kv, d, width, out, sp);
  }
}

// Heads go 8 at a time (FP8: fewer where their permuted q would not fit
// kQpFloats); a group wider than that re-reads its rows per block.
template <KvDType E>
int64_t heads_per_block(int64_t hd) {
  const int64_t ldp = (hd + 63) / 64 * 64;
  return E == KvDType::kBf16 ? 8 : std::clamp<int64_t>(kQpFloats / ldp, 1, 8);
}

// fn(std::integral_constant<int, H>) for a block of nh (1 .. 8) heads.
template <class Fn>
void with_heads(int64_t nh, Fn&& fn) {
  switch (nh) {
    case 1:
      return fn(std::integral_constant<int, 1>());
    case 2:
      return fn(std::integral_constant<int, 2>());
    case 3:
      return fn(std::integral_constant<int, 3>());
    case 4:
      return fn(std::integral_constant<int, 4>());
    case 5:
      return fn(std::integral_constant<int, 5>());
    case 6:
      return fn(std::integral_constant<int, 6>());
    case 7:
      return fn(std::integral_constant<int, 7>());
    default:
      return fn(std::integral_constant<int, 8>());
  }
}

template <KvDType E>
void scores(const float* q, int64_t group, int64_t hd, float scale, const PagedKv& kv, float* s,
            int64_t lds) {
  const int64_t per = heads_per_block<E>(hd);
  for (int64_t h0 = 0; h0 < group; h0 += per)
    with_heads(std::min(per, group - h0), [&](auto H) {
      scores_heads<E, H()>(q + h0 * hd, hd, scale, kv, s + h0 * lds, lds);
    });
}

template <KvDType E>
void wsum(float* p, int64_t ldp, int64_t group, int64_t hd, const PagedKv& kv, int64_t d0,
          int64_t d1, float* out, bool scale_first) {
  const int64_t per = heads_per_block<E>(hd);
  for (int64_t h0 = 0; h0 < group; h0 += per)
    with_heads(std::min(per, group - h0), [&](auto H) {
      wsum_heads<E, H()>(p + h0 * ldp, ldp, hd, kv, d0, d1, out + h0 * hd, scale_first);
    });
}

// paged_attn_probs' FP8 step: p[h, t] = (p[h, t] * vs_t) * (V fold of vs_t), 16
// tokens at a time, as wsum_block's first pass multiplies (the same bits).
template <KvDType E>
void scale_probs_block(float* p, int64_t ldp, int64_t group, const PagedKv& kv) {
  using L = F8Lanes<E>;
  const int64_t n = kv.n_tokens, pt = kv.page_tokens;
  int64_t pg = 0, i = 0;
  for (int64_t t = 0; t < n; t += 16) {
    const int nb = int(std::min<int64_t>(16, n - t));
    const __mmask16 m = mask16(nb);
    prefetch_next_scales(kv.v_scales, pg, i, kv);
    const __m512 vs =
        kv.v_scales ? block_scales(kv.v_scales, kv, pg, i, nb) : _mm512_set1_ps(kv.v_scale);
    const __mmask16 folded =
        _mm512_cmp_ps_mask(_mm512_abs_ps(vs), _mm512_set1_ps(L::fold_limit), _CMP_LT_OQ);
    const __m512 f = _mm512_mask_blend_ps(folded, _mm512_set1_ps(1.f), _mm512_set1_ps(L::unbias));
    for (int64_t h = 0; h < group; ++h) {
      float* ph = p + h * ldp + t;
      _mm512_mask_storeu_ps(ph, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, ph), vs), f));
    }
    for (i += nb; i >= pt; i -= pt) ++pg;
  }
}

template <KvDType E>
void run(const float* q, int64_t group, int64_t hd, float scale, const PagedKv& kv, float* scratch,
         float* out) {
  // Block by block, so that a block's scores are still in cache for its sum.
  const int64_t per = heads_per_block<E>(hd), n = kv.n_tokens;
  prefetch_lead_pages(kv, hd * kv_elem_bytes(E));
  for (int64_t h0 = 0; h0 < group; h0 += per) {
    const int64_t nh = std::min(per, group - h0);
    float* sb = scratch + h0 * n;
    with_heads(nh, [&](auto H) { scores_heads<E, H()>(q + h0 * hd, hd, scale, kv, sb, n); });
    for (int64_t h = 0; h < nh; ++h) softmax(sb + h * n, n);
    with_heads(nh, [&](auto H) { wsum_heads<E, H()>(sb, n, hd, kv, 0, hd, out + h0 * hd, true); });
  }
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

}  // namespace kvant::kernels::avx512
