// The element type of KV-cache pages: the one enum for it, shared by the
// kernels that read pages, the page layout (kvcache/) and the backends.
#pragma once

#include <cstdint>

namespace kvant {

enum class KvDType : uint8_t { kBf16 = 0, kFp8E4m3 = 1, kFp8E5m2 = 2 };

}  // namespace kvant
