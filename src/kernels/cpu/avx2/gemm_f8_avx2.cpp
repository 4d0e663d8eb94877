// FP8-weight GEMM on AVX2 + F16C (f8_tiling.h holds the loop nest). A unit
// is 4 rows, a quarter of a P16 panel: their 8 codes of a column pair, in
// the order they lie (row 0 even, row 0 odd, ...), are sign-extended to 16
// bits and shifted into FP16 (e4m3(c) * 2^-8 exactly, subnormals included)
// and VCVTPH2PS widens them to 8 FP32 lanes. x's pair is broadcast as
// (x[2q], x[2q+1]) x 4, so one FMA per unit and row sums each row's even and
// odd columns in adjacent lanes; a group's end adds the two (the
// reference's e + o) and scales.
#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx2/avx2_common.h"
#include "kernels/cpu/f8_tiling.h"

namespace kvant::kernels::avx2 {
namespace {

struct F8Traits {
  static constexpr int64_t kU = 4;
  static constexpr int64_t kBlockRows = 128;
  using Acc = __m256;
  using WV = __m256;
  using XV = __m256;
  static Acc zero() { return _mm256_setzero_ps(); }
  static XV xv(uint32_t bits) {
    const uint64_t lo = uint64_t(bits << 16), hi = uint64_t(bits & 0xffff0000u);
    return _mm256_castsi256_ps(_mm256_set1_epi64x(int64_t(lo | (hi << 32))));
  }
  template <bool kNan>
  static WV decode(const uint8_t* p) {
    const __m128i c = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    __m128i h = _mm_and_si128(_mm_slli_epi16(c, 7), _mm_set1_epi16(short(0xbf80)));
    if constexpr (kNan) {
      const __m128i m = _mm_set1_epi16(0x7f);
      h = _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), _mm_cmpeq_epi16(_mm_and_si128(c, m), m));
    }
    return _mm256_cvtph_ps(h);
  }
  static Acc dot(Acc acc, XV x, WV w) { return _mm256_fmadd_ps(x, w, acc); }
  static void finish(Acc acc, const float* s, float* y, int64_t jbase, int64_t jlo, int64_t jhi,
                     bool first) {
    // (e0+o0, e1+o1, ., .) in the low lane, (e2+o2, e3+o3, ., .) in the high.
    const __m256 h = _mm256_hadd_ps(acc, acc);
    const __m128 sum = _mm_castpd_ps(_mm_unpacklo_pd(_mm_castps_pd(_mm256_castps256_ps128(h)),
                                                     _mm_castps_pd(_mm256_extractf128_ps(h, 1))));
    const int64_t a = std::clamp<int64_t>(jlo - jbase, 0, 4), b = std::clamp<int64_t>(jhi - jbase, 0, 4);
    const __m128i lanes = _mm_andnot_si128(
        _mm_cmpgt_epi32(_mm_set1_epi32(int(a)), _mm_setr_epi32(0, 1, 2, 3)),
        _mm_cmpgt_epi32(_mm_set1_epi32(int(b)), _mm_setr_epi32(0, 1, 2, 3)));
    const __m128 sv = _mm_mul_ps(_mm_loadu_ps(s), _mm_set1_ps(256.f));
    const __m128 prev = first ? _mm_setzero_ps() : _mm_maskload_ps(y + jbase, lanes);
    _mm_maskstore_ps(y + jbase, lanes, _mm_fmadd_ps(sum, sv, prev));
  }
  template <bool kNan>
  static int strip(int rows, const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t u0,
                   int64_t u1, float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
    if (rows >= 2) {
      f8_sweep<F8Traits, 4, 2, kNan>(std::min(rows, 4), x, ldx, W, u0, u1, y, ldy, jlo, jhi);
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

}  // namespace kvant::kernels::avx2
