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

// The 8x3 tile's k loop in assembly: GCC 12 spills accumulators of the
// intrinsic version (40-55% of the FMA peak; this loop measures about 85%).
// Same arithmetic as the generic loop: per pair, the even-k FMAs of every
// accumulator, then the odd-k ones. Registers: zmm0..23 accumulators
// (acc[8][3] row-major), zmm24..26 widened weights, zmm28 the odd-half mask,
// zmm31 the x broadcast. x rows are kLdx = 256 floats (1024 bytes) apart;
// ps is the panel stride in bytes; kc > 0. A separate VBROADCASTSS beats an
// embedded {1to16} operand here (that form measured 2x slower on Ice Lake).
inline void fma_8x3(__m512* acc, const uint32_t* w, int64_t ps, const float* x, int64_t kc) {
  asm volatile(
      "vmovups 0(%[a]), %%zmm0\n\t"
      "vmovups 64(%[a]), %%zmm1\n\t"
      "vmovups 128(%[a]), %%zmm2\n\t"
      "vmovups 192(%[a]), %%zmm3\n\t"
      "vmovups 256(%[a]), %%zmm4\n\t"
      "vmovups 320(%[a]), %%zmm5\n\t"
      "vmovups 384(%[a]), %%zmm6\n\t"
      "vmovups 448(%[a]), %%zmm7\n\t"
      "vmovups 512(%[a]), %%zmm8\n\t"
      "vmovups 576(%[a]), %%zmm9\n\t"
      "vmovups 640(%[a]), %%zmm10\n\t"
      "vmovups 704(%[a]), %%zmm11\n\t"
      "vmovups 768(%[a]), %%zmm12\n\t"
      "vmovups 832(%[a]), %%zmm13\n\t"
      "vmovups 896(%[a]), %%zmm14\n\t"
      "vmovups 960(%[a]), %%zmm15\n\t"
      "vmovups 1024(%[a]), %%zmm16\n\t"
      "vmovups 1088(%[a]), %%zmm17\n\t"
      "vmovups 1152(%[a]), %%zmm18\n\t"
      "vmovups 1216(%[a]), %%zmm19\n\t"
      "vmovups 1280(%[a]), %%zmm20\n\t"
      "vmovups 1344(%[a]), %%zmm21\n\t"
      "vmovups 1408(%[a]), %%zmm22\n\t"
      "vmovups 1472(%[a]), %%zmm23\n\t"
      "vpternlogd $0xff, %%zmm28, %%zmm28, %%zmm28\n\t"
      "vpslld $16, %%zmm28, %%zmm28\n\t"  // 0xffff0000 keeps the odd-k half
      "1:\n\t"
      "vpslld $16, (%[w]), %%zmm24\n\t"
      "vpslld $16, (%[w],%[ps]), %%zmm25\n\t"
      "vpslld $16, (%[w],%[ps],2), %%zmm26\n\t"
      "vbroadcastss 0(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm0\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm1\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm2\n\t"
      "vbroadcastss 1024(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm3\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm4\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm5\n\t"
      "vbroadcastss 2048(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm6\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm7\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm8\n\t"
      "vbroadcastss 3072(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm9\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm10\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm11\n\t"
      "vbroadcastss 4096(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm12\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm13\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm14\n\t"
      "vbroadcastss 5120(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm15\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm16\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm17\n\t"
      "vbroadcastss 6144(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm18\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm19\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm20\n\t"
      "vbroadcastss 7168(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm21\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm22\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm23\n\t"
      "vpandd (%[w]), %%zmm28, %%zmm24\n\t"
      "vpandd (%[w],%[ps]), %%zmm28, %%zmm25\n\t"
      "vpandd (%[w],%[ps],2), %%zmm28, %%zmm26\n\t"
      "vbroadcastss 4(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm0\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm1\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm2\n\t"
      "vbroadcastss 1028(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm3\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm4\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm5\n\t"
      "vbroadcastss 2052(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm6\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm7\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm8\n\t"
      "vbroadcastss 3076(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm9\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm10\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm11\n\t"
      "vbroadcastss 4100(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm12\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm13\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm14\n\t"
      "vbroadcastss 5124(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm15\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm16\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm17\n\t"
      "vbroadcastss 6148(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm18\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm19\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm20\n\t"
      "vbroadcastss 7172(%[x]), %%zmm31\n\t"
      "vfmadd231ps %%zmm24, %%zmm31, %%zmm21\n\t"
      "vfmadd231ps %%zmm25, %%zmm31, %%zmm22\n\t"
      "vfmadd231ps %%zmm26, %%zmm31, %%zmm23\n\t"
      "add $64, %[w]\n\t"
      "add $8, %[x]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vmovups %%zmm0, 0(%[a])\n\t"
      "vmovups %%zmm1, 64(%[a])\n\t"
      "vmovups %%zmm2, 128(%[a])\n\t"
      "vmovups %%zmm3, 192(%[a])\n\t"
      "vmovups %%zmm4, 256(%[a])\n\t"
      "vmovups %%zmm5, 320(%[a])\n\t"
      "vmovups %%zmm6, 384(%[a])\n\t"
      "vmovups %%zmm7, 448(%[a])\n\t"
      "vmovups %%zmm8, 512(%[a])\n\t"
      "vmovups %%zmm9, 576(%[a])\n\t"
      "vmovups %%zmm10, 640(%[a])\n\t"
      "vmovups %%zmm11, 704(%[a])\n\t"
      "vmovups %%zmm12, 768(%[a])\n\t"
      "vmovups %%zmm13, 832(%[a])\n\t"
      "vmovups %%zmm14, 896(%[a])\n\t"
      "vmovups %%zmm15, 960(%[a])\n\t"
      "vmovups %%zmm16, 1024(%[a])\n\t"
      "vmovups %%zmm17, 1088(%[a])\n\t"
      "vmovups %%zmm18, 1152(%[a])\n\t"
      "vmovups %%zmm19, 1216(%[a])\n\t"
      "vmovups %%zmm20, 1280(%[a])\n\t"
      "vmovups %%zmm21, 1344(%[a])\n\t"
      "vmovups %%zmm22, 1408(%[a])\n\t"
      "vmovups %%zmm23, 1472(%[a])\n\t"
      : [w] "+r"(w), [x] "+r"(x), [n] "+r"(kc)
      : [a] "r"(acc), [ps] "r"(ps)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",
        "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm28", "xmm31", "cc", "memory");
}

struct FmaTraits {
  static constexpr int64_t kNB = 96;         // W rows per block (6 panels, two 8x3 sweeps)
  static constexpr int64_t kNBPacked = 288;  // 18 panels; measured ~10% faster at m=512
  static constexpr int64_t kKCP = 128;       // k pairs per block: 6 panels x 128 x 64 B = 48 KB
  static constexpr int kMR = 8;              // x rows per strip
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
    if constexpr (MR == 8 && NP == 3) {
      static_assert(kLdx == 256, "fma_8x3 hard-codes the x row stride");
      if (kc > 0) fma_8x3(&acc[0][0], panels, pstride * 4, xb, kc);
    } else {
      const uint32_t* wq = panels;
      for (int64_t q = 0; q < kc; ++q, wq += 16) {
        // Even half first, then the odd half re-read from L1: only NP widened
        // vectors are live next to the MR*NP accumulators. The empty asm hides
        // that the second read is the same address, so GCC does not keep the
        // raw vectors alive (which spills the 12x2 tile).
        __m512 wv[NP];
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p)
          wv[p] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(wq + p * pstride), 16));
#pragma GCC unroll 12
        for (int r = 0; r < MR; ++r) {
          const __m512 xe = _mm512_set1_ps(xb[r * kLdx + 2 * q]);
#pragma GCC unroll 8
          for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(xe, wv[p], acc[r][p]);
        }
        const uint32_t* wq2 = wq;
        asm("" : "+r"(wq2));
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p)
          wv[p] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(wq2 + p * pstride), hi));
#pragma GCC unroll 12
        for (int r = 0; r < MR; ++r) {
          const __m512 xo = _mm512_set1_ps(xb[r * kLdx + 2 * q + 1]);
#pragma GCC unroll 8
          for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(xo, wv[p], acc[r][p]);
        }
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
    if (rows >= 5) {
      sweep<8, 3>(rows, xb, panels, pstride, npanels, kc, y, ldy, jbase, jlo, jhi, accumulate);
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
