// FP8-weight GEMM on AVX-512 F/BW (f8_tiling.h holds the loop nest). A unit
// is a P16 panel of 16 rows: its 32 codes of a column pair, in the order
// they lie (row 0 even, row 0 odd, row 1 even, ...), are sign-extended to 16
// bits and shifted into FP16 (e4m3(c) * 2^-8 exactly, subnormals included)
// and two VCVTPH2PS widen them to 2 x 16 FP32 lanes. x's pair is broadcast as
// (x[2q], x[2q+1]) x 8, so two FMAs per unit and row sum each row's even and
// odd columns in adjacent lanes; a group's end adds the two (the
// reference's e + o) and scales. No shuffle in the inner loop.
#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/f8_tiling.h"

namespace kvant::kernels::avx512 {
namespace {

struct F8Traits {
  static constexpr int64_t kU = 16;
  static constexpr int64_t kBlockRows = 128;
  struct Acc {
    __m512 lo, hi;  // rows 0..7 and 8..15, each as (even, odd) lane pairs
  };
  using WV = Acc;
  using XV = __m512;
  static Acc zero() { return {_mm512_setzero_ps(), _mm512_setzero_ps()}; }
  static XV xv(uint32_t bits) {
    const uint64_t lo = uint64_t(bits << 16), hi = uint64_t(bits & 0xffff0000u);
    return _mm512_castsi512_ps(_mm512_set1_epi64(int64_t(lo | (hi << 32))));
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
    return {_mm512_cvtph_ps(_mm512_castsi512_si256(h)),
            _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1))};
  }
  static Acc dot(const Acc& acc, XV x, const WV& w) {
    return {_mm512_fmadd_ps(x, w.lo, acc.lo), _mm512_fmadd_ps(x, w.hi, acc.hi)};
  }
  static void finish(const Acc& acc, const float* s, float* y, int64_t jbase, int64_t jlo,
                     int64_t jhi, bool first) {
    // Even lanes of lo then of hi, and odd lanes likewise: one row per lane.
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512 e = _mm512_permutex2var_ps(acc.lo, ev, acc.hi);
    const __m512 o = _mm512_permutex2var_ps(acc.lo, od, acc.hi);
    const __mmask16 mk = col_mask(jbase, jlo, jhi);
    const __m512 sv = _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(256.f));
    const __m512 prev = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, y + jbase);
    _mm512_mask_storeu_ps(y + jbase, mk, _mm512_fmadd_ps(_mm512_add_ps(e, o), sv, prev));
  }
  template <bool kNan>
  static int strip(int rows, const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t u0,
                   int64_t u1, float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
    if (rows >= 5) {
      f8_sweep<F8Traits, 6, 2, kNan>(std::min(rows, 6), x, ldx, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 6);
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
