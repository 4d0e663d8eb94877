// Scalar bookkeeping shared by every ISA's paged_attn_decode (contract in
// kernels.h): where token t's K/V row and scales live, and the per-token
// factors that scale scores and probabilities. No intrinsics and no vector
// code, so each ISA's translation unit can include it; internal linkage, so
// copies compiled with different flags never meet at link time.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/kernels.h"

namespace kvant::kernels {
namespace {

inline int64_t kv_elem_bytes(KvDType e) { return e == KvDType::kBf16 ? 2 : 1; }

// fn(std::integral_constant<KvDType, e>()): an element type as a template argument.
template <class Fn>
inline void with_elem(KvDType e, Fn&& fn) {
  switch (e) {
    case KvDType::kFp8E4m3:
      return fn(std::integral_constant<KvDType, KvDType::kFp8E4m3>());
    case KvDType::kFp8E5m2:
      return fn(std::integral_constant<KvDType, KvDType::kFp8E5m2>());
    default:
      return fn(std::integral_constant<KvDType, KvDType::kBf16>());
  }
}

// Visits t = 0 .. n-1 in order as fn(t, page, slot).
template <class Fn>
inline void for_each_token(const PagedKv& kv, Fn&& fn) {
  for (int64_t t0 = 0, pg = 0; t0 < kv.n_tokens; t0 += kv.page_tokens, ++pg) {
    const int64_t len = kv.n_tokens - t0 < kv.page_tokens ? kv.n_tokens - t0 : kv.page_tokens;
    for (int64_t i = 0; i < len; ++i) fn(t0 + i, pg, i);
  }
}

// Pages are scattered, so hardware prefetchers stop at each page's end: SIMD
// kernels request rows (and dynamic scales) this many pages ahead.
inline constexpr int64_t kPrefetchPages = 4;

// The in-loop prefetches run kPrefetchPages pages ahead, so a task's first
// pages would be read cold: at its start, ask for their K rows, then their V
// rows (needed only after the score pass, so they have time to arrive). At
// batch, where every task is a short context, those are a third or more of
// all rows read.
inline void prefetch_lead_pages(const PagedKv& kv, int64_t row_bytes) {
  const int64_t pt = kv.page_tokens;
  const int64_t lead = kv.n_tokens < kPrefetchPages * pt ? kv.n_tokens : kPrefetchPages * pt;
  const uint8_t* const* const both[2] = {kv.k_pages, kv.v_pages};
  for (const uint8_t* const* pages : both)
    for (int64_t t = 0; t < lead; ++t)
      for (int64_t b = 0; b < row_bytes; b += 64)
        __builtin_prefetch(pages[t / pt] + (t % pt) * kv.token_stride + b, 0, 1);
}

// Dynamic scales sit in a separate block of each page: at a page's first slot,
// ask for the scales kPrefetchPages pages on (a few lines) so later reads hit.
inline void prefetch_next_scales(const uint16_t* const* scales, int64_t pg, int64_t i,
                                 const PagedKv& kv) {
  if (!scales || i != 0 || (pg + kPrefetchPages) * kv.page_tokens >= kv.n_tokens) return;
  for (int64_t b = 0; b < kv.page_tokens * kv.scale_stride; b += 32)
    __builtin_prefetch(scales[pg + kPrefetchPages] + b);
}

// A stored BF16 scale as FP32 (exact).
inline float scale_value(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

inline float k_token_scale(const PagedKv& kv, int64_t pg, int64_t i) {
  return kv.k_scales ? scale_value(kv.k_scales[pg][i * kv.scale_stride]) : kv.k_scale;
}
inline float v_token_scale(const PagedKv& kv, int64_t pg, int64_t i) {
  return kv.v_scales ? scale_value(kv.v_scales[pg][i * kv.scale_stride]) : kv.v_scale;
}

// FP8 codes in SIMD lanes (both ISAs). A code moved to the top byte of a
// 32-bit lane, shifted right arithmetically by `shift` and masked with `mask`,
// is the FP32 whose value is the code's times 2^-bias exactly: the code's
// exponent and mantissa bits land in FP32's fields below a zero exponent
// prefix (the exponent bias grows by `bias`), its sign on FP32's, and
// subnormal codes become FP32 subnormals. Codes with every exponent bit set
// (e4m3 NaN, e5m2 Inf and NaN) are the lanes with (bits & special) ==
// special; OR-ing 0x7f800000 into those gives FP32's Inf or NaN, sign and
// mantissa kept. `special_byte` finds the same codes in raw bytes.
template <KvDType E>
struct F8Lanes;
template <>
struct F8Lanes<KvDType::kFp8E4m3> {
  static constexpr int shift = 4, bias = 120;
  static constexpr uint32_t mask = 0x87f00000u, special = 0x07f00000u;
  static constexpr uint8_t special_byte = 0x7f;
  static constexpr float unbias = 0x1p120f, fold_limit = 0x1p8f;  // fold_limit = 2^(128 - bias)
};
template <>
struct F8Lanes<KvDType::kFp8E5m2> {
  static constexpr int shift = 3, bias = 112;
  static constexpr uint32_t mask = 0x8fe00000u, special = 0x0f800000u;
  static constexpr uint8_t special_byte = 0x7c;
  static constexpr float unbias = 0x1p112f, fold_limit = 0x1p16f;
};

// The V fold (the SIMD weighted sums' probability fold): V codes stay 2^-bias
// small, so w = p * vs_t is multiplied by 2^bias (exact) and the FMA's
// product (w * 2^bias) * (v * 2^-bias) is the contract's w * v, rounding
// included. p <= 1 after softmax, so w * 2^bias stays finite while |vs_t| <
// fold_limit; tokens with a larger scale (none in practice) keep w as it is
// and widen their codes to exact values instead.

// Queries are multiplied by 2^K (K = min(bias, 126 - E), E the exponent of
// max |q|, so |q| * 2^K < 2^127) before meeting 2^-bias-scaled K codes; the
// score then takes 2^(bias - K) back with its per-token factor. Returns K.
template <KvDType E>
inline int q_scale_exp(const float* q, int64_t n) {
  uint32_t top = 0;
  for (int64_t d = 0; d < n; ++d) {
    uint32_t u;
    __builtin_memcpy(&u, q + d, 4);
    u &= 0x7fffffffu;
    top = u > top ? u : top;  // NaN and Inf compare above every finite value
  }
  const int e = int(top >> 23) - 127;
  return e + F8Lanes<E>::bias <= 126 ? F8Lanes<E>::bias : 126 - e;
}

// 2^e as FP32 for -126 <= e <= 127.
inline float pow2f(int e) {
  const uint32_t u = uint32_t(e + 127) << 23;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// The SIMD scores' copy of q for FP8 rows read `lanes` 32-bit lanes at a
// time (four codes a lane; chunk t of a block holds codes 4j + t):
// qp[h * ldp + d + lanes * t + j] = q[h * hd + d + 4 j + t] * 2^K_h (0 past
// hd), ldp = hd rounded up to 4 * lanes; fold[h] = 2^(bias - K_h).
template <KvDType E, int64_t lanes>
inline void permute_q(const float* q, int64_t heads, int64_t hd, float* qp, int64_t ldp,
                      float* fold) {
  for (int64_t h = 0; h < heads; ++h) {
    const int k = q_scale_exp<E>(q + h * hd, hd);
    const float s = pow2f(k);
    fold[h] = pow2f(F8Lanes<E>::bias - k);
    for (int64_t d = 0; d < ldp; d += 4 * lanes)
      for (int64_t t = 0; t < 4; ++t)
        for (int64_t j = 0; j < lanes; ++j) {
          const int64_t x = d + 4 * j + t;
          qp[h * ldp + d + lanes * t + j] = x < hd ? q[h * hd + x] * s : 0.f;
        }
  }
}

// The reference's paged_attn_probs: softmax `sm` per head, then (FP8)
// p[h * lds + t] *= vs_t. (The SIMD ISAs also multiply by the V fold, 16 or 8
// tokens at a time.)
template <class Softmax>
inline void probs_pass(float* s, int64_t lds, int64_t group, const PagedKv& kv, Softmax&& sm) {
  for (int64_t h = 0; h < group; ++h) sm(s + h * lds, kv.n_tokens);
  if (kv.elem == KvDType::kBf16) return;
  for_each_token(kv, [&](int64_t t, int64_t pg, int64_t i) {
    const float vs = v_token_scale(kv, pg, i);
    for (int64_t h = 0; h < group; ++h) s[h * lds + t] *= vs;
  });
}

}  // namespace
}  // namespace kvant::kernels
