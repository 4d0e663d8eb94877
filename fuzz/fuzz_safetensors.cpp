// libFuzzer target: SafetensorsFile::parse on arbitrary bytes (and the same
// bytes as a shard index), then every tensor of an accepted file read
// through the safetensors TensorSource, FP8 block scales included. An
// accepted file whose supported tensors fail to decode is a bug (abort).
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "io/dequant.h"
#include "io/safetensors.h"

using namespace kvant;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size),
                                "fuzz.index.json");
  auto f = SafetensorsFile::parse({data, size}, "fuzz.safetensors");
  if (!f) {
    if (f.error().message.empty()) std::abort();
    return 0;
  }
  std::vector<SafetensorsFile> shards;
  shards.push_back(std::move(*f));
  auto src = make_safetensors_source(std::move(shards), "fuzz.safetensors");
  if (!src) return 0;  // e.g. block scales of the wrong shape
  std::vector<float> buf;
  for (const auto& t : (*src)->tensors()) {
    if (t.numel() > (1 << 22)) continue;
    buf.resize(size_t(t.numel()));
    auto r = (*src)->read_f32(t, buf);
    if (!r && dequant_supported(t.dtype)) std::abort();
  }
  return 0;
}
