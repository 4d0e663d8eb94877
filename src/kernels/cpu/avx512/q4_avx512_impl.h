// The AVX-512 gemm_q4 body, shared by avx512/ (byte products emulated with
// VPMADDUBSW + VPMADDWD, for CPUs without VNNI such as Skylake-SP) and
// avx512vnni/ (VPDPBUSD). Both give identical integer sums, so identical
// bits. Included only by translation units compiled with AVX-512 flags.
#pragma once

#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/kernels.h"

namespace kvant::kernels::avx512 {
namespace {

// acc += per 32-bit lane, the sum of four u8 x s8 products (VPDPBUSD).
template <bool Vnni>
inline __m512i dot_u8s8(__m512i acc, __m512i u, __m512i s) {
#ifdef __AVX512VNNI__
  if constexpr (Vnni) return _mm512_dpbusd_epi32(acc, u, s);
#endif
  // |u * s| <= 15 * 128, so the pairwise int16 sums cannot saturate.
  const __m512i p16 = _mm512_maddubs_epi16(u, s);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
}

// Rows 16p .. 16p+15 (the first `valid` stored) for M consecutive rows of x.
template <int M, bool Vnni>
inline void q4_panel(const Q8Rows& x, int64_t i0, const Q4Weights& W, int64_t p, float* y,
                     int64_t ldy, int64_t j0, int64_t valid) {
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const int64_t groups = q4_groups(W.k, W.group), bpg = W.group / kQ4Block, nblk = W.k / kQ4Block;
  const uint8_t* pw = W.w + p * W.k * 8;
  const int8_t* a[M];
  const float* sa[M];
  const int32_t* asum[M];
  _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) {
    a[t] = x.q + (i0 + t) * x.ldq;
    sa[t] = x.s + (i0 + t) * x.lds;
    asum[t] = x.sum + (i0 + t) * x.lds;
  }
  __m512 yv[M];
  _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) yv[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t at = (p * groups + g) * 16;
    const __m512i ov =
        W.offs ? _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(W.offs + at)))
               : _mm512_set1_epi32(8);
    __m512 acc[M];
    _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t bb = 0; bb < bpg && g * bpg + bb < nblk; ++bb) {
      const int64_t b = g * bpg + bb;
      const uint8_t* wb = pw + b * 256;
      __m512i s0[M], s1[M];
      _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) s0[t] = s1[t] = _mm512_setzero_si512();
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_loadu_si512(wb + c * 64);
        const __m512i lo = _mm512_and_si512(raw, nib);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
        _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) {
          const int32_t* ad = reinterpret_cast<const int32_t*>(a[t] + b * 32 + c * 8);
          s0[t] = dot_u8s8<Vnni>(s0[t], lo, _mm512_set1_epi32(ad[0]));
          s1[t] = dot_u8s8<Vnni>(s1[t], hi, _mm512_set1_epi32(ad[1]));
        }
      }
      _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) {
        const __m512i isum = _mm512_sub_epi32(
            _mm512_add_epi32(s0[t], s1[t]), _mm512_mullo_epi32(ov, _mm512_set1_epi32(asum[t][b])));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(sa[t][b]), acc[t]);
      }
    }
    const __m512 sw = load_bf16(W.scales + at);
    _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) yv[t] = _mm512_fmadd_ps(acc[t], sw, yv[t]);
  }
  const __mmask16 mk = mask16(valid);
  _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) _mm512_mask_storeu_ps(y + (i0 + t) * ldy + j0, mk, yv[t]);
}

template <bool Vnni>
void gemm_q4_impl(const Q8Rows& x, const Q4Weights& W, float* y, int64_t ldy, int64_t m,
                  int64_t n0, int64_t n1) {
  for (int64_t p = n0 / 16; p * 16 < n1; ++p) {
    const int64_t j0 = p * 16, valid = std::min<int64_t>(16, n1 - j0);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) q4_panel<4, Vnni>(x, i, W, p, y, ldy, j0, valid);
    switch (m - i) {
      case 3: q4_panel<3, Vnni>(x, i, W, p, y, ldy, j0, valid); break;
      case 2: q4_panel<2, Vnni>(x, i, W, p, y, ldy, j0, valid); break;
      case 1: q4_panel<1, Vnni>(x, i, W, p, y, ldy, j0, valid); break;
      default: break;
    }
  }
}

}  // namespace
}  // namespace kvant::kernels::avx512
