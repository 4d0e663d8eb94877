// FP8-weight GEMM on AVX-512 F/BW (f8_tiling.h holds the loop nest). A unit
// is one P16 panel: its 32 codes of a column pair are sign-extended to 16
// bits and shifted into FP16 (e4m3(c) * 2^-8 exactly, subnormals included);
// VPMOVDW splits the even and odd columns (the low and high halves of each
// row's dword) and VCVTPH2PS widens each to 16 FP32 lanes, one per row. The
// even column's FMA comes before the odd one's, as the reference sums.
#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/f8_tiling.h"

namespace kvant::kernels::avx512 {
namespace {

struct F8Traits {
  static constexpr int64_t kU = 16;
  static constexpr int64_t kBlockRows = 128;
  using Acc = __m512;
  struct WV {
    __m512 e, o;
  };
  using XV = WV;
  static Acc zero() { return _mm512_setzero_ps(); }
  static XV xv(uint32_t bits) {
    return {_mm512_castsi512_ps(_mm512_set1_epi32(int(bits << 16))),
            _mm512_castsi512_ps(_mm512_set1_epi32(int(bits & 0xffff0000u)))};
  }
  template <bool kNan>
  static WV decode(const uint8_t* p) {
    const __m512i c = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    __m512i h = _mm512_and_si512(_mm512_slli_epi16(c, 7), _mm512_set1_epi16(short(0xbf80)));
    if constexpr (kNan) {
      const __m512i m = _mm512_set1_epi16(0x7f);
      h = _mm512_mask_mov_epi16(h, _mm512_cmpeq_epi16_mask(_mm512_and_si512(c, m), m),
                                _mm512_set1_epi16(0x7e00));
    }
    return {_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)),
            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)))};
  }
  static Acc dot(Acc acc, const XV& x, const WV& w) {
    return _mm512_fmadd_ps(x.o, w.o, _mm512_fmadd_ps(x.e, w.e, acc));
  }
  static void finish(Acc acc, const float* s, float* y, int64_t jbase, int64_t jlo, int64_t jhi,
                     bool first) {
    const __mmask16 mk = col_mask(jbase, jlo, jhi);
    const __m512 sv = _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(256.f));
    const __m512 prev = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, y + jbase);
    _mm512_mask_storeu_ps(y + jbase, mk, _mm512_fmadd_ps(acc, sv, prev));
  }
  template <bool kNan>
  static int strip(int rows, const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t u0,
                   int64_t u1, float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
    if (rows >= 5) {
      f8_sweep<F8Traits, 8, 2, kNan>(std::min(rows, 8), x, ldx, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 8);
    }
    if (rows >= 2) {
      f8_sweep<F8Traits, 4, 3, kNan>(std::min(rows, 4), x, ldx, W, u0, u1, y, ldy, jlo, jhi);
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

}  // namespace kvant::kernels::avx512
