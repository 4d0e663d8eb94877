// Host-side operations (backend/host.h) on the CPU kernel table.
#include "backend/host.h"

#include "kernels/cpu/kernels.h"

namespace kvant::backend {

void host_softmax(float* x, int64_t n) { kernels::active().softmax(x, n); }

int64_t host_argmax(const float* x, int64_t n) { return kernels::active().argmax(x, n); }

}  // namespace kvant::backend
