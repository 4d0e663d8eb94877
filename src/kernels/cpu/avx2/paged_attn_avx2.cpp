// AVX2 paged_attn_decode (contract in kernels.h): the AVX-512 version's
// structure at 8 lanes. FP8 is decoded through FP16 by bit manipulation
// (e5m2 is FP16's top byte; e4m3 shifted into FP16's fields is its value
// times 2^-8, the 2^8 folded into the per-token factors) and widened with
// F16C's VCVTPH2PS, exactly. Rows are read once per block of up to 8 heads
// (scores) or 4 heads (weighted sum, 16 registers). Dot products follow
// avx2::attn_scores' chunk order and hsum tree; the V sum is the sequential
// FMA over t of attn_weighted_sum.
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

// 8 elements (past n: 0) of a row as FP32; e4m3 comes out times 2^-8.
template <KvElem E>
inline __m256 decode8(const uint8_t* p, int64_t n) {
  if constexpr (E == KvElem::kBf16) {
    return load_bf16_part(reinterpret_cast<const uint16_t*>(p), n);
  } else {
    const __m128i w = _mm_unpacklo_epi8(_mm_setzero_si128(), load8_part(p, n));  // code << 8
    if constexpr (E == KvElem::kFp8E5m2) {
      return _mm256_cvtph_ps(w);
    } else {
      // S.EEEE.MMM << 8, arithmetic >> 1 copies S into bit 14; clear it.
      const __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16(short(0xbfff)));
      const __m128i nan16 =
          _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x3f80)), _mm_set1_epi16(0x3f80));
      return _mm256_blendv_ps(_mm256_cvtph_ps(h),
                              _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                              _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16)));
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

template <KvElem E, int H>
void scores_block(const float* q, int64_t hd, float scale, const PagedKv& kv, float* s) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E);
  const int64_t pages = (n + kv.page_tokens - 1) / kv.page_tokens;
  for_each_token(kv, [&](int64_t t, int64_t pg, int64_t i) {
    const uint8_t* row = kv.k_pages[pg] + i * kv.token_stride;
    if (pg + 1 < pages) prefetch_row(kv.k_pages[pg + 1] + i * kv.token_stride, hd * eb);
    if constexpr (E != KvElem::kBf16) prefetch_next_scales(kv.k_scales, pg, i, kv);
    __m256 acc[H];
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
      const __m256 k8 = decode8<E>(row + d * eb, hd - d);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h)
        acc[h] = _mm256_fmadd_ps(load_part(q + h * hd + d, hd - d), k8, acc[h]);
    }
    const float c = E == KvElem::kBf16 ? scale : scale * k_token_scale(kv, pg, i) * kFold<E>;
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) s[h * n + t] = hsum(acc[h]) * c;
  });
}

template <KvElem E, int H, int C>
void wsum_block(const float* p, int64_t hd, const PagedKv& kv, int64_t d0, int64_t width,
                float* out) {
  const int64_t n = kv.n_tokens, eb = kv_elem_bytes(E);
  __m256 acc[H][C];
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[h][c] = _mm256_setzero_ps();
  const int64_t pages = (n + kv.page_tokens - 1) / kv.page_tokens;
  for_each_token(kv, [&](int64_t t, int64_t pg, int64_t i) {
    const uint8_t* row = kv.v_pages[pg] + i * kv.token_stride + d0 * eb;
    if (pg + 1 < pages)
      prefetch_row(kv.v_pages[pg + 1] + i * kv.token_stride + d0 * eb, width * eb);
    __m256 v[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      v[c] = 8 * c < width ? decode8<E>(row + 8 * c * eb, width - 8 * c) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m256 w = _mm256_broadcast_ss(p + h * n + t);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[h][c] = _mm256_fmadd_ps(w, v[c], acc[h][c]);
    }
  });
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      if (8 * c < width) store_part(out + h * hd + d0 + 8 * c, acc[h][c], width - 8 * c);
}

template <KvElem E, int H>
void scores_heads(const float* q, int64_t hd, float scale, const PagedKv& kv, float* s) {
  scores_block<E, H>(q, hd, scale, kv, s);
}

template <KvElem E, int H>
void wsum_heads(const float* p, int64_t hd, const PagedKv& kv, float* out) {
  // H * C accumulators + C decoded chunks + 1 broadcast within 16 registers.
  constexpr int C = H <= 2 ? 4 : (H == 3 ? 3 : 2);
  for (int64_t d0 = 0; d0 < hd; d0 += 8 * C)
    wsum_block<E, H, C>(p, hd, kv, d0, std::min<int64_t>(8 * C, hd - d0), out);
}

template <KvElem E>
void run(const float* q, int64_t group, int64_t hd, float scale, const PagedKv& kv, float* scratch,
         float* out) {
  const int64_t n = kv.n_tokens;
  for (int64_t h0 = 0; h0 < group; h0 += 8) {
    const float* qb = q + h0 * hd;
    float* sb = scratch + h0 * n;
    switch (std::min<int64_t>(8, group - h0)) {
      case 1:
        scores_heads<E, 1>(qb, hd, scale, kv, sb);
        break;
      case 2:
        scores_heads<E, 2>(qb, hd, scale, kv, sb);
        break;
      case 3:
        scores_heads<E, 3>(qb, hd, scale, kv, sb);
        break;
      case 4:
        scores_heads<E, 4>(qb, hd, scale, kv, sb);
        break;
      case 5:
        scores_heads<E, 5>(qb, hd, scale, kv, sb);
        break;
      case 6:
        scores_heads<E, 6>(qb, hd, scale, kv, sb);
        break;
      case 7:
        scores_heads<E, 7>(qb, hd, scale, kv, sb);
        break;
      default:
        scores_heads<E, 8>(qb, hd, scale, kv, sb);
        break;
    }
  }
  for (int64_t h = 0; h < group; ++h) softmax(scratch + h * n, n);
  if constexpr (E != KvElem::kBf16) scale_probs(kv, group, kFold<E>, scratch);
  for (int64_t h0 = 0; h0 < group; h0 += 4) {
    const float* pb = scratch + h0 * n;
    float* ob = out + h0 * hd;
    switch (std::min<int64_t>(4, group - h0)) {
      case 1:
        wsum_heads<E, 1>(pb, hd, kv, ob);
        break;
      case 2:
        wsum_heads<E, 2>(pb, hd, kv, ob);
        break;
      case 3:
        wsum_heads<E, 3>(pb, hd, kv, ob);
        break;
      default:
        wsum_heads<E, 4>(pb, hd, kv, ob);
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

}  // namespace kvant::kernels::avx2
