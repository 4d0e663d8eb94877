// Cache blocking shared by the SIMD BF16 GEMMs. It holds no intrinsics: each
// ISA folder includes it and supplies a traits class with the packing routines
// and the register-tiled micro-kernels, so the loop nest is compiled once per
// ISA with that ISA's flags. Everything here has internal linkage, so the
// linker can never hand one ISA's copy to a caller of another.
//
// Loop nest (W rows j, x rows i, k pairs q):
//   for each block of kNB rows of W in [n0, n1):
//     for each block of kKCP pairs of k:
//       W block -> P16-pair panels (packed input: used in place; plain
//         input: repacked into a stack buffer, the only per-call overhead)
//       for each strip of kMR rows of x: x strip -> stack buffer, then the
//         micro-kernels sweep the strip across the block's panels.
// The partial sums of one k block are stored in y and reloaded by the next;
// FP32 values pass through memory unchanged, so blocking never alters the
// sequential per-(i, j) order the contract promises.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvant::kernels {
namespace {

// Traits T supply:
//   kNB (multiple of 16; W rows per block when repacking into the stack buffer),
//   kNBPacked (the same for pre-packed W, which needs no buffer: larger blocks
//   convert each x strip fewer times), kKCP, kMR, XElem, kXPerPair (x values per
//   k pair in the strip buffer)
//   pack_w(w, k, j0, rows, q0, kc, out): rows [j0, j0+rows) of W, pairs [q0, q0+kc) -> panels
//     with stride kc*16 dwords, rows past `rows` zero.
//   pack_x(x, ldx, rows, k, q0, kc, xb): kMR rows with stride kKCP*kXPerPair, pairs [q0, q0+kc),
//     values past k and rows past `rows` zero.
//   strip(rows, xb, panels, pstride, npanels, kc, y, ldy, jbase, jlo, jhi, accumulate):
//     y[r, jbase + c] (+)= ... for r < rows, c over npanels*16 columns clipped to [jlo, jhi).
template <class T>
void gemm_blocked(const uint16_t* x, int64_t ldx, const uint16_t* w, const uint16_t* wp, int64_t k,
                  float* y, int64_t ldy, int64_t m, int64_t n0, int64_t n1) {
  if (m <= 0 || n1 <= n0 || k <= 0) return;
  const int64_t kp = (k + 1) / 2;
  alignas(64) uint32_t wbuf[T::kNB * T::kKCP];
  alignas(64) typename T::XElem xbuf[T::kMR * T::kKCP * T::kXPerPair];
  // Packed panels sit at multiples of 16 rows; plain weights are repacked from n0.
  const int64_t jstart = wp ? n0 / 16 * 16 : n0;
  const uint32_t* wp32 = reinterpret_cast<const uint32_t*>(wp);
  const int64_t nb = wp ? T::kNBPacked : T::kNB;
  for (int64_t jb = jstart; jb < n1; jb += nb) {
    const int64_t jend = std::min(jb + nb, n1);
    const int64_t npanels = (jend - jb + 15) / 16;
    for (int64_t q0 = 0; q0 < kp; q0 += T::kKCP) {
      const int64_t kc = std::min<int64_t>(T::kKCP, kp - q0);
      const uint32_t* panels = wbuf;
      int64_t pstride = kc * 16;
      if (wp) {
        panels = wp32 + ((jb / 16) * kp + q0) * 16;
        pstride = kp * 16;
      } else {
        T::pack_w(w, k, jb, jend - jb, q0, kc, wbuf);
      }
      for (int64_t i0 = 0; i0 < m; i0 += T::kMR) {
        const int rows = int(std::min<int64_t>(T::kMR, m - i0));
        T::pack_x(x + i0 * ldx, ldx, rows, k, q0, kc, xbuf);
        T::strip(rows, xbuf, panels, pstride, npanels, kc, y + i0 * ldy, ldy, jb, std::max(jb, n0),
                 jend, q0 > 0);
      }
    }
  }
}

// Calls F::template run<NP>() for the largest NP <= NPMAX that is <= np.
template <int NP, class F>
inline void with_panels(int np, F&& f) {
  if constexpr (NP > 1) {
    if (np < NP) return with_panels<NP - 1>(np, f);
  }
  f.template operator()<NP>();
}

}  // namespace
}  // namespace kvant::kernels
