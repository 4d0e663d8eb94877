// Host-side entry of ordered_sum.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace kvant::dist {

// out[i] = ordered_sum_element(parts, n, len, i) for i < len, on `stream`.
// `parts` (n * len floats) and `out` are device memory; out may not overlap parts.
cudaError_t launch_ordered_sum(const float* parts, int n, size_t len, float* out,
                               cudaStream_t stream);

}  // namespace kvant::dist
