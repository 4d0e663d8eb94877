// The rank-order sum of the "nccl" communicator's all-reduce on the GPU
// (ordered_sum.h holds the arithmetic; nccl_communicator.cpp calls this).
#include <cuda_runtime.h>

#include "dist/nccl/ordered_sum.h"
#include "dist/nccl/ordered_sum_launch.h"

namespace kvant::dist {
namespace {

__global__ void ordered_sum_kernel(const float* __restrict__ parts, int n, size_t len,
                                   float* __restrict__ out) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < len;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = ordered_sum_element(parts, n, len, i);
}

}  // namespace

cudaError_t launch_ordered_sum(const float* parts, int n, size_t len, float* out,
                               cudaStream_t stream) {
  if (len == 0) return cudaSuccess;
  const unsigned threads = 256;
  const size_t want = (len + threads - 1) / threads;
  const unsigned blocks = unsigned(want < 4096 ? want : 4096);
  ordered_sum_kernel<<<blocks, threads, 0, stream>>>(parts, n, len, out);
  return cudaGetLastError();
}

}  // namespace kvant::dist
