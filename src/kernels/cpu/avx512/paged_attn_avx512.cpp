// AVX-512 paged_attn_decode (contract in kernels.h). Each K/V row is decoded
// once into registers and used by up to 8 query heads of the group. FP8 is
// decoded by bit manipulation through FP16, not a table gather: an e5m2 code
// is the top byte of the FP16 with the same value, and an e4m3 code shifted
// into FP16's exponent/mantissa fields (sign kept) is its value times 2^-8,
// subnormals included; VCVTPH2PS widens exactly. The 2^8 is folded into the
// per-token score factor and into the probabilities (exact powers of two), so
// results equal decoding through numerics/fp8.h's tables. FP8 rows are read
// 64 codes per load and widened by byte unpacks, which interleave elements
// (Block64); q is permuted to match, so FP8 dot products sum their elements
// in another order than BF16's (allowed by the contract). e4m3 NaN codes are
// found with one byte compare per 64 codes; rows without one (all of them, in
// practice) skip the per-element NaN select.
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

// 16 elements (lanes past m are 0) of a row, as FP32; e4m3 comes out times
// 2^-8. With Exact false an e4m3 NaN code decodes as a finite value (callers
// check rows with e4m3_has_nan first).
template <KvDType E, bool Exact = true>
inline __m512 decode16(const uint8_t* p, __mmask16 m) {
  if constexpr (E == KvDType::kBf16) {
    return maskz_load_bf16(m, reinterpret_cast<const uint16_t*>(p));
  } else {
    const __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p)), 8);
    if constexpr (E == KvDType::kFp8E5m2) {
      return _mm512_cvtph_ps(w);
    } else {
      // S.EEEE.MMM << 8, arithmetic >> 1 copies S into bit 14; clear it.
      const __m256i h = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(short(0xbfff)));
      if constexpr (!Exact) return _mm512_cvtph_ps(h);
      const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x3f80)),
                                                    _mm256_set1_epi16(0x3f80));
      return _mm512_mask_mov_ps(_mm512_cvtph_ps(h), nan,
                                _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
    }
  }
}

// Whether bytes [0, n) of p hold an e4m3 NaN code (S.1111.111).
inline bool e4m3_has_nan(const uint8_t* p, int64_t n) {
  __mmask64 any = 0;
  for (int64_t d = 0; d < n; d += 64) {
    const __mmask64 m = mask64(n - d);
    const __m512i v = _mm512_or_si512(_mm512_maskz_loadu_epi8(m, p + d), _mm512_set1_epi8(-128));
    any |= _mm512_mask_cmpeq_epi8_mask(m, v, _mm512_set1_epi8(-1));
  }
  return any != 0;
}

// FP8 rows in blocks of 64 codes (one load): VPUNPCK{L,H}BW against zero
// makes each code the high byte of a word, which is the FP16 of an e5m2 code;
// e4m3 then takes the shift above. Per 128-bit lane the unpacks take codes
// 0-7 and 8-15, so a block's four 16-lane chunks hold codes
//   A = [0-7, 16-23], B = [8-15, 24-31], C = [32-39, 48-55], D = [40-47, 56-63]
// (a 32-code block: A and B). Scores meet them with q permuted alike
// (permute_q); weighted sums un-permute their accumulators once (store_perm).
template <KvDType E>
inline __m512i fp16_bits(__m512i w) {
  if constexpr (E == KvDType::kFp8E4m3)
    return _mm512_and_si512(_mm512_srai_epi16(w, 1), _mm512_set1_epi16(short(0xbfff)));
  else
    return w;
}
template <KvDType E>
inline __m256i fp16_bits(__m256i w) {
  if constexpr (E == KvDType::kFp8E4m3)
    return _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(short(0xbfff)));
  else
    return w;
}
// FP16 bits -> FP32; Exact: e4m3 NaN codes (FP16 bits x.01111.111.0000000) become NaN.
template <KvDType E, bool Exact>
inline __m512 widen(__m256i h) {
  const __m512 f = _mm512_cvtph_ps(h);
  if constexpr (!Exact || E != KvDType::kFp8E4m3) return f;
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x3f80)),
                                                _mm256_set1_epi16(0x3f80));
  return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
}

// The FP16 bits of codes [0, min(n, 64)) of p (the rest 0) as two words
// vectors: lo holds chunks A | C, hi B | D. For e4m3, nan_any gains the codes
// that are NaN.
template <KvDType E>
struct Block64 {
  __m512i lo, hi;
  Block64(const uint8_t* p, int64_t n, __mmask64* nan_any = nullptr) {
    const __m512i c = n >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(mask64(n), p);
    if constexpr (E == KvDType::kFp8E4m3)
      if (nan_any)
        *nan_any |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(c, _mm512_set1_epi8(-128)),
                                           _mm512_set1_epi8(-1));
    lo = fp16_bits<E>(_mm512_unpacklo_epi8(_mm512_setzero_si512(), c));
    hi = fp16_bits<E>(_mm512_unpackhi_epi8(_mm512_setzero_si512(), c));
  }
  // Chunk k = 0 .. 3 (A, B, C, D) as FP32.
  template <bool Exact = false>
  __m512 chunk(int k) const {
    const __m512i w = k % 2 == 0 ? lo : hi;
    return widen<E, Exact>(k < 2 ? _mm512_castsi512_si256(w) : _mm512_extracti64x4_epi64(w, 1));
  }
};
// The same for 32 codes (chunks A, B).
template <KvDType E>
struct Block32 {
  __m256i lo, hi;
  Block32(const uint8_t* p, int64_t n, __mmask32* nan_any = nullptr) {
    const __m256i c = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi8(mask32(n), p);
    if constexpr (E == KvDType::kFp8E4m3)
      if (nan_any)
        *nan_any |= _mm256_cmpeq_epi8_mask(_mm256_or_si256(c, _mm256_set1_epi8(-128)),
                                           _mm256_set1_epi8(-1));
    lo = fp16_bits<E>(_mm256_unpacklo_epi8(_mm256_setzero_si256(), c));
    hi = fp16_bits<E>(_mm256_unpackhi_epi8(_mm256_setzero_si256(), c));
  }
  template <bool Exact = false>
  __m512 chunk(int k) const {
    return widen<E, Exact>(k == 0 ? lo : hi);
  }
};

// qp[h * ldp + 0 .. ldp) = q[h * hd + 0 .. hd) in the chunk order above, zero
// past hd; ldp = hd rounded up to 64.
inline void permute_q(const float* q, int64_t heads, int64_t hd, float* qp, int64_t ldp) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t d = 0; d < ldp; d += 32) {
      const __m512 q0 = _mm512_maskz_loadu_ps(mask16(hd - d), q + h * hd + d);
      const __m512 q1 = _mm512_maskz_loadu_ps(mask16(hd - d - 16), q + h * hd + d + 16);
      _mm512_storeu_ps(qp + h * ldp + d, _mm512_shuffle_f32x4(q0, q1, _MM_SHUFFLE(1, 0, 1, 0)));
      _mm512_storeu_ps(qp + h * ldp + d + 16,
                       _mm512_shuffle_f32x4(q0, q1, _MM_SHUFFLE(3, 2, 3, 2)));
    }
}
// out[0 .. n) (n <= 32) from chunks A and B of a 32-code block.
inline void store_perm(float* out, __m512 a, __m512 b, int64_t n) {
  _mm512_mask_storeu_ps(out, mask16(n), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
  _mm512_mask_storeu_ps(out + 16, mask16(n - 16),
                        _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

// Permuted q of a head block lives on the stack: up to this many floats.
constexpr int64_t kQpFloats = 8 * 1024;

// The same slot kPrefetchPages pages on (see paged_attn_common.h).
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + b), _MM_HINT_T2);
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

template <KvDType E>
constexpr float kFold = E == KvDType::kFp8E4m3 ? 256.f : 1.f;

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
// Perm (FP8 only): q is permute_q's layout and rows are read as Block64s.
template <KvDType E, int H, bool Perm>
void scores_block(const float* q, int64_t ldq, int64_t hd, float scale, const PagedKv& kv,
                  float* s, int64_t lds) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E), pt = kv.page_tokens;
  const int64_t pages = (n + pt - 1) / pt;
  const __m512i unshuffle = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const float static_c = E == KvDType::kBf16 ? scale : scale * kv.k_scale * kFold<E>;
  int64_t pg = 0, i = 0;  // where token t0 lives
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int nb = int(std::min<int64_t>(16, n - t0));
    const uint8_t* rows[16];
    bool nan = false;
    __mmask64 nan_any = 0;
    {
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
        if constexpr (E == KvDType::kFp8E4m3 && !Perm) nan |= e4m3_has_nan(rows[j], hd);
        if (++i2 == pt) i2 = 0, ++p2;
      }
      for (int j = nb; j < 16; ++j) rows[j] = rows[0];  // lanes not stored
      __m512 c = _mm512_set1_ps(static_c);
      if (E != KvDType::kBf16 && kv.k_scales)
        c = _mm512_mul_ps(
            _mm512_mul_ps(_mm512_set1_ps(scale), block_scales(kv.k_scales, kv, pg, i, nb)),
            _mm512_set1_ps(kFold<E>));
      __m512 b_even[H], c_even[H], d_first[H], e[H];
#pragma GCC unroll 8
      for (int pr = 0; pr < 8; ++pr) {
        __m512 acc0[H], acc1[H];
#pragma GCC unroll 8
        for (int h = 0; h < H; ++h) acc0[h] = acc1[h] = _mm512_setzero_ps();
        const uint8_t* r0 = rows[2 * pr];
        const uint8_t* r1 = rows[2 * pr + 1];
        if constexpr (Perm) {
          for (int64_t d = 0; d < hd; d += 64) {
            const Block64<E> k0(r0 + d, hd - d, &nan_any), k1(r1 + d, hd - d, &nan_any);
            const int chunks = hd - d > 32 ? 4 : 2;
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
              if (c >= chunks) break;
              const __m512 kc0 = k0.chunk(c), kc1 = k1.chunk(c);
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
            const __m512 k0 = decode16<E, false>(r0 + d * eb, m);
            const __m512 k1 = decode16<E, false>(r1 + d * eb, m);
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
      const __mmask16 sm = mask16(nb);
      __mmask16 nm = 0;  // rare: NaN scores for the rows holding a NaN code
      if (nan || nan_any != 0)
        for (int j = 0; j < nb; ++j) nm |= __mmask16(int(e4m3_has_nan(rows[j], hd)) << j);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        const __m512 v = _mm512_mul_ps(_mm512_permutexvar_ps(unshuffle, e[h]), c);
        _mm512_mask_storeu_ps(s + h * lds + t0, sm, _mm512_mask_mov_ps(v, nm, _mm512_set1_ps(kNan)));
      }
      pg = p2, i = i2;
    }
  }
}

// out[h * hd + d0 .. d0 + width) for heads [0, H), C chunks of 16 at a time.
// FP8 (C = 4 or 2): a Block64 or Block32 per row, chunks in its order. With
// scale_p (FP8, first pass), p[h, t] *= vs_t * kFold 16 tokens ahead of their
// use, so the V scales stream in with the V rows.
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
  for (int64_t t = 0; t < n; ++t) {
    if (E != KvDType::kBf16 && scale_p && t % 16 == 0) {
      const int nb = int(std::min<int64_t>(16, n - t));
      const __mmask16 m = mask16(nb);
      const __m512 vs =
          kv.v_scales ? block_scales(kv.v_scales, kv, pg, i, nb) : _mm512_set1_ps(kv.v_scale);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        float* ph = p + h * ldp + t;
        _mm512_mask_storeu_ps(ph, m,
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, ph), vs),
                                            _mm512_set1_ps(kFold<E>)));
      }
    }
    if constexpr (E != KvDType::kBf16) prefetch_next_scales(kv.v_scales, pg, i, kv);
    const uint8_t* row = kv.v_pages[pg] + i * kv.token_stride + d0 * eb;
    if (pg + kPrefetchPages < pages)
      prefetch_row(kv.v_pages[pg + kPrefetchPages] + i * kv.token_stride + d0 * eb, width * eb);
    __m512 v[C];
    if constexpr (E == KvDType::kBf16) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) v[c] = decode16<E>(row + 16 * c * eb, mc[c]);
    } else {
      using Blk = std::conditional_t<C == 4, Block64<E>, Block32<E>>;
      using Mask = std::conditional_t<C == 4, __mmask64, __mmask32>;
      Mask nan = 0;
      const Blk b(row, width, &nan);
      if (nan) {  // rare: decode NaN codes per element
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) v[c] = b.template chunk<true>(c);
      } else {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) v[c] = b.chunk(c);
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
#pragma GCC unroll 2
      for (int c = 0; c < C; c += 2)
        store_perm(out + h * hd + d0 + 16 * c, acc[h][c], acc[h][c + 1], width - 16 * c);
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
      permute_q(q, H, hd, qp, ldp);
      return scores_block<E, H, true>(qp, ldp, hd, scale, kv, s, lds);
    }
  }
  scores_block<E, H, false>(q, hd, hd, scale, kv, s, lds);
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
  const float fold = kv.elem == KvDType::kFp8E4m3 ? kFold<KvDType::kFp8E4m3> : 1.f;
  probs_pass(s, lds, group, kv, fold, [](float* x, int64_t n) { softmax(x, n); });
}

void paged_attn_wsum(const float* p, int64_t lds, int64_t group, int64_t head_dim,
                     const PagedKv& kv, int64_t d0, int64_t d1, float* out) {
  float* pm = const_cast<float*>(p);  // not written: no scaling pass
  with_elem(kv.elem, [&](auto E) { wsum<E()>(pm, lds, group, head_dim, kv, d0, d1, out, false); });
}

}  // namespace kvant::kernels::avx512
