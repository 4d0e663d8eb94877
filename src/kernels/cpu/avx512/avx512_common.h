// AVX-512 (F/BW/VL/DQ) building blocks shared by the files of avx512/ and
// avx512bf16/: BF16 widening, the fixed horizontal-sum tree, exp, the 16x16
// transpose that repacks plain BF16 weights into P16-pair panels, and the x
// strip packers. Included only by translation units compiled with AVX-512
// flags; everything has internal linkage (see gemm_tiling.h for why).
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

namespace kvant::kernels::avx512 {
namespace {

// Masks of the first n lanes (n clamped to [0, lanes]; BZHI reads only 8 index bits).
inline __mmask16 mask16(int64_t n) {
  return __mmask16(_bzhi_u32(0xffffu, unsigned(std::clamp<int64_t>(n, 0, 16))));
}
inline __mmask32 mask32(int64_t n) {
  return __mmask32(_bzhi_u32(0xffffffffu, unsigned(std::clamp<int64_t>(n, 0, 32))));
}

// 16 BF16 -> 16 FP32 (exact).
inline __m512 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 maskz_load_bf16(__mmask16 m, const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// Fixed tree: lane l pairs with l+8, then l+4, l+2, l+1. Every kernel that
// reduces lanes uses this one, so a row's sum never depends on its neighbours.
inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(b);
}

// The reduction tree of 16 dot products at once (paged attention, attn_scores).
// Inputs are per-token 16-lane partial sums; outputs hold
// partial sums of several tokens. Each level adds lane l to lane l + w of the
// same token (w = 8, 4, 2, 1: hsum's tree); the two addends come from one
// blend (kept lanes) and one shuffle (the moved ones), or two shuffles.
// [a0 (8 partials) | a1 (8)]
inline __m512 tree1(__m512 a0, __m512 a1) {
  return _mm512_add_ps(_mm512_mask_blend_ps(0xff00, a0, a1),
                       _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(1, 0, 3, 2)));
}
// [b0 = T0 | T1] [b1 = T2 | T3] -> [T0 | T1 | T2 | T3], 4 partials each.
inline __m512 tree2(__m512 b0, __m512 b1) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)));
}
// [c0 = T0..T3] [c1 = T4..T7] -> block k: [T_k x2 | T_{k+4} x2].
inline __m512 tree3(__m512 c0, __m512 c1) {
  return _mm512_add_ps(_mm512_mask_blend_ps(0xcccc, c0, c1),
                       _mm512_shuffle_ps(c0, c1, _MM_SHUFFLE(1, 0, 3, 2)));
}
// [d0 = T0..T7] [d1 = T8..T15] -> lane 4k + m holds token k + 4m.
inline __m512 tree4(__m512 d0, __m512 d1) {
  return _mm512_add_ps(_mm512_shuffle_ps(d0, d1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(d0, d1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// exp(x) for FP32 lanes, Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6
// polynomial, about 1 ulp on [-87.3, 88.3]. Results below FLT_MIN (x < -87.34,
// -inf included) are 0; x > 88.38 saturates near FLT_MAX.
inline __m512 exp_ps(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.37626f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(__mmask16(~tiny), _mm512_scalef_ps(p, n));
}

// In place: r[i] lane c -> r[c] lane i (16x16 dwords).
inline void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // b[4g + s]: in each 128-bit block c4, column 4*c4 + s of rows 4g .. 4g+3.
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    b[4 * g + 0] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
    b[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s) {
    const __m512i c01 = _mm512_shuffle_i32x4(b[s], b[4 + s], 0x44);
    const __m512i c01h = _mm512_shuffle_i32x4(b[s], b[4 + s], 0xee);
    const __m512i c23 = _mm512_shuffle_i32x4(b[8 + s], b[12 + s], 0x44);
    const __m512i c23h = _mm512_shuffle_i32x4(b[8 + s], b[12 + s], 0xee);
    r[0 + s] = _mm512_shuffle_i32x4(c01, c23, 0x88);
    r[4 + s] = _mm512_shuffle_i32x4(c01, c23, 0xdd);
    r[8 + s] = _mm512_shuffle_i32x4(c01h, c23h, 0x88);
    r[12 + s] = _mm512_shuffle_i32x4(c01h, c23h, 0xdd);
  }
}

// Rows [j0, j0+rows) of W [., k], pairs [q0, q0+kc) -> P16-pair panels with a
// stride of kc*16 dwords; rows past `rows` (up to the next 16) are zero.
inline void pack_w(const uint16_t* w, int64_t k, int64_t j0, int64_t rows, int64_t q0, int64_t kc,
                   uint32_t* out) {
  const int64_t npanels = (rows + 15) / 16;
  for (int64_t p = 0; p < npanels; ++p) {
    const int64_t prow = std::min<int64_t>(16, rows - 16 * p);
    const uint16_t* src = w + (j0 + 16 * p) * k;
    uint32_t* dst = out + p * kc * 16;
    for (int64_t c = 0; c < kc; c += 16) {
      const int64_t kk = 2 * (q0 + c);
      __m512i r[16];
      if (prow == 16 && kk + 32 <= k) {  // the common case: no masks, no branches
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * k + kk);
      } else {
        const __mmask32 lm = mask32(k - kk);
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i)
          r[i] = i < prow ? _mm512_maskz_loadu_epi16(lm, src + i * k + kk) : _mm512_setzero_si512();
      }
      transpose16(r);
      if (c + 16 <= kc) {
#pragma GCC unroll 16
        for (int s = 0; s < 16; ++s) _mm512_storeu_si512(dst + (c + s) * 16, r[s]);
      } else {
        // Copy out with constant indices so r itself stays in registers.
        alignas(64) __m512i t[16];
#pragma GCC unroll 16
        for (int s = 0; s < 16; ++s) t[s] = r[s];
        for (int64_t s = 0; s < kc - c; ++s) _mm512_storeu_si512(dst + (c + s) * 16, t[s]);
      }
    }
  }
}

// x strip as FP32: xb[r * ld + e] = x[r, 2 q0 + e] for e < 2 kc; zeros past k or rows.
inline void pack_x_f32(const uint16_t* x, int64_t ldx, int rows, int mr, int64_t k, int64_t q0,
                       int64_t kc, int64_t ld, float* xb) {
  const int64_t kk = 2 * q0, cnt = std::min(2 * kc, k - kk);
  for (int r = 0; r < mr; ++r) {
    float* d = xb + r * ld;
    const uint16_t* s = x + r * ldx + kk;
    for (int64_t e = 0; e < 2 * kc; e += 16) {
      const __m512 v = r < rows ? maskz_load_bf16(mask16(cnt - e), s + e) : _mm512_setzero_ps();
      _mm512_storeu_ps(d + e, v);  // ld >= 2*kc rounded up to 16, so whole stores fit
    }
  }
}

// x strip as BF16 pairs: xb[r * ld + c] = (x[r, 2(q0+c)], x[r, 2(q0+c)+1]); zeros past k or rows.
inline void pack_x_pairs(const uint16_t* x, int64_t ldx, int rows, int mr, int64_t k, int64_t q0,
                         int64_t kc, int64_t ld, uint32_t* xb) {
  const int64_t kk = 2 * q0, cnt = std::min(2 * kc, k - kk);
  for (int r = 0; r < mr; ++r) {
    uint32_t* d = xb + r * ld;
    const uint16_t* s = x + r * ldx + kk;
    for (int64_t e = 0; e < 2 * kc; e += 32) {
      const __m512i v =
          r < rows ? _mm512_maskz_loadu_epi16(mask32(cnt - e), s + e) : _mm512_setzero_si512();
      _mm512_storeu_si512(d + e / 2, v);
    }
  }
}

// Lanes of a 16-column panel starting at column lo that fall in [jlo, jhi).
inline __mmask16 col_mask(int64_t lo, int64_t jlo, int64_t jhi) {
  const int64_t a = std::clamp<int64_t>(jlo - lo, 0, 16), b = std::clamp<int64_t>(jhi - lo, 0, 16);
  return __mmask16(_bzhi_u32(0xffffu, unsigned(b)) & ~_bzhi_u32(0xffffu, unsigned(a)));
}

}  // namespace
}  // namespace kvant::kernels::avx512
