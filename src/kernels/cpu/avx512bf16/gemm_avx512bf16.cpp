// BF16 GEMM with VDPBF16PS (AVX512_BF16: Zen 4, Sapphire Rapids). Same
// blocking and P16-pair panels as avx512/gemm_avx512.cpp, but the pair vector
// is the instruction's native operand: one VDPBF16PS per (x row, panel, k
// pair) against a broadcast (x[2q], x[2q+1]) dword, no widening. Each output
// lane gets the instruction's two products per pair in its fixed order, in
// sequence over q, whatever the tile shape: batch invariant, though not
// bitwise equal to the FMA tables (the instruction flushes denormals and
// rounds per its own definition).
//
// avx512/gemm_dpbf16_emulated.cpp compiles this file a second time with
// KVANT_EMULATE_DPBF16: the instruction becomes two FMAs in the order Intel's
// pseudo-code gives (odd k, then even k) and the namespace becomes
// avx512bf16_emulated, so the blocking, packing and tails of this kernel are
// tested on any AVX-512 machine, not only on ones with AVX512_BF16.

#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/avx512bf16/avx512bf16.h"
#include "kernels/cpu/gemm_tiling.h"

#ifndef KVANT_EMULATE_DPBF16
#define KVANT_DPBF16_NS avx512bf16
#else
#define KVANT_DPBF16_NS avx512bf16_emulated
#endif

namespace kvant::kernels::KVANT_DPBF16_NS {
namespace {

using avx512::col_mask;

#ifndef KVANT_EMULATE_DPBF16
using Pairs = __m512bh;  // 16 lanes of (even-k, odd-k) BF16 pairs
inline Pairs as_pairs(__m512i v) { return (__m512bh)v; }
inline __m512 dot_pairs(__m512 acc, Pairs a, Pairs b) { return _mm512_dpbf16_ps(acc, a, b); }
#else
using Pairs = __m512i;
inline Pairs as_pairs(__m512i v) { return v; }
inline __m512 dot_pairs(__m512 acc, Pairs a, Pairs b) {
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  const __m512 ao = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
  const __m512 bo = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
  const __m512 ae = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
  const __m512 be = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  return _mm512_fmadd_ps(ae, be, _mm512_fmadd_ps(ao, bo, acc));
}
#endif

struct DpTraits {
  static constexpr int64_t kNB = 128;
  static constexpr int64_t kNBPacked = 256;
  static constexpr int64_t kKCP = 128;
  static constexpr int kMR = 12;
  using XElem = uint32_t;
  static constexpr int64_t kXPerPair = 1;
  static constexpr int64_t kLdx = kKCP;

  template <int MR, int NP>
  static void tile(int rows, const uint32_t* xb, const uint32_t* panels, int64_t pstride,
                   int64_t kc, float* y, int64_t ldy, int64_t jbase, int64_t jlo, int64_t jhi,
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
    for (int64_t q = 0; q < kc; ++q) {
      Pairs wv[NP];
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p)
        wv[p] = as_pairs(_mm512_loadu_si512(panels + p * pstride + q * 16));
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        const Pairs xv = as_pairs(_mm512_set1_epi32(int(xb[r * kLdx + q])));
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p) acc[r][p] = dot_pairs(acc[r][p], xv, wv[p]);
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
  static void sweep(int rows, const uint32_t* xb, const uint32_t* panels, int64_t pstride,
                    int64_t npanels, int64_t kc, float* y, int64_t ldy, int64_t jbase, int64_t jlo,
                    int64_t jhi, bool accumulate) {
    for (int64_t p = 0; p < npanels; p += NPMAX) {
      with_panels<NPMAX>(int(std::min<int64_t>(NPMAX, npanels - p)), [&]<int NP>() {
        tile<MR, NP>(rows, xb, panels + p * pstride, pstride, kc, y, ldy, jbase + 16 * p, jlo, jhi,
                     accumulate);
      });
    }
  }

  static void strip(int rows, const uint32_t* xb, const uint32_t* panels, int64_t pstride,
                    int64_t npanels, int64_t kc, float* y, int64_t ldy, int64_t jbase, int64_t jlo,
                    int64_t jhi, bool accumulate) {
    if (rows >= 9) {
      sweep<12, 2>(rows, xb, panels, pstride, npanels, kc, y, ldy, jbase, jlo, jhi, accumulate);
      return;
    }
    for (int r0 = 0; r0 < rows;) {
      const int left = rows - r0;
      const uint32_t* xr = xb + r0 * kLdx;
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
                     uint32_t* xb) {
    avx512::pack_x_pairs(x, ldx, rows, kMR, k, q0, kc, kLdx, xb);
  }
};

}  // namespace

void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y, int64_t ldy,
               int64_t m, int64_t n0, int64_t n1) {
  gemm_blocked<DpTraits>(x, ldx, w, nullptr, k, y, ldy, m, n0, n1);
}

void gemm_bf16_packed(const uint16_t* x, int64_t ldx, const uint16_t* wp, int64_t k, float* y,
                      int64_t ldy, int64_t m, int64_t n0, int64_t n1) {
  gemm_blocked<DpTraits>(x, ldx, nullptr, wp, k, y, ldy, m, n0, n1);
}

#ifndef KVANT_EMULATE_DPBF16
float peak_probe(int64_t iters) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1.0, 1.0)
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3a833a83);  // (0.001, 0.001)
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  return avx512::hsum(s);
}

#endif

}  // namespace kvant::kernels::KVANT_DPBF16_NS
