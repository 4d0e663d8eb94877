// FP8-weight GEMM on AVX2 (f8_tiling.h holds the loop nest). A unit is 8
// rows, half an F8 Q16 panel, one row per FP32 lane: a column quad's 32
// bytes of those rows load as one vector of the rows' words, and code t
// becomes the FP32 e4m3 * 2^-120 with a shift of its byte to the top (t <
// 3), an arithmetic shift right by 4 and a mask (0x87f00000), as on AVX-512.
#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx2/avx2_common.h"
#include "kernels/cpu/f8_tiling.h"

namespace kvant::kernels::avx2 {
namespace {

struct F8Traits {
  static constexpr int64_t kU = 8;
  static constexpr int64_t kBlockRows = 128;
  using V = __m256;
  using R = __m256i;
  static V zero() { return _mm256_setzero_ps(); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  // One load per quad (the empty asm keeps it out of the decodes' shifts).
  static R load(const uint8_t* p) {
    R d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    asm("" : "+x"(d));
    return d;
  }
  template <int t, int kMode>
  static V decode(R d) {
    constexpr bool kSub = (kMode & kF8Sub) != 0;
    const R top = t == 3 ? d : _mm256_slli_epi32(d, 24 - 8 * t);
    R v = _mm256_and_si256(_mm256_srai_epi32(top, 4), _mm256_set1_epi32(int(0x87f00000u)));
    // kSub, as on AVX-512: exponent field + 16 (e4m3 * 2^-104, never an FP32 denormal).
    if constexpr (kSub) v = _mm256_or_si256(v, _mm256_set1_epi32(0x08000000));
    if constexpr ((kMode & kF8Nan) != 0) {
      // 0x7f / 0xff decode to +-0x07f00000 here (0x0ff00000 with kSub): make them NaN.
      const R nan = _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7fffffff)),
                                       _mm256_set1_epi32(kSub ? 0x0ff00000 : 0x07f00000));
      v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7fc00000), nan);
    }
    if constexpr (!kSub) return _mm256_castsi256_ps(v);
    // Exponent-0 codes become 2v - sign(v) * 2^-110, exactly.
    const R zero_exp = _mm256_cmpeq_epi32(_mm256_and_si256(top, _mm256_set1_epi32(0x78000000)),
                                          _mm256_setzero_si256());
    const R c = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(int(0x80000000u))),
                                _mm256_set1_epi32(0x08800000));
    const V vf = _mm256_castsi256_ps(v);
    const V fixed = _mm256_fmsub_ps(vf, _mm256_set1_ps(2.f), _mm256_castsi256_ps(c));
    return _mm256_blendv_ps(vf, fixed, _mm256_castsi256_ps(zero_exp));
  }
  static V fma(V acc, V x, V w) { return _mm256_fmadd_ps(x, w, acc); }
  static V fold(V e, V o, float unscale, const float* s, V y) {
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_add_ps(e, o), _mm256_set1_ps(unscale)),
                           _mm256_loadu_ps(s), y);
  }
  // Lanes of the unit's 8 columns from jbase that fall in [jlo, jhi).
  static __m256i lanes(int64_t jbase, int64_t jlo, int64_t jhi) {
    const int a = int(std::clamp<int64_t>(jlo - jbase, 0, 8));
    const int b = int(std::clamp<int64_t>(jhi - jbase, 0, 8));
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(a), idx),
                               _mm256_cmpgt_epi32(_mm256_set1_epi32(b), idx));
  }
  static V load_y(const float* y, int64_t jbase, int64_t jlo, int64_t jhi) {
    return _mm256_maskload_ps(y + jbase, lanes(jbase, jlo, jhi));
  }
  static void store_y(V v, float* y, int64_t jbase, int64_t jlo, int64_t jhi) {
    _mm256_maskstore_ps(y + jbase, lanes(jbase, jlo, jhi), v);
  }
  template <int kMode>
  static int strip(int rows, const F8Rows& xs, const F8Weights& W, int64_t u0, int64_t u1,
                   float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
    if (rows >= 2) {
      f8_sweep<F8Traits, 4, 1, kMode>(std::min(rows, 4), xs, W, u0, u1, y, ldy, jlo, jhi);
      return std::min(rows, 4);
    }
    f8_sweep<F8Traits, 1, 4, kMode>(1, xs, W, u0, u1, y, ldy, jlo, jhi);
    return 1;
  }
};

}  // namespace

void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1) {
  gemm_f8_blocked<F8Traits>(x, ldx, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::avx2
