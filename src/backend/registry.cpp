// Which backends this build and machine run, by name (backend.h): "cpu"
// always, "cuda" in KVANT_CUDA builds on a machine with a CUDA device, and
// "cpu-scalar", the reference the op tests compare against; and the
// backend-independent helpers backend.h declares (the MoE counting sort,
// KV arenas from a backend's memory).
#include <algorithm>
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

void moe_counting_sort(const int32_t* ids, int64_t n, int64_t E, const MoeSort& s) {
  std::fill(s.offsets, s.offsets + E + 1, int64_t(0));
  for (int64_t i = 0; i < n; ++i) ++s.offsets[ids[i] + 1];
  for (int64_t e = 0; e < E; ++e) s.offsets[e + 1] += s.offsets[e];
  std::copy(s.offsets, s.offsets + E, s.fill);
  for (int64_t i = 0; i < n; ++i) s.slot[i] = s.fill[ids[i]]++;
}

std::function<std::shared_ptr<uint8_t>(size_t)> kv_arena(Backend& be) {
  if (be.host_memory()) return nullptr;
  return [&be](size_t bytes) {
    auto buf = std::make_shared<DeviceBuffer>(be.alloc(bytes));
    return std::shared_ptr<uint8_t>(buf, static_cast<uint8_t*>(buf->data()));
  };
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
