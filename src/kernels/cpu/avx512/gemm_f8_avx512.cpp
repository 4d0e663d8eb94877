// FP8-weight GEMM on AVX-512 F/BW (f8_tiling.h holds the loop nest). A unit
// is an F8 Q16 panel of 16 rows, one row per FP32 lane: a column quad's 64
// bytes load as one vector whose lane r is row r's word of four codes, and
// code t becomes the FP32 e4m3 * 2^-120 by moving its byte to the top
// (t < 3), an arithmetic shift right by 4 (the sign lands on bit 31 and,
// repeated, on bits 30..27) and a mask keeping the sign, exponent and
// mantissa bits (0x87f00000): three integer operations per 16 weights, no
// shuffle, no conversion instruction. Each column's x is one broadcast.
#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/f8_tiling.h"

namespace kvant::kernels::avx512 {
namespace {

struct F8Traits {
  static constexpr int64_t kU = 16;
  static constexpr int64_t kBlockRows = 128;
  using V = __m512;
  using R = __m512i;
  static V zero() { return _mm512_setzero_ps(); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  // One load per quad: without the empty asm the compiler folds the load
  // into each of the four decodes' first instruction (four loads).
  static R load(const uint8_t* p) {
    R d = _mm512_loadu_si512(p);
    asm("" : "+v"(d));
    return d;
  }
  template <int t, int kMode>
  static V decode(R d) {
    constexpr bool kSub = (kMode & kF8Sub) != 0;
    const R top = t == 3 ? d : _mm512_slli_epi32(d, 24 - 8 * t);
    const R s4 = _mm512_srai_epi32(top, 4), mask = _mm512_set1_epi32(int(0x87f00000u));
    // kSub: exponent field + 16 ((s4 & mask) | bit 27), so that the value is
    // e4m3 * 2^-104 and never an FP32 denormal.
    R v = kSub ? _mm512_ternarylogic_epi32(s4, mask, _mm512_set1_epi32(0x08000000), 0xEA)
               : _mm512_and_si512(s4, mask);
    if constexpr ((kMode & kF8Nan) != 0) {
      // 0x7f / 0xff decode to +-0x07f00000 here (0x0ff00000 with kSub): make them NaN.
      const __mmask16 nan =
          _mm512_cmpeq_epi32_mask(_mm512_and_si512(v, _mm512_set1_epi32(0x7fffffff)),
                                  _mm512_set1_epi32(kSub ? 0x0ff00000 : 0x07f00000));
      v = _mm512_mask_mov_epi32(v, nan, _mm512_set1_epi32(0x7fc00000));
    }
    if constexpr (!kSub) return _mm512_castsi512_ps(v);
    // An exponent-0 code now reads 2^-111 * 1.mmm; 2v - sign(v) * 2^-110 is
    // its value, 2^-110 * 0.mmm, exactly (zero codes give 0).
    const __mmask16 zero_exp = _mm512_testn_epi32_mask(top, _mm512_set1_epi32(0x78000000));
    const R c = _mm512_ternarylogic_epi32(v, _mm512_set1_epi32(int(0x80000000u)),
                                          _mm512_set1_epi32(0x08800000), 0xEA);
    return _mm512_mask_fmsub_ps(_mm512_castsi512_ps(v), zero_exp, _mm512_set1_ps(2.f),
                                _mm512_castsi512_ps(c));
  }
  static V fma(V acc, V x, V w) { return _mm512_fmadd_ps(x, w, acc); }
  static V fold(V e, V o, float unscale, const float* s, V y) {
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_add_ps(e, o), _mm512_set1_ps(unscale)),
                           _mm512_loadu_ps(s), y);
  }
  static V load_y(const float* y, int64_t jbase, int64_t jlo, int64_t jhi) {
    return _mm512_maskz_loadu_ps(col_mask(jbase, jlo, jhi), y + jbase);
  }
  static void store_y(V v, float* y, int64_t jbase, int64_t jlo, int64_t jhi) {
    _mm512_mask_storeu_ps(y + jbase, col_mask(jbase, jlo, jhi), v);
  }
  template <int kMode>
  static int strip(int rows, const F8Rows& xs, const F8Weights& W, int64_t u0, int64_t u1,
                   float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
    if (rows >= 9) {
      f8_sweep<F8Traits, 12, 1, kMode>(std::min(rows, 12), xs, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 12);
    }
    if (rows >= 5) {
      f8_sweep<F8Traits, 6, 2, kMode>(std::min(rows, 6), xs, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 6);
    }
    if (rows >= 2) {
      f8_sweep<F8Traits, 4, 3, kMode>(std::min(rows, 4), xs, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 4);
    }
    f8_sweep<F8Traits, 1, 8, kMode>(1, xs, W, u0, u1, y, ldy, jlo, jhi);
    return 1;
  }
};

}  // namespace

void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1) {
  gemm_f8_blocked<F8Traits>(x, ldx, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::avx512
