// AVX2 INT4 kernels: activation quantization and gemm_q4 (kernels.h). A Q4
// P16 panel is taken as two halves of 8 rows (bytes 0..31 and 32..63 of each
// 64-byte chunk); byte products use VPMADDUBSW + VPMADDWD, whose integer sums
// equal VPDPBUSD's, so results are bitwise those of the other ISAs.
#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx2/avx2_common.h"

namespace kvant::kernels::avx2 {
namespace {

inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Rows 16p + 8h .. +7 (the first `valid` stored) for M consecutive rows of x.
template <int M>
inline void q4_half(const Q8Rows& x, int64_t i0, const Q4Weights& W, int64_t p, int h, float* y,
                    int64_t ldy, int64_t j0, int64_t valid) {
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const int64_t groups = q4_groups(W.k, W.group), bpg = W.group / kQ4Block, nblk = W.k / kQ4Block;
  const uint8_t* pw = W.w + p * W.k * 8 + h * 32;
  __m256 yv[M];
  _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) yv[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t at = (p * groups + g) * 16 + h * 8;
    const __m256i ov =
        W.offs ? _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(W.offs + at)))
               : _mm256_set1_epi32(8);
    __m256 acc[M];
    _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t bb = 0; bb < bpg && g * bpg + bb < nblk; ++bb) {
      const int64_t b = g * bpg + bb;
      __m256i s[M];
      _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) s[t] = _mm256_setzero_si256();
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; ++c) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pw + b * 256 + c * 64));
        const __m256i lo = _mm256_and_si256(raw, nib);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
        _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) {
          const int32_t* ad = reinterpret_cast<const int32_t*>(x.q + (i0 + t) * x.ldq + b * 32 + c * 8);
          s[t] = dot_u8s8(s[t], lo, _mm256_set1_epi32(ad[0]));
          s[t] = dot_u8s8(s[t], hi, _mm256_set1_epi32(ad[1]));
        }
      }
      _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) {
        const int64_t r = (i0 + t) * x.lds + b;
        const __m256i isum =
            _mm256_sub_epi32(s[t], _mm256_mullo_epi32(ov, _mm256_set1_epi32(x.sum[r])));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(x.s[r]), acc[t]);
      }
    }
    const __m256 sw = load_bf16(W.scales + at);
    _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) yv[t] = _mm256_fmadd_ps(acc[t], sw, yv[t]);
  }
  _Pragma("GCC unroll 4") for (int t = 0; t < M; ++t) store_part(y + (i0 + t) * ldy + j0 + h * 8, yv[t], valid - h * 8);
}

}  // namespace

void quantize_q8(const float* x, int64_t k, int8_t* q, float* s, int32_t* sum) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < k / kQ4Block; ++b) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + b * 32 + i * 8);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    }
    const float amax = hmax(mx);
    if (amax == 0.f) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), _mm256_setzero_si256());
      s[b] = 0.f;
      sum[b] = 0;
      continue;
    }
    const __m256 id = _mm256_set1_ps(127.f / amax);
    __m256i a[4];
    for (int i = 0; i < 4; ++i) a[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    // int32 -> int8 keeping order: packs interleave 128-bit lanes, a final
    // dword permute restores it.
    const __m256i w01 = _mm256_packs_epi32(a[0], a[1]), w23 = _mm256_packs_epi32(a[2], a[3]);
    const __m256i b8 = _mm256_packs_epi16(w01, w23);
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), ordered);
    s[b] = amax / 127.f;
    sum[b] = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3])));
  }
}

void gemm_q4(const Q8Rows& x, const Q4Weights& W, float* y, int64_t ldy, int64_t m, int64_t n0,
             int64_t n1) {
  for (int64_t p = n0 / 16; p * 16 < n1; ++p) {
    const int64_t j0 = p * 16, valid = std::min<int64_t>(16, n1 - j0);
    for (int h = 0; h < (valid > 8 ? 2 : 1); ++h) {
      int64_t i = 0;
      for (; i + 4 <= m; i += 4) q4_half<4>(x, i, W, p, h, y, ldy, j0, valid);
      switch (m - i) {
        case 3: q4_half<3>(x, i, W, p, h, y, ldy, j0, valid); break;
        case 2: q4_half<2>(x, i, W, p, h, y, ldy, j0, valid); break;
        case 1: q4_half<1>(x, i, W, p, h, y, ldy, j0, valid); break;
        default: break;
      }
    }
  }
}

}  // namespace kvant::kernels::avx2
