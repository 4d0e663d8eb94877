// FP8-weight GEMM with VDPBF16PS (gemm_f8 of the Avx512Bf16 table on CPUs
// with AVX512_VBMI): the codes become BF16 through two 128-entry byte tables
// and the products are summed in BF16 pairs, half the instructions per
// weight of the FP32-FMA kernel (f8_tiling.h). Included by
// gemm_f8_avx512bf16.cpp (the instruction) and, with kEmulate, by
// avx512/gemm_f8_dpbf16_emulated.cpp (two FMAs in the instruction's order),
// so the tiling is tested on machines without AVX512_BF16. Needs
// AVX-512 F/BW/VL/DQ and VBMI flags in the including file.
//
// Decoding one F8 Q16 quad of a panel (64 codes, row r's four codes in word
// r): VPERMI2B looks up the low and the high byte of each code's BF16
// magnitude (e4m3 values are all exact in BF16, subnormals normalized; 0x7f
// is NaN), a VPTERNLOGD ORs the code's sign into the high byte, and
// VPUNPCKLBW / VPUNPCKHBW interleave them into two vectors of BF16 pairs: lane
// (l, i) of the first holds row 4l + i/2's columns (4q, 4q+1) for even i and
// (4q+2, 4q+3) for odd i; the second the same for rows 4l + 2 + i/2. x's four
// BF16 of the quad are one broadcast 64-bit pattern. A row's sum is thus the
// sum of its two lanes, taken at each group's end:
//   for each group g: a = b = 0 (per lane); for each quad q of g (in order):
//     lane += VDPBF16PS(pair) (odd column, then even, as the instruction)
//   y = fma(a_lane0 + a_lane1 (or b's), s[j, g], y)
// x is read through a per-thread copy with each group padded to whole quads
// with zeros (the zero codes there must not meet x's next group or an Inf).
// Tiles: 10, 8 or 4 rows of x against 1 or 2 panels (prefill); one row
// against 6 panels with their codes prefetched 2 KB ahead (decode); panels
// in blocks of 12, so a decode sweep never ends on a short remainder.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/avx512_common.h"
#include "kernels/cpu/f8_tiling.h"
#include "kernels/cpu/kernels.h"
#include "numerics/fp8.h"

namespace kvant::kernels::avx512bf16_f8 {
namespace {

struct Tag {};  // names f8_tiling.h's helpers for this kernel (isa_guard)

struct F8DpTables {
  __m512i lo0, lo1, hi0, hi1;
};

// BF16 of e4m3 magnitudes 0..127, low and high bytes.
inline F8DpTables f8dp_tables() {
  alignas(64) uint8_t lo[128], hi[128];
  for (int c = 0; c < 128; ++c) {
    const float v = fp8_e4m3_to_f32(uint8_t(c));
    uint32_t b;
    std::memcpy(&b, &v, 4);
    const uint16_t h = c == 0x7f ? uint16_t(0x7fc0) : uint16_t(b >> 16);  // exact: 3-bit mantissas
    lo[c] = uint8_t(h);
    hi[c] = uint8_t(h >> 8);
  }
  return {_mm512_load_si512(lo), _mm512_load_si512(lo + 64), _mm512_load_si512(hi),
          _mm512_load_si512(hi + 64)};
}

inline const F8DpTables& f8dp_table() {
  static const F8DpTables t = f8dp_tables();
  return t;
}

template <bool kEmulate>
inline __m512 f8dp_dot(__m512 acc, __m512i w, __m512i x) {
  if constexpr (kEmulate) {
    const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
    const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(w, hi));
    const __m512 xo = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
    // (maskz: GCC 12 warns on the plain form's undefined pass-through here)
    const __m512 we = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, w, 16));
    const __m512 xe = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, x, 16));
    return _mm512_fmadd_ps(we, xe, _mm512_fmadd_ps(wo, xo, acc));
  } else {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
  }
}

struct F8DpQuad {
  __m512i a, b;  // BF16 pairs of rows 4l + {0, 1} and 4l + {2, 3}
};

inline F8DpQuad f8dp_decode(const uint8_t* p, const F8DpTables& t) {
  const __m512i d = _mm512_loadu_si512(p);
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, d, t.lo1);
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, d, t.hi1);
  hi = _mm512_ternarylogic_epi32(hi, d, _mm512_set1_epi8(char(0x80)), 0xf8);  // hi | (d & 0x80)
  return {_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)};
}

// Row sums of a unit in row order: lanes (l, 0) + (l, 1) and (l, 2) + (l, 3)
// of a give rows 4l and 4l + 1, of b rows 4l + 2 and 4l + 3.
inline __m512 f8dp_rows(__m512 a, __m512 b) {
  const __m512 ta = _mm512_add_ps(a, _mm512_shuffle_ps(a, a, 0xb1));
  const __m512 tb = _mm512_add_ps(b, _mm512_shuffle_ps(b, b, 0xb1));
  const __m512i idx = _mm512_setr_epi32(0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30);
  return _mm512_permutex2var_ps(ta, idx, tb);
}

template <bool kEmulate, int MR, int NU>
void f8dp_tile(int rows, const uint16_t* xs, int64_t ldxs, const F8Weights& W, int64_t p0,
               float* y, int64_t ldy, int64_t jlo, int64_t jhi, const F8DpTables& t) {
  const int64_t ng = f8_groups(W.k, W.group), gq = f8_group_quads(W.k, W.group);
  const int64_t kq = f8_quads(W.k, W.group);
  const F8Units<Tag, NU> units(W, p0, 16);
  const uint8_t* const* wu = units.w;
  const float* const* su = units.s;
  const int64_t* ju = units.j;
  const uint16_t* xr[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) xr[r] = xs + std::min(r, rows - 1) * ldxs;
  // One row: its outputs stay in registers across the groups.
  [[maybe_unused]] __m512 out[NU];
  if constexpr (MR == 1)
#pragma GCC unroll 8
    for (int u = 0; u < NU; ++u) out[u] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m512 a[MR][NU], b[MR][NU];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NU; ++u) a[r][u] = b[r][u] = _mm512_setzero_ps();
    for (int64_t q = g * gq; q < std::min(kq, (g + 1) * gq); ++q) {
      if constexpr (MR == 1) {
        // One row: each unit decoded just before its two products.
        int64_t bits;
        std::memcpy(&bits, xr[0] + 4 * q, 8);
        const __m512i xv = _mm512_set1_epi64(bits);
#pragma GCC unroll 8
        for (int u = 0; u < NU; ++u) {
          _mm_prefetch(reinterpret_cast<const char*>(wu[u] + q * 64 + kF8PrefetchBytes), _MM_HINT_T1);
          const F8DpQuad w = f8dp_decode(wu[u] + q * 64, t);
          a[0][u] = f8dp_dot<kEmulate>(a[0][u], w.a, xv);
          b[0][u] = f8dp_dot<kEmulate>(b[0][u], w.b, xv);
        }
        continue;
      }
      F8DpQuad w[NU];
#pragma GCC unroll 8
      for (int u = 0; u < NU; ++u) w[u] = f8dp_decode(wu[u] + q * 64, t);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        int64_t bits;
        std::memcpy(&bits, xr[r] + 4 * q, 8);
        const __m512i xv = _mm512_set1_epi64(bits);
#pragma GCC unroll 8
        for (int u = 0; u < NU; ++u) {
          a[r][u] = f8dp_dot<kEmulate>(a[r][u], w[u].a, xv);
          b[r][u] = f8dp_dot<kEmulate>(b[r][u], w[u].b, xv);
        }
      }
    }
    if constexpr (MR == 1) {
#pragma GCC unroll 8
      for (int u = 0; u < NU; ++u)
        out[u] = _mm512_fmadd_ps(f8dp_rows(a[0][u], b[0][u]), _mm512_loadu_ps(su[u] + g * 16), out[u]);
    } else {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        if (r < rows)
#pragma GCC unroll 8
          for (int u = 0; u < NU; ++u) {
            float* yr = y + r * ldy + ju[u];
            const __mmask16 mk = avx512::col_mask(ju[u], jlo, jhi);
            const __m512 prev = g == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, yr);
            _mm512_mask_storeu_ps(yr, mk,
                                  _mm512_fmadd_ps(f8dp_rows(a[r][u], b[r][u]),
                                                  _mm512_loadu_ps(su[u] + g * 16), prev));
          }
    }
  }
  if constexpr (MR == 1)
#pragma GCC unroll 8
    for (int u = 0; u < NU; ++u)
      _mm512_mask_storeu_ps(y + ju[u], avx512::col_mask(ju[u], jlo, jhi), out[u]);
}

template <bool kEmulate>
void gemm_f8_dpbf16(const uint16_t* x, int64_t ldx, const F8Weights& W, float* y, int64_t ldy,
                    int64_t m, int64_t n0, int64_t n1) {
  if (m <= 0 || n1 <= n0 || W.k <= 0) return;
  const F8DpTables& t = f8dp_table();
  thread_local F8Scratch<Tag, uint16_t> buf;
  const uint16_t* xs = f8_pad_rows(buf, x, ldx, W, m, [](int64_t, uint16_t b) { return b; });
  const int64_t ld = f8_padded_cols(W);
  constexpr int64_t kBlockPanels = 12;  // whole sweeps of 6, 2 or 1 panels
  const int64_t pb = n0 / 16, pe = (n1 + 15) / 16;
  for (int64_t b0 = pb; b0 < pe; b0 += kBlockPanels) {
    const int64_t b1 = std::min(pe, b0 + kBlockPanels);
    for (int64_t i0 = 0; i0 < m;) {
      const int rows = int(std::min<int64_t>(m - i0, 10));
      auto sweep = [&]<int MR, int NUMAX>() {
        for (int64_t p = b0; p < b1; p += NUMAX)
          with_panels<NUMAX>(int(std::min<int64_t>(NUMAX, b1 - p)), [&]<int NU>() {
            f8dp_tile<kEmulate, MR, NU>(std::min(rows, MR), xs + i0 * ld, ld, W, p, y + i0 * ldy,
                                        ldy, n0, n1, t);
          });
      };
      if (rows >= 9) {
        sweep.template operator()<10, 1>();
        i0 += rows;
      } else if (rows >= 5) {
        sweep.template operator()<8, 1>();
        i0 += std::min(rows, 8);
      } else if (rows >= 2) {
        sweep.template operator()<4, 2>();
        i0 += std::min(rows, 4);
      } else {
        sweep.template operator()<1, 6>();
        i0 += 1;
      }
    }
  }
}

}  // namespace
}  // namespace kvant::kernels::avx512bf16_f8
