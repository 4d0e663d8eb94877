// BF16 GEMM for AVX-512 without BF16 dot products (Skylake-SP, Ice Lake; also
// runs on Zen 4). W arrives as P16-pair panels (packed, or repacked per block
// by gemm_tiling.h); each 64-byte pair vector is split into its even-k and
// odd-k halves, widened to FP32 by shift/mask, and accumulated with FMA
// against FP32 broadcasts of x. Lane = output column, so there is no
// horizontal reduction: y[i, j] is the sequential sum over k, adding k = 2q
// then 2q+1, in every tile shape (products of two BF16 are exact in FP32, so
// this equals the scalar reference bit for bit on normal inputs).

#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/gemm_tiling.h"

namespace kvant::kernels::avx512 {
namespace {

struct FmaTraits {
  static constexpr int64_t kNB = 128;   // W rows per block (8 panels)
  static constexpr int64_t kKCP = 128;  // k pairs per block: 8 panels x 128 x 64 B = 64 KB
  static constexpr int kMR = 12;        // x rows per strip
  using XElem = float;
  static constexpr int64_t kXPerPair = 2;
  static constexpr int64_t kLdx = kKCP * kXPerPair;

  // MR x NP tile: MR rows of x against NP panels (16 columns each); MR*NP
  // accumulators + 2*NP widened weights stay in registers (<= 30 of 32).
  template <int MR, int NP>
  static void tile(int rows, const float* xb, const uint32_t* panels, int64_t pstride, int64_t kc,
                   float* y, int64_t ldy, int64_t jbase, int64_t jlo, int64_t jhi,
                   bool accumulate) {
    __mmask16 mk[NP];
    __m512 acc[MR][NP];
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) mk[p] = col_mask(jbase + 16 * p, jlo, jhi);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p)
        acc[r][p] = accumulate && r < rows
                        ? _mm512_maskz_loadu_ps(mk[p], y + r * ldy + jbase + 16 * p)
                        : _mm512_setzero_ps();
    const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
    for (int64_t q = 0; q < kc; ++q) {
      __m512 we[NP], wo[NP];
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p) {
        const __m512i v = _mm512_loadu_si512(panels + p * pstride + q * 16);
        we[p] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        wo[p] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      }
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        const __m512 xe = _mm512_set1_ps(xb[r * kLdx + 2 * q]);
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(xe, we[p], acc[r][p]);
      }
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        const __m512 xo = _mm512_set1_ps(xb[r * kLdx + 2 * q + 1]);
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(xo, wo[p], acc[r][p]);
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r)
      if (r < rows)
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p)
          _mm512_mask_storeu_ps(y + r * ldy + jbase + 16 * p, mk[p], acc[r][p]);
  }

  template <int MR, int NPMAX>
  static void sweep(int rows, const float* xb, const uint32_t* panels, int64_t pstride,
                    int64_t npanels, int64_t kc, float* y, int64_t ldy, int64_t jbase, int64_t jlo,
                    int64_t jhi, bool accumulate) {
    for (int64_t p = 0; p < npanels; p += NPMAX) {
      with_panels<NPMAX>(int(std::min<int64_t>(NPMAX, npanels - p)), [&]<int NP>() {
        tile<MR, NP>(rows, xb, panels + p * pstride, pstride, kc, y, ldy, jbase + 16 * p, jlo, jhi,
                     accumulate);
      });
    }
  }

  static void strip(int rows, const float* xb, const uint32_t* panels, int64_t pstride,
                    int64_t npanels, int64_t kc, float* y, int64_t ldy, int64_t jbase, int64_t jlo,
                    int64_t jhi, bool accumulate) {
    if (rows >= 9) {
      sweep<12, 2>(rows, xb, panels, pstride, npanels, kc, y, ldy, jbase, jlo, jhi, accumulate);
      return;
    }
    for (int r0 = 0; r0 < rows;) {
      const int left = rows - r0;
      const float* xr = xb + r0 * kLdx;
      float* yr = y + r0 * ldy;
      if (left >= 2) {
        sweep<4, 4>(std::min(left, 4), xr, panels, pstride, npanels, kc, yr, ldy, jbase, jlo, jhi,
                    accumulate);
        r0 += 4;
      } else {
        sweep<1, 8>(1, xr, panels, pstride, npanels, kc, yr, ldy, jbase, jlo, jhi, accumulate);
        r0 += 1;
      }
    }
  }

  static void pack_w(const uint16_t* w, int64_t k, int64_t j0, int64_t rows, int64_t q0, int64_t kc,
                     uint32_t* out) {
    avx512::pack_w(w, k, j0, rows, q0, kc, out);
  }
  static void pack_x(const uint16_t* x, int64_t ldx, int rows, int64_t k, int64_t q0, int64_t kc,
                     float* xb) {
    pack_x_f32(x, ldx, rows, kMR, k, q0, kc, kLdx, xb);
  }
};

}  // namespace

void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y, int64_t ldy,
               int64_t m, int64_t n0, int64_t n1) {
  gemm_blocked<FmaTraits>(x, ldx, w, nullptr, k, y, ldy, m, n0, n1);
}

void gemm_bf16_packed(const uint16_t* x, int64_t ldx, const uint16_t* wp, int64_t k, float* y,
                      int64_t ldy, int64_t m, int64_t n0, int64_t n1) {
  gemm_blocked<FmaTraits>(x, ldx, nullptr, wp, k, y, ldy, m, n0, n1);
}

void pack_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* wp) {
  // One block spanning all of k gives exactly the documented layout.
  avx512::pack_w(w, k, 0, n, 0, (k + 1) / 2, reinterpret_cast<uint32_t*>(wp));
}

float peak_probe(int64_t iters) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  return hsum(s);
}

}  // namespace kvant::kernels::avx512
