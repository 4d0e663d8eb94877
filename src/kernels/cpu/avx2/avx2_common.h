// AVX2 building blocks shared by the files of avx2/: partial (tail) loads and
// stores, BF16 widening, the fixed horizontal-sum tree and exp. Included only
// by translation units compiled with AVX2 flags; internal linkage throughout.
#pragma once

// GCC 12's intrinsic headers seed "undefined" vectors with self-initialised
// locals, which -Wuninitialized flags once inlined; the pragma covers only
// the header's own lines.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>

namespace kvant::kernels::avx2 {
namespace {

// Lanes l < n (n clamped to [0, 8]) set.
inline __m256i lanes_below(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<int64_t>(n, 0, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// First n floats (n may exceed 8), the rest 0; never touches memory past p[n-1].
inline __m256 load_part(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(n));
}
inline void store_part(float* p, __m256 v, int64_t n) {
  if (n >= 8)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, lanes_below(n), v);
}
// Lanes [first, count) only (columns of another thread's range stay untouched).
inline __m256 load_range(const float* p, int64_t first, int64_t count) {
  if (first == 0) return load_part(p, count);
  if (first >= count) return _mm256_setzero_ps();
  return _mm256_maskload_ps(p, _mm256_andnot_si256(lanes_below(first), lanes_below(count)));
}
inline void store_range(float* p, __m256 v, int64_t first, int64_t count) {
  if (first >= count) return;
  if (first == 0) return store_part(p, v, count);
  _mm256_maskstore_ps(p, _mm256_andnot_si256(lanes_below(first), lanes_below(count)), v);
}
// First n floats, the rest `fill`.
inline __m256 load_part_fill(const float* p, int64_t n, __m256 fill) {
  if (n >= 8) return _mm256_loadu_ps(p);
  return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, lanes_below(n)),
                          _mm256_castsi256_ps(lanes_below(n)));
}

inline __m256 widen_bf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load_bf16(const uint16_t* p) {
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// First n BF16 values (n may exceed 8), the rest 0.
inline __m256 load_bf16_part(const uint16_t* p, int64_t n) {
  if (n >= 8) return load_bf16(p);
  alignas(16) uint16_t t[8] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i];
  return widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

// Fixed tree: lane l pairs with l+4, then l+2, then l+1.
inline float hsum(__m256 v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(b);
}

// exp as in avx512_common.h: Cephes reduction and polynomial; results below
// FLT_MIN are 0, x > 88.38 saturates near FLT_MAX.
inline __m256 exp_ps(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.37626f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
  // n is in [-126, 127] after the clamp, so 2^n is a normal float.
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), tiny);
}

}  // namespace
}  // namespace kvant::kernels::avx2
