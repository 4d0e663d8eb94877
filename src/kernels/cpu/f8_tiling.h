// Loop nest shared by the SIMD FP8-weight GEMMs (gemm_f8, kernels.h). Like
// gemm_tiling.h it holds no intrinsics: each ISA folder includes it with a
// traits class and compiles it with its own flags; internal linkage only.
//
// x's rows are first widened to FP32 and scaled by 2^K per row (kernels.h,
// gemm_f8), in a per-thread buffer laid out as the packed groups (each group
// padded to whole quads with zeros), so a column's x is one broadcast load.
// Units of kU output rows (16 rows, a whole F8 Q16 panel, for AVX-512; 8
// rows, half a panel, for AVX2), one row per lane. For each block of
// kBlockRows output rows, for each strip of x rows, the micro-kernel sweeps
// the block's units NU at a time: per scale group it loads each unit's word
// of a column quad once, decodes the quad's four codes into four vectors,
// feeds them to all MR rows of x (columns 0 and 2 into the even sums, 1 and
// 3 into the odd ones) and at the group's end folds each row's e + o into y
// (kept in registers across the groups when MR is 1).
//
// Traits T supply: kU, kBlockRows (multiple of 16), V (FP32 vector), R (a
// unit's raw quad word vector); zero() -> V; bcast(const float*) -> V;
// load(const uint8_t*) -> R; decode<t, kMode>(R) -> V (code t of each lane's
// word as e4m3 * 2^-120, or 2^-104 with kF8Sub in kMode; NaN codes as NaN
// with kF8Nan); fma(V acc, V x, V w) -> V; fold(V e, V o, float
// unscale, const float* scales of the unit, V y) -> fma((e + o) * unscale,
// s, y); load_y / store_y(y row, jbase, jlo, jhi), the unit's lanes in
// [jlo, jhi) only; and strip<kMode>(rows, ...) choosing tile shapes (below).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_tiling.h"
#include "kernels/cpu/kernels.h"

namespace kvant::kernels {
namespace {

// Decode modes (kMode bits): NaN codes present; subnormal codes present on a
// CPU where FP32 denormal operands are slow (f8_denormals_slow), decoded at
// 2^-104 so that every value is a normal FP32 (x's unscale follows).
inline constexpr int kF8Nan = 1, kF8Sub = 2;

// Everything here is a template on the including ISA's traits (or tag) T,
// so its instantiations carry T's namespace (avx2::, avx512::, ...) in
// their names, which tests/isa_guard.py reads.

// Units u0 .. u0 + NU - 1 of kU rows (16 / kU per F8 Q16 panel): where
// their codes, scales and first output columns start.
template <class T, int NU>
struct F8Units {
  const uint8_t* w[NU];
  const float* s[NU];
  int64_t j[NU];
  F8Units(const F8Weights& W, int64_t u0, int64_t kU) {
    const int64_t ng = f8_groups(W.k, W.group), kq = f8_quads(W.k, W.group), per = 16 / kU;
#pragma GCC unroll 8
    for (int u = 0; u < NU; ++u) {
      const int64_t p = (u0 + u) / per, h = (u0 + u) % per;
      w[u] = W.w + p * kq * 64 + h * 4 * kU;
      s[u] = W.scales + p * ng * 16 + h * kU;
      j[u] = p * 16 + h * kU;
    }
  }
};

// One-row sweeps (decode) ask for each unit's codes this far ahead, into
// L2: decoding keeps the core busy enough that the hardware prefetchers
// alone leave a cold matrix streaming at 65-75% of the read bandwidth (Zen
// 4, one thread); 2 KB ahead (32 quads) brought it to 85-95%.
inline constexpr int64_t kF8PrefetchBytes = 2048;

// A per-thread scratch array, grown and never shrunk. Not std::vector: its
// out-of-line members are shared between translation units, and a copy
// compiled here with AVX flags could be the one the whole program links.
template <class T, class E>
struct F8Scratch {
  E* p = nullptr;
  int64_t n = 0;
  F8Scratch() = default;
  F8Scratch(const F8Scratch&) = delete;
  F8Scratch& operator=(const F8Scratch&) = delete;
  ~F8Scratch() { delete[] p; }
  E* get(int64_t want) {
    if (want > n) {
      delete[] p;
      p = new E[size_t(want)];
      n = want;
    }
    return p;
  }
};

// x's rows in the packed groups' column order, each group padded to whole
// quads with zeros, converted by cv(row i, BF16 bits) into buf (rows of
// f8_padded_cols floats or BF16).
inline int64_t f8_padded_cols(const F8Weights& W) { return f8_quads(W.k, W.group) * 4; }
template <class T, class E, class Cv>
const E* f8_pad_rows(F8Scratch<T, E>& buf, const uint16_t* x, int64_t ldx, const F8Weights& W,
                     int64_t m, Cv cv) {
  const int64_t ng = f8_groups(W.k, W.group), gq = f8_group_quads(W.k, W.group);
  const int64_t ld = f8_padded_cols(W), span = std::min(W.group, W.k);
  E* out = buf.get(m * ld);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t c0 = g * W.group, len = std::min(span, W.k - c0);
      E* d = out + i * ld + g * gq * 4;
      for (int64_t c = 0; c < len; ++c) d[c] = cv(i, x[i * ldx + c0 + c]);
      for (int64_t c = len; c < (len + 3) / 4 * 4; ++c) d[c] = E(0);
    }
  return out;
}

// x rows in FP32, scaled by 2^K per row (kernels.h, gemm_f8).
struct F8Rows {
  const float* x = nullptr;        // rows of ld floats
  const float* unscale = nullptr;  // per row: 2^(base - K), base 120 (104 with kF8Sub)
  int64_t ld = 0;
};

template <class T>
F8Rows f8_rows(const uint16_t* x, int64_t ldx, const F8Weights& W, int64_t m, int base) {
  thread_local F8Scratch<T, float> buf, unscale_buf, scale_buf;
  float* unscale = unscale_buf.get(m);
  float* scale = scale_buf.get(m);
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* xi = x + i * ldx;
    uint16_t top = 0;
    for (int64_t c = 0; c < W.k; ++c) top = std::max<uint16_t>(top, uint16_t(xi[c] & 0x7fff));
    // E = exponent of the largest |x| (its biased field - 127); K = min(120,
    // 125 - E) keeps |x| * 2^K below 2^126. Inf / NaN rows get K = -3.
    const int K = std::min(120, 125 - (int(top >> 7) - 127));
    const uint32_t sb = uint32_t(127 + K) << 23, ub = uint32_t(127 + base - K) << 23;
    std::memcpy(&scale[size_t(i)], &sb, 4);
    std::memcpy(&unscale[size_t(i)], &ub, 4);
  }
  const float* xs = f8_pad_rows(buf, x, ldx, W, m, [&](int64_t i, uint16_t b) {
    const uint32_t bits = uint32_t(b) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return v * scale[size_t(i)];
  });
  return {xs, unscale, f8_padded_cols(W)};
}

template <class T, int MR, int NU, int kMode>
void f8_tile(int rows, const F8Rows& xs, const F8Weights& W, int64_t u0, float* y, int64_t ldy,
             int64_t jlo, int64_t jhi) {
  using V = typename T::V;
  using R = typename T::R;
  const int64_t ng = f8_groups(W.k, W.group), gq = f8_group_quads(W.k, W.group);
  const int64_t kq = f8_quads(W.k, W.group);
  const F8Units<T, NU> units(W, u0, T::kU);
  const uint8_t* const* wu = units.w;
  const float* const* su = units.s;
  const int64_t* ju = units.j;
  const float* xr[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) xr[r] = xs.x + std::min(r, rows - 1) * xs.ld;
  // One row: its outputs stay in registers across the groups.
  [[maybe_unused]] V out[NU];
  if constexpr (MR == 1)
#pragma GCC unroll 8
    for (int u = 0; u < NU; ++u) out[u] = T::zero();
  for (int64_t g = 0; g < ng; ++g) {
    V e[MR][NU], o[MR][NU];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NU; ++u) e[r][u] = o[r][u] = T::zero();
    for (int64_t q = g * gq; q < std::min(kq, (g + 1) * gq); ++q) {
      if constexpr (MR == 1) {
        // Its four x broadcast once, each unit decoded just before its FMAs.
        const V x0 = T::bcast(xr[0] + 4 * q), x1 = T::bcast(xr[0] + 4 * q + 1);
        const V x2 = T::bcast(xr[0] + 4 * q + 2), x3 = T::bcast(xr[0] + 4 * q + 3);
#pragma GCC unroll 8
        for (int u = 0; u < NU; ++u) {
          __builtin_prefetch(wu[u] + q * 64 + kF8PrefetchBytes, 0, 2);
          const R d = T::load(wu[u] + q * 64);
          e[0][u] = T::fma(e[0][u], x0, T::template decode<0, kMode>(d));
          o[0][u] = T::fma(o[0][u], x1, T::template decode<1, kMode>(d));
          e[0][u] = T::fma(e[0][u], x2, T::template decode<2, kMode>(d));
          o[0][u] = T::fma(o[0][u], x3, T::template decode<3, kMode>(d));
        }
      } else {
        R d[NU];
#pragma GCC unroll 8
        for (int u = 0; u < NU; ++u) d[u] = T::load(wu[u] + q * 64);
        auto column = [&]<int t>() {
          V w[NU];
#pragma GCC unroll 8
          for (int u = 0; u < NU; ++u) w[u] = T::template decode<t, kMode>(d[u]);
#pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            const V xv = T::bcast(xr[r] + 4 * q + t);
#pragma GCC unroll 8
            for (int u = 0; u < NU; ++u) {
              if constexpr (t % 2 == 0)
                e[r][u] = T::fma(e[r][u], xv, w[u]);
              else
                o[r][u] = T::fma(o[r][u], xv, w[u]);
            }
          }
        };
        column.template operator()<0>();
        column.template operator()<1>();
        column.template operator()<2>();
        column.template operator()<3>();
      }
    }
    if constexpr (MR == 1) {
#pragma GCC unroll 8
      for (int u = 0; u < NU; ++u)
        out[u] = T::fold(e[0][u], o[0][u], xs.unscale[0], su[u] + g * 16, out[u]);
    } else {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        if (r < rows)
#pragma GCC unroll 8
          for (int u = 0; u < NU; ++u) {
            const V prev = g == 0 ? T::zero() : T::load_y(y + r * ldy, ju[u], jlo, jhi);
            T::store_y(T::fold(e[r][u], o[r][u], xs.unscale[r], su[u] + g * 16, prev),
                       y + r * ldy, ju[u], jlo, jhi);
          }
    }
  }
  if constexpr (MR == 1)
#pragma GCC unroll 8
    for (int u = 0; u < NU; ++u) T::store_y(out[u], y, ju[u], jlo, jhi);
}

// Units [u0, u1) NUMAX at a time, the last sweep narrower.
template <class T, int MR, int NUMAX, int kMode>
void f8_sweep(int rows, const F8Rows& xs, const F8Weights& W, int64_t u0, int64_t u1, float* y,
              int64_t ldy, int64_t jlo, int64_t jhi) {
  for (int64_t u = u0; u < u1; u += NUMAX)
    with_panels<NUMAX>(int(std::min<int64_t>(NUMAX, u1 - u)), [&]<int NU>() {
      f8_tile<T, MR, NU, kMode>(rows, xs, W, u, y, ldy, jlo, jhi);
    });
}

template <class T, int kMode>
void f8_blocked(const F8Rows& xs, const F8Weights& W, float* y, int64_t ldy, int64_t m, int64_t n0,
                int64_t n1) {
  constexpr int64_t kBlockUnits = T::kBlockRows / T::kU;
  const int64_t ub = n0 / T::kU, ue = (n1 + T::kU - 1) / T::kU;
  for (int64_t u0 = ub; u0 < ue; u0 += kBlockUnits) {
    const int64_t u1 = std::min(ue, u0 + kBlockUnits);
    for (int64_t i0 = 0; i0 < m;) {
      const F8Rows strip{xs.x + i0 * xs.ld, xs.unscale + i0, xs.ld};
      i0 += T::template strip<kMode>(int(std::min<int64_t>(m - i0, 1 << 20)), strip, W, u0, u1,
                                    y + i0 * ldy, ldy, n0, n1);
    }
  }
}

template <class T>
void gemm_f8_blocked(const uint16_t* x, int64_t ldx, const F8Weights& W, float* y, int64_t ldy,
                     int64_t m, int64_t n0, int64_t n1) {
  if (m <= 0 || n1 <= n0 || W.k <= 0) return;
  const bool sub = f8_subnormal_decode(W.subnormal_share, m);
  const F8Rows xs = f8_rows<T>(x, ldx, W, m, sub ? 104 : 120);
  switch ((W.nan_codes ? kF8Nan : 0) | (sub ? kF8Sub : 0)) {
    case 0:
      return f8_blocked<T, 0>(xs, W, y, ldy, m, n0, n1);
    case kF8Nan:
      return f8_blocked<T, kF8Nan>(xs, W, y, ldy, m, n0, n1);
    case kF8Sub:
      return f8_blocked<T, kF8Sub>(xs, W, y, ldy, m, n0, n1);
    default:
      return f8_blocked<T, kF8Nan | kF8Sub>(xs, W, y, ldy, m, n0, n1);
  }
}

}  // namespace
}  // namespace kvant::kernels
