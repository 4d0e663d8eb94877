// BF16 GEMM for AVX2+FMA. Same P16-pair panels and blocking as the AVX-512
// kernels (gemm_tiling.h); a 16-column panel is two 8-lane halves. Each pair
// vector is split into even-k and odd-k FP32 halves by shift/mask and
// accumulated with FMA against FP32 broadcasts of x: lane = output column, the
// sum over k is sequential (2q then 2q+1) in every tile shape, hence batch
// invariant and equal to the scalar reference on normal inputs.

#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx2/avx2_common.h"
#include "kernels/cpu/gemm_tiling.h"

namespace kvant::kernels::avx2 {
namespace {

// In place: r[i] lane c -> r[c] lane i (8x8 dwords).
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  // u[4g + s]: column s (low 128 bits) and s + 4 (high) of rows 4g .. 4g+3.
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
  }
#pragma GCC unroll 8
  for (int s = 0; s < 4; ++s) {
    r[s] = _mm256_permute2f128_ps(u[s], u[4 + s], 0x20);
    r[s + 4] = _mm256_permute2f128_ps(u[s], u[4 + s], 0x31);
  }
}

// 8 pairs (16 BF16) of one row as dwords; only the first n values are read.
inline __m256 load_pairs(const uint16_t* p, int64_t n) {
  if (n >= 16) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  alignas(32) uint16_t t[16] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i];
  return _mm256_load_ps(reinterpret_cast<const float*>(t));
}

// Rows [j0, j0+rows) of W, pairs [q0, q0+kc) -> P16-pair panels (stride kc*16 dwords).
void pack_w(const uint16_t* w, int64_t k, int64_t j0, int64_t rows, int64_t q0, int64_t kc,
            uint32_t* out) {
  const int64_t npanels = (rows + 15) / 16;
  for (int64_t p = 0; p < npanels; ++p) {
    const int64_t prow = std::min<int64_t>(16, rows - 16 * p);
    const uint16_t* src = w + (j0 + 16 * p) * k;
    float* dst = reinterpret_cast<float*>(out + p * kc * 16);
    for (int64_t c = 0; c < kc; c += 8) {
      const int64_t kk = 2 * (q0 + c);
      const bool fast = prow == 16 && kk + 16 <= k;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256 r[8];
        if (fast) {
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i)
            r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + (8 * h + i) * k + kk));
        } else {
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i)
            r[i] = 8 * h + i < prow ? load_pairs(src + (8 * h + i) * k + kk, k - kk)
                                    : _mm256_setzero_ps();
        }
        transpose8(r);
        if (c + 8 <= kc) {
#pragma GCC unroll 8
          for (int s = 0; s < 8; ++s) _mm256_storeu_ps(dst + (c + s) * 16 + 8 * h, r[s]);
        } else {
          // Copy out with constant indices so r itself stays in registers.
          alignas(32) __m256 t[8];
#pragma GCC unroll 8
          for (int s = 0; s < 8; ++s) t[s] = r[s];
          for (int64_t s = 0; s < kc - c; ++s) _mm256_storeu_ps(dst + (c + s) * 16 + 8 * h, t[s]);
        }
      }
    }
  }
}

// The 6x1 tile's k loop in assembly: the intrinsic 4x1 tile leaves the FMA
// chains latency-bound (about 50% of peak); six rows need all 16 registers,
// which GCC 12 does not manage without spills. Same arithmetic as the generic
// loop: per pair, the even-k FMAs of every accumulator, then the odd-k ones.
// Registers: ymm0..11 accumulators (acc[6][2] row-major), ymm12..13 widened
// weights, ymm14 the x broadcast, ymm15 the odd-half mask. x rows are
// kLdx = 256 floats (1024 bytes) apart; one panel (64 bytes per pair); kc > 0.
inline void fma_6x1(__m256* acc, const uint32_t* w, const float* x, int64_t kc) {
  asm volatile(
      "vmovups 0(%[a]), %%ymm0\n\t"
      "vmovups 32(%[a]), %%ymm1\n\t"
      "vmovups 64(%[a]), %%ymm2\n\t"
      "vmovups 96(%[a]), %%ymm3\n\t"
      "vmovups 128(%[a]), %%ymm4\n\t"
      "vmovups 160(%[a]), %%ymm5\n\t"
      "vmovups 192(%[a]), %%ymm6\n\t"
      "vmovups 224(%[a]), %%ymm7\n\t"
      "vmovups 256(%[a]), %%ymm8\n\t"
      "vmovups 288(%[a]), %%ymm9\n\t"
      "vmovups 320(%[a]), %%ymm10\n\t"
      "vmovups 352(%[a]), %%ymm11\n\t"
      "vpcmpeqd %%ymm15, %%ymm15, %%ymm15\n\t"
      "vpslld $16, %%ymm15, %%ymm15\n\t"  // 0xffff0000 keeps the odd-k half
      "1:\n\t"
      // VPSLLD with a memory source exists only as an EVEX (AVX-512VL)
      // encoding, so the weights are loaded first and shifted in registers.
      "vmovdqu 0(%[w]), %%ymm12\n\t"
      "vmovdqu 32(%[w]), %%ymm13\n\t"
      "vpslld $16, %%ymm12, %%ymm12\n\t"
      "vpslld $16, %%ymm13, %%ymm13\n\t"
      "vbroadcastss 0(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"
      "vbroadcastss 1024(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm2\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm3\n\t"
      "vbroadcastss 2048(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"
      "vbroadcastss 3072(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm6\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm7\n\t"
      "vbroadcastss 4096(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"
      "vbroadcastss 5120(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm10\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm11\n\t"
      "vpand 0(%[w]), %%ymm15, %%ymm12\n\t"
      "vpand 32(%[w]), %%ymm15, %%ymm13\n\t"
      "vbroadcastss 4(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"
      "vbroadcastss 1028(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm2\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm3\n\t"
      "vbroadcastss 2052(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"
      "vbroadcastss 3076(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm6\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm7\n\t"
      "vbroadcastss 4100(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"
      "vbroadcastss 5124(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm10\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm11\n\t"
      "add $64, %[w]\n\t"
      "add $8, %[x]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vmovups %%ymm0, 0(%[a])\n\t"
      "vmovups %%ymm1, 32(%[a])\n\t"
      "vmovups %%ymm2, 64(%[a])\n\t"
      "vmovups %%ymm3, 96(%[a])\n\t"
      "vmovups %%ymm4, 128(%[a])\n\t"
      "vmovups %%ymm5, 160(%[a])\n\t"
      "vmovups %%ymm6, 192(%[a])\n\t"
      "vmovups %%ymm7, 224(%[a])\n\t"
      "vmovups %%ymm8, 256(%[a])\n\t"
      "vmovups %%ymm9, 288(%[a])\n\t"
      "vmovups %%ymm10, 320(%[a])\n\t"
      "vmovups %%ymm11, 352(%[a])\n\t"
      : [w] "+r"(w), [x] "+r"(x), [n] "+r"(kc)
      : [a] "r"(acc)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
}

struct FmaTraits {
  static constexpr int64_t kNB = 64;  // W rows per block (4 panels)
  static constexpr int64_t kNBPacked = 256;
  static constexpr int64_t kKCP = 128;  // k pairs per block: 4 panels x 128 x 64 B = 32 KB
  static constexpr int kMR = 6;
  using XElem = float;
  static constexpr int64_t kXPerPair = 2;
  static constexpr int64_t kLdx = kKCP * kXPerPair;

  // MR x NP tile; 2*NP halves of 8 columns. 6x1 runs fma_6x1; the 4x1 and
  // 1x2 intrinsic tiles keep accumulators + widened weights in 14 of 16 registers.
  template <int MR, int NP>
  static void tile(int rows, const float* xb, const uint32_t* panels, int64_t pstride, int64_t kc,
                   float* y, int64_t ldy, int64_t jbase, int64_t jlo, int64_t jhi,
                   bool accumulate) {
    constexpr int H = 2 * NP;
    int64_t first[H], count[H];  // valid lanes [first, count) of each half
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const int64_t lo = jbase + 8 * h;
      first[h] = std::clamp<int64_t>(jlo - lo, 0, 8);
      count[h] = std::clamp<int64_t>(jhi - lo, 0, 8);
    }
    __m256 acc[MR][H];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h)
        acc[r][h] = accumulate && r < rows
                        ? load_range(y + r * ldy + jbase + 8 * h, first[h], count[h])
                        : _mm256_setzero_ps();
    const __m256i hi = _mm256_set1_epi32(int(0xffff0000u));
    if constexpr (MR == 6 && NP == 1) {
      static_assert(kLdx == 256, "fma_6x1 hard-codes the x row stride");
      if (kc > 0) fma_6x1(&acc[0][0], panels, xb, kc);
    } else {
      for (int64_t q = 0; q < kc; ++q) {
        __m256 we[H], wo[H];
#pragma GCC unroll 8
        for (int h = 0; h < H; ++h) {
          const __m256i v = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(panels + (h / 2) * pstride + q * 16 + 8 * (h % 2)));
          we[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
          wo[h] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const __m256 xe = _mm256_broadcast_ss(xb + r * kLdx + 2 * q);
#pragma GCC unroll 8
          for (int h = 0; h < H; ++h) acc[r][h] = _mm256_fmadd_ps(xe, we[h], acc[r][h]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const __m256 xo = _mm256_broadcast_ss(xb + r * kLdx + 2 * q + 1);
#pragma GCC unroll 8
          for (int h = 0; h < H; ++h) acc[r][h] = _mm256_fmadd_ps(xo, wo[h], acc[r][h]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      if (r >= rows) continue;
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        store_range(y + r * ldy + jbase + 8 * h, acc[r][h], first[h], count[h]);
      }
    }
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
    // Four rows or fewer: the 4x16 tile, rather than the 6x16 one computing
    // two or more rows of zeros (a decode step of a few requests, or one
    // with draft tokens).
    if (rows >= 5)
      sweep<6, 1>(rows, xb, panels, pstride, npanels, kc, y, ldy, jbase, jlo, jhi, accumulate);
    else if (rows >= 2)
      sweep<4, 1>(rows, xb, panels, pstride, npanels, kc, y, ldy, jbase, jlo, jhi, accumulate);
    else
      sweep<1, 2>(rows, xb, panels, pstride, npanels, kc, y, ldy, jbase, jlo, jhi, accumulate);
  }

  static void pack_w(const uint16_t* w, int64_t k, int64_t j0, int64_t rows, int64_t q0, int64_t kc,
                     uint32_t* out) {
    avx2::pack_w(w, k, j0, rows, q0, kc, out);
  }

  // x strip as FP32: xb[r * kLdx + e] = x[r, 2 q0 + e]; zeros past k or rows.
  static void pack_x(const uint16_t* x, int64_t ldx, int rows, int64_t k, int64_t q0, int64_t kc,
                     float* xb) {
    const int64_t kk = 2 * q0, cnt = std::min(2 * kc, k - kk);
    for (int r = 0; r < kMR; ++r) {
      float* d = xb + r * kLdx;
      const uint16_t* s = x + r * ldx + kk;
      for (int64_t e = 0; e < 2 * kc; e += 8)
        _mm256_storeu_ps(d + e, r < rows ? load_bf16_part(s + e, cnt - e) : _mm256_setzero_ps());
    }
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
  pack_w(w, k, 0, n, 0, (k + 1) / 2, reinterpret_cast<uint32_t*>(wp));
}

float peak_probe(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  return hsum(s);
}

}  // namespace kvant::kernels::avx2
