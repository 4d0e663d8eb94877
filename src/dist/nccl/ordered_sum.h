// The "nccl" communicator's all-reduce arithmetic, one element at a time,
// for the GPU kernel (ordered_sum.cu) and the CPU tests alike: element i of
// the result is ((p_0[i] + p_1[i]) + p_2[i]) + ... + p_{n-1}[i], the
// parts in rank order, as communicator.h promises for every communicator.
#pragma once

#include <cstddef>

#if defined(__CUDACC__)
#define KVANT_HOST_DEVICE __host__ __device__
#else
#define KVANT_HOST_DEVICE
#endif

namespace kvant::dist {

// parts: n rows of len floats, rank r's contribution in row r.
KVANT_HOST_DEVICE inline float ordered_sum_element(const float* parts, int n, size_t len,
                                                   size_t i) {
  float s = parts[i];
  for (int r = 1; r < n; ++r) s += parts[size_t(r) * len + i];
  return s;
}

}  // namespace kvant::dist
