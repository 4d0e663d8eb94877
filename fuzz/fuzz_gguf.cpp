// libFuzzer target: GgufFile::parse on arbitrary bytes, then every tensor
// of an accepted file read through the GGUF TensorSource. Besides memory
// errors (ASan) and UB (UBSan), it checks one contract: a file the parser
// accepts must decode every tensor of a supported type without error.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "io/dequant.h"
#include "io/gguf.h"
#include "io/gguf_source.h"

using namespace kvant;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = GgufFile::parse({data, size}, "fuzz.gguf");
  if (!g) {
    if (g.error().message.empty()) std::abort();  // errors must say something
    return 0;
  }
  for (const auto& [key, v] : g->metadata()) {
    (void)g->get_string(key);
    (void)g->get_int(key);
    (void)g->get_numbers(key);
  }
  auto src = make_gguf_source(std::move(*g));
  std::vector<float> buf;
  for (const auto& t : src->tensors()) {
    if (t.numel() > (1 << 22)) continue;  // keep each run fast
    buf.resize(size_t(t.numel()));
    auto r = src->read_f32(t, buf);
    if (!r && dequant_supported(t.dtype)) std::abort();
  }
  return 0;
}
