// Parallel loops: one mechanism (OpenMP), used by callers of kernels. The
// thread count is set once (set_num_threads) from --threads.
#pragma once

#include <omp.h>

#include <cstdint>

namespace kvant {

inline void set_num_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}
inline int num_threads() { return omp_get_max_threads(); }

// Calls fn(begin, end) on contiguous slices of [0, n), each a multiple of
// `grain` (except the last), one slice per thread of `nt`.
template <class Fn>
void parallel_for_n(int nt, int64_t n, int64_t grain, Fn&& fn) {
  const int64_t blocks = (n + grain - 1) / grain;
  if (nt <= 1 || blocks <= 1) {
    fn(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int T = omp_get_num_threads();
    const int64_t b0 = blocks * t / T, b1 = blocks * (t + 1) / T;
    const int64_t begin = b0 * grain, end = b1 * grain < n ? b1 * grain : n;
    if (begin < end) fn(begin, end);
  }
}

// The same over the process's thread count.
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  parallel_for_n(num_threads(), n, grain, fn);
}

}  // namespace kvant
