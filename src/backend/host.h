// Operations the engine runs on logits in host memory (sampling,
// log-probabilities), on this machine's best CPU kernels. Whatever backend
// computed the logits, sampling happens here, on the host.
#pragma once

#include <cstdint>

namespace kvant::backend {

// In place: x = exp(x - max(x)) / sum (kernels/cpu/kernels.h's softmax
// contract: -inf entries become exactly 0).
void host_softmax(float* x, int64_t n);

// The first index of the largest value, NaN entries passed over (the
// kernels' argmax contract: the scalar first-maximum loop's index).
int64_t host_argmax(const float* x, int64_t n);

}  // namespace kvant::backend
