// FP8-weight GEMM with VDPBF16PS (f8_tiling.h holds the loop nest). A unit
// is one P16 panel: 32 codes per column pair, sign-extended to 16 bits,
// shifted into FP16 (e4m3(c) * 2^-8 exactly, subnormals included), widened
// to FP32 by VCVTPH2PS and narrowed to BF16 pairs by VCVTNE2PS2BF16 (exact:
// every e4m3 value fits BF16), then one VDPBF16PS per x row. The scale is
// applied once per group with 2^8 folded in.
//
// avx512/gemm_f8_dpbf16_emulated.cpp compiles this file again with
// KVANT_EMULATE_DPBF16 (both BF16 instructions done with AVX-512 F/BW), so
// the tiling is tested on machines without AVX512_BF16.

#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/avx512bf16/avx512bf16.h"
#include "kernels/cpu/f8_tiling.h"

#ifndef KVANT_EMULATE_DPBF16
#define KVANT_DPBF16_NS avx512bf16
#else
#define KVANT_DPBF16_NS avx512bf16_emulated
#endif

namespace kvant::kernels::KVANT_DPBF16_NS {
namespace {

#ifndef KVANT_EMULATE_DPBF16
using Pairs = __m512bh;
inline Pairs to_pairs(__m512 lo, __m512 hi) { return _mm512_cvtne2ps_pbh(hi, lo); }
inline Pairs bcast(uint32_t v) { return (__m512bh)_mm512_set1_epi32(int(v)); }
inline __m512 dot(__m512 acc, Pairs a, Pairs b) { return _mm512_dpbf16_ps(acc, a, b); }
#else
using Pairs = __m512i;
// The values are BF16-exact, so narrowing is taking the high halves.
inline Pairs to_pairs(__m512 lo, __m512 hi) {
  const __m256i l = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16));
  const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(hi), 16));
  return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
}
inline Pairs bcast(uint32_t v) { return _mm512_set1_epi32(int(v)); }
inline __m512 dot(__m512 acc, Pairs a, Pairs b) {
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  const __m512 ao = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
  const __m512 bo = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
  const __m512 ae = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
  const __m512 be = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  return _mm512_fmadd_ps(ae, be, _mm512_fmadd_ps(ao, bo, acc));
}
#endif

struct F8Traits {
  static constexpr int64_t kU = 16;
  static constexpr int64_t kBlockRows = 128;
  using Acc = __m512;
  using WV = Pairs;
  using XV = Pairs;
  static Acc zero() { return _mm512_setzero_ps(); }
  static XV xv(uint32_t bits) { return bcast(bits); }
  template <bool kNan>
  static WV decode(const uint8_t* p) {
    const __m512i c = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    __m512i h = _mm512_and_si512(_mm512_slli_epi16(c, 7), _mm512_set1_epi16(short(0xbf80)));
    if constexpr (kNan) {
      const __m512i m = _mm512_set1_epi16(0x7f);
      h = _mm512_mask_mov_epi16(h, _mm512_cmpeq_epi16_mask(_mm512_and_si512(c, m), m),
                                _mm512_set1_epi16(0x7e00));
    }
    return to_pairs(_mm512_cvtph_ps(_mm512_castsi512_si256(h)),
                    _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)));
  }
  static Acc dot(Acc acc, XV x, WV w) { return KVANT_DPBF16_NS::dot(acc, x, w); }
  static void finish(Acc acc, const float* s, float* y, int64_t jbase, int64_t jlo, int64_t jhi,
                     bool first) {
    const __mmask16 mk = avx512::col_mask(jbase, jlo, jhi);
    const __m512 sv = _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(256.f));
    const __m512 prev = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, y + jbase);
    _mm512_mask_storeu_ps(y + jbase, mk, _mm512_fmadd_ps(acc, sv, prev));
  }
  template <bool kNan>
  static int strip(int rows, const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t u0,
                   int64_t u1, float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
    if (rows >= 9) {
      f8_sweep<F8Traits, 12, 2, kNan>(std::min(rows, 12), x, ldx, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 12);
    }
    if (rows >= 2) {
      f8_sweep<F8Traits, 4, 4, kNan>(std::min(rows, 4), x, ldx, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 4);
    }
    f8_sweep<F8Traits, 1, 8, kNan>(1, x, ldx, W, u0, u1, y, ldy, jlo, jhi);
    return 1;
  }
};

}  // namespace

void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1) {
  gemm_f8_blocked<F8Traits>(x, ldx, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::KVANT_DPBF16_NS
