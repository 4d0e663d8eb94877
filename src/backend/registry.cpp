// Which backends this build and machine run, by name (backend.h): "cpu"
// always, "cuda" in KVANT_CUDA builds on a machine with a CUDA device, and
// "cpu-scalar", the reference the op tests compare against.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu/kernels.h"
#if KVANT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kvant::backend {

std::vector<std::string> available_backends() {
  std::vector<std::string> v = {"cpu"};
#if KVANT_HAVE_CUDA
  if (cuda_device_count() > 0) v.push_back("cuda");
#endif
  return v;
}

std::string backend_device(const std::string& name) {
  auto b = make_backend(name);
  return b ? b->device() : std::string();
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cpu-scalar")
    return std::make_unique<CpuBackend>(*kernels::table_for(kernels::Isa::Scalar), 1,
                                        "cpu-scalar");
#if KVANT_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend();
#endif
  return nullptr;
}

}  // namespace kvant::backend
