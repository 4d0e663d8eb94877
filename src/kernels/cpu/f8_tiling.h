// Loop nest shared by the SIMD FP8-weight GEMMs (gemm_f8, kernels.h). Like
// gemm_tiling.h it holds no intrinsics: each ISA folder includes it with a
// traits class and compiles it with its own flags; internal linkage only.
//
// Units of kU output rows (16 rows in two vectors for AVX-512, 4 rows in
// one for AVX2; a P16 panel holds 16 / kU units). For each block of
// kBlockRows output rows, for each strip of x rows, the micro-kernel sweeps
// the block's units NU at a time: per scale group it decodes each unit's
// codes of a column pair once, feeds all MR rows of x, and at the group's
// end folds the sums into y with one FMA per element, y = fma(acc, s, y)
// (y = fma(acc, s, 0) for the first group). A pair's codes are decoded once
// per strip, so prefill pays the decoding once per MR rows.
//
// Traits T supply: kU, kBlockRows (multiple of 16), Acc, WV (a unit's decoded
// pair), XV (a broadcast x pair); zero() -> Acc; xv(uint32_t bits of
// (x[2q], x[2q+1])) -> XV; decode<kNan>(const uint8_t* unit's 2*kU codes) ->
// WV; dot(Acc, XV, WV) -> Acc (lane-wise acc + x * w, exact products);
// finish(Acc, const float* scales of the unit, float* y row, jbase, jlo, jhi,
// bool first); and strip<kNan>(rows, ...) choosing tile shapes (below).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_tiling.h"
#include "kernels/cpu/kernels.h"

namespace kvant::kernels {
namespace {

inline uint32_t x_pair(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

template <class T, int MR, int NU, bool kNan>
void f8_tile(int rows, const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t u0, float* y,
             int64_t ldy, int64_t jlo, int64_t jhi) {
  constexpr int64_t kPer = 16 / T::kU;
  const int64_t kp = W.k / 2, ng = f8_groups(W.k, W.group);
  const int64_t gp = W.group >= W.k ? kp : W.group / 2;
  const uint8_t* wu[NU];
  const float* su[NU];
  int64_t ju[NU];
#pragma GCC unroll 8
  for (int u = 0; u < NU; ++u) {
    const int64_t p = (u0 + u) / kPer, h = (u0 + u) % kPer;
    wu[u] = W.w + p * kp * 32 + h * 2 * T::kU;
    su[u] = W.scales + p * ng * 16 + h * T::kU;
    ju[u] = p * 16 + h * T::kU;
  }
  const uint16_t* xr[MR];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) xr[r] = x + std::min(r, rows - 1) * ldx;
  for (int64_t g = 0; g < ng; ++g) {
    typename T::Acc acc[MR][NU];
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NU; ++u) acc[r][u] = T::zero();
    const int64_t q1 = std::min(kp, (g + 1) * gp);
    for (int64_t q = g * gp; q < q1; ++q) {
      typename T::WV wv[NU];
#pragma GCC unroll 8
      for (int u = 0; u < NU; ++u) wv[u] = T::template decode<kNan>(wu[u] + q * 32);
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        const typename T::XV xv = T::xv(x_pair(xr[r] + 2 * q));
#pragma GCC unroll 8
        for (int u = 0; u < NU; ++u) acc[r][u] = T::dot(acc[r][u], xv, wv[u]);
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r)
      if (r < rows)
#pragma GCC unroll 8
        for (int u = 0; u < NU; ++u)
          T::finish(acc[r][u], su[u] + g * 16, y + r * ldy, ju[u], jlo, jhi, g == 0);
  }
}

// Units [u0, u1) NUMAX at a time, the last sweep narrower.
template <class T, int MR, int NUMAX, bool kNan>
void f8_sweep(int rows, const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t u0, int64_t u1,
              float* y, int64_t ldy, int64_t jlo, int64_t jhi) {
  for (int64_t u = u0; u < u1; u += NUMAX)
    with_panels<NUMAX>(int(std::min<int64_t>(NUMAX, u1 - u)), [&]<int NU>() {
      f8_tile<T, MR, NU, kNan>(rows, x, ldx, W, u, y, ldy, jlo, jhi);
    });
}

template <class T, bool kNan>
void f8_blocked(const uint16_t* x, int64_t ldx, const F8Weights& W, float* y, int64_t ldy,
                int64_t m, int64_t n0, int64_t n1) {
  constexpr int64_t kBlockUnits = T::kBlockRows / T::kU;
  const int64_t ub = n0 / T::kU, ue = (n1 + T::kU - 1) / T::kU;
  for (int64_t u0 = ub; u0 < ue; u0 += kBlockUnits) {
    const int64_t u1 = std::min(ue, u0 + kBlockUnits);
    for (int64_t i0 = 0; i0 < m;) {
      const int done = T::template strip<kNan>(int(std::min<int64_t>(m - i0, 1 << 20)),
                                               x + i0 * ldx, ldx, W, u0, u1, y + i0 * ldy, ldy,
                                               n0, n1);
      i0 += done;
    }
  }
}

template <class T>
void gemm_f8_blocked(const uint16_t* x, int64_t ldx, const F8Weights& W, float* y, int64_t ldy,
                     int64_t m, int64_t n0, int64_t n1) {
  if (m <= 0 || n1 <= n0 || W.k <= 0) return;
  if (W.nan_codes)
    f8_blocked<T, true>(x, ldx, W, y, ldy, m, n0, n1);
  else
    f8_blocked<T, false>(x, ldx, W, y, ldy, m, n0, n1);
}

}  // namespace
}  // namespace kvant::kernels
