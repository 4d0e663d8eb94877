// AVX-512 paged_attn_decode (contract in kernels.h). Each K/V row is decoded
// once into registers and used by up to 8 query heads of the group. FP8 is
// decoded by bit manipulation through FP16, not a table gather: an e5m2 code
// is the top byte of the FP16 with the same value, and an e4m3 code shifted
// into FP16's exponent/mantissa fields (sign kept) is its value times 2^-8,
// subnormals included; VCVTPH2PS widens exactly. The 2^8 is folded into the
// per-token score factor and into the probabilities (exact powers of two), so
// results equal decoding through numerics/fp8.h's tables. Dot products keep
// attn_scores' chunk order and hsum tree; the V sum is attn_weighted_sum's
// sequential FMA over t.
#include <cmath>
#include <limits>

#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/paged_attn_common.h"

namespace kvant::kernels::avx512 {
namespace {

// 16 elements (lanes past m are 0) of a row, as FP32; e4m3 comes out times 2^-8.
template <KvElem E>
inline __m512 decode16(const uint8_t* p, __mmask16 m) {
  if constexpr (E == KvElem::kBf16) {
    return maskz_load_bf16(m, reinterpret_cast<const uint16_t*>(p));
  } else {
    const __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p)), 8);
    if constexpr (E == KvElem::kFp8E5m2) {
      return _mm512_cvtph_ps(w);
    } else {
      // S.EEEE.MMM << 8, arithmetic >> 1 copies S into bit 14; clear it.
      const __m256i h = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(short(0xbfff)));
      const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x3f80)),
                                                    _mm256_set1_epi16(0x3f80));
      return _mm512_mask_mov_ps(_mm512_cvtph_ps(h), nan,
                                _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
    }
  }
}

// Pages are scattered, so hardware prefetchers stop at each page's end; the
// same slot of the next page is requested one page ahead.
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + b), _MM_HINT_T0);
}

template <KvElem E>
constexpr float kFold = E == KvElem::kFp8E4m3 ? 256.f : 1.f;

// s[h * n + t] for heads [0, H) of the block starting at q.
template <KvElem E, int H>
void scores_block(const float* q, int64_t hd, float scale, const PagedKv& kv, float* s) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E);
  const int64_t pages = (n + kv.page_tokens - 1) / kv.page_tokens;
  for_each_token(kv, [&](int64_t t, int64_t pg, int64_t i) {
    const uint8_t* row = kv.k_pages[pg] + i * kv.token_stride;
    if (pg + 1 < pages) prefetch_row(kv.k_pages[pg + 1] + i * kv.token_stride, hd * eb);
    if constexpr (E != KvElem::kBf16) prefetch_next_scales(kv.k_scales, pg, i, kv);
    __m512 acc[H];
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) acc[h] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 16) {
      const __mmask16 m = mask16(hd - d);
      const __m512 kv16 = decode16<E>(row + d * eb, m);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h)
        acc[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + h * hd + d), kv16, acc[h]);
    }
    const float c = E == KvElem::kBf16 ? scale : scale * k_token_scale(kv, pg, i) * kFold<E>;
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) s[h * n + t] = hsum(acc[h]) * c;
  });
}

// out[h * hd + d0 .. d0 + width) for heads [0, H), C chunks of 16 at a time.
template <KvElem E, int H, int C>
void wsum_block(const float* p, int64_t hd, const PagedKv& kv, int64_t d0, int64_t width,
                float* out) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E);
  __mmask16 mc[C];
  __m512 acc[H][C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) mc[c] = mask16(width - 16 * c);
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[h][c] = _mm512_setzero_ps();
  const int64_t pages = (n + kv.page_tokens - 1) / kv.page_tokens;
  for_each_token(kv, [&](int64_t t, int64_t pg, int64_t i) {
    const uint8_t* row = kv.v_pages[pg] + i * kv.token_stride + d0 * eb;
    if (pg + 1 < pages)
      prefetch_row(kv.v_pages[pg + 1] + i * kv.token_stride + d0 * eb, width * eb);
    __m512 v[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) v[c] = decode16<E>(row + 16 * c * eb, mc[c]);
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m512 w = _mm512_set1_ps(p[h * n + t]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
    }
  });
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(out + h * hd + d0 + 16 * c, mc[c], acc[h][c]);
}

template <KvElem E, int H>
void head_block(const float* q, int64_t hd, float scale, const PagedKv& kv, float* s, float* out) {
  scores_block<E, H>(q, hd, scale, kv, s);
  for (int h = 0; h < H; ++h) softmax(s + h * kv.n_tokens, kv.n_tokens);
  if constexpr (E != KvElem::kBf16) scale_probs(kv, H, kFold<E>, s);
  // H * C accumulators + C decoded chunks + 1 broadcast stay within 32 registers.
  constexpr int C = H <= 6 ? 4 : 3;
  for (int64_t d0 = 0; d0 < hd; d0 += 16 * C)
    wsum_block<E, H, C>(s, hd, kv, d0, std::min<int64_t>(16 * C, hd - d0), out);
}

template <KvElem E>
void run(const float* q, int64_t group, int64_t hd, float scale, const PagedKv& kv, float* scratch,
         float* out) {
  // Heads go 8 at a time; a group wider than 8 re-reads its rows per block.
  for (int64_t h0 = 0; h0 < group; h0 += 8) {
    const float* qb = q + h0 * hd;
    float* sb = scratch + h0 * kv.n_tokens;
    float* ob = out + h0 * hd;
    switch (std::min<int64_t>(8, group - h0)) {
      case 1:
        head_block<E, 1>(qb, hd, scale, kv, sb, ob);
        break;
      case 2:
        head_block<E, 2>(qb, hd, scale, kv, sb, ob);
        break;
      case 3:
        head_block<E, 3>(qb, hd, scale, kv, sb, ob);
        break;
      case 4:
        head_block<E, 4>(qb, hd, scale, kv, sb, ob);
        break;
      case 5:
        head_block<E, 5>(qb, hd, scale, kv, sb, ob);
        break;
      case 6:
        head_block<E, 6>(qb, hd, scale, kv, sb, ob);
        break;
      case 7:
        head_block<E, 7>(qb, hd, scale, kv, sb, ob);
        break;
      default:
        head_block<E, 8>(qb, hd, scale, kv, sb, ob);
        break;
    }
  }
}

}  // namespace

void paged_attn_decode(const float* q, int64_t group, int64_t head_dim, float scale,
                       const PagedKv& kv, float* scratch, float* out) {
  switch (kv.elem) {
    case KvElem::kFp8E4m3:
      return run<KvElem::kFp8E4m3>(q, group, head_dim, scale, kv, scratch, out);
    case KvElem::kFp8E5m2:
      return run<KvElem::kFp8E5m2>(q, group, head_dim, scale, kv, scratch, out);
    default:
      return run<KvElem::kBf16>(q, group, head_dim, scale, kv, scratch, out);
  }
}

}  // namespace kvant::kernels::avx512
