// AVX-512 (F/BW) INT4 kernels without VNNI: activation quantization and
// gemm_q4 with emulated byte dot products (q4_avx512_impl.h).
#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/q4_avx512_impl.h"

namespace kvant::kernels::avx512 {

void quantize_q8(const float* x, int64_t k, int8_t* q, float* s, int32_t* sum) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int64_t b = 0; b < k / kQ4Block; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
    if (amax == 0.f) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), _mm256_setzero_si256());
      s[b] = 0.f;
      sum[b] = 0;
      continue;
    }
    const __m512 id = _mm512_set1_ps(127.f / amax);
    const __m512i a0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
    const __m512i a1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 32), _mm512_cvtepi32_epi8(a0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 32 + 16), _mm512_cvtepi32_epi8(a1));
    s[b] = amax / 127.f;
    sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(a0, a1));
  }
}

void gemm_q4(const Q8Rows& x, const Q4Weights& w, float* y, int64_t ldy, int64_t m, int64_t n0,
             int64_t n1) {
  gemm_q4_impl<false>(x, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::avx512
