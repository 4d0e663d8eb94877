// FP8-weight GEMM on AVX2 + F16C (f8_tiling.h holds the loop nest). A unit
// is half a P16 panel, 8 rows: its 16 codes of a column pair are
// sign-extended to 16 bits and shifted into FP16 (e4m3(c) * 2^-8 exactly,
// subnormals included); a byte shuffle and a qword permute gather the even
// and the odd columns, and VCVTPH2PS widens each to 8 FP32 lanes, one per
// row. The even column's FMA comes before the odd one's, as the reference.
#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx2/avx2_common.h"
#include "kernels/cpu/f8_tiling.h"

namespace kvant::kernels::avx2 {
namespace {

struct F8Traits {
  static constexpr int64_t kU = 8;
  static constexpr int64_t kBlockRows = 128;
  using Acc = __m256;
  struct WV {
    __m256 e, o;
  };
  using XV = WV;
  static Acc zero() { return _mm256_setzero_ps(); }
  static XV xv(uint32_t bits) {
    return {_mm256_castsi256_ps(_mm256_set1_epi32(int(bits << 16))),
            _mm256_castsi256_ps(_mm256_set1_epi32(int(bits & 0xffff0000u)))};
  }
  template <bool kNan>
  static WV decode(const uint8_t* p) {
    const __m256i c = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(c, 7), _mm256_set1_epi16(short(0xbf80)));
    if constexpr (kNan) {
      const __m256i m = _mm256_set1_epi16(0x7f);
      const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(c, m), m);
      h = _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7e00), nan);
    }
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i eo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(h, split), 0xd8);
    return {_mm256_cvtph_ps(_mm256_castsi256_si128(eo)),
            _mm256_cvtph_ps(_mm256_extracti128_si256(eo, 1))};
  }
  static Acc dot(Acc acc, const XV& x, const WV& w) {
    return _mm256_fmadd_ps(x.o, w.o, _mm256_fmadd_ps(x.e, w.e, acc));
  }
  static void finish(Acc acc, const float* s, float* y, int64_t jbase, int64_t jlo, int64_t jhi,
                     bool first) {
    const int64_t a = std::clamp<int64_t>(jlo - jbase, 0, 8), b = std::clamp<int64_t>(jhi - jbase, 0, 8);
    const __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(s), _mm256_set1_ps(256.f));
    const __m256 prev = first ? _mm256_setzero_ps() : load_range(y + jbase, a, b);
    store_range(y + jbase, _mm256_fmadd_ps(acc, sv, prev), a, b);
  }
  template <bool kNan>
  static int strip(int rows, const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t u0,
                   int64_t u1, float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
    if (rows >= 2) {
      f8_sweep<F8Traits, 4, 2, kNan>(std::min(rows, 4), x, ldx, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 4);
    }
    f8_sweep<F8Traits, 1, 4, kNan>(1, x, ldx, W, u0, u1, y, ldy, jlo, jhi);
    return 1;
  }
};

}  // namespace

void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1) {
  gemm_f8_blocked<F8Traits>(x, ldx, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::avx2
