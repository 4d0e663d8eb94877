// open_tensor_source: picks the reader from the path. A directory is a
// Hugging Face checkpoint; files go by extension, since neither format has a
// magic number that rules the other out (safetensors starts with a length).
#include "io/tensor_source.h"

#include <filesystem>

#include "io/gguf_source.h"
#include "io/safetensors.h"

namespace kvant {

Result<std::unique_ptr<TensorSource>> open_tensor_source(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return open_safetensors_source(path);
  if (path.ends_with(".gguf")) return open_gguf_source(path);
  if (path.ends_with(".safetensors") || path.ends_with(".safetensors.index.json"))
    return open_safetensors_source(path);
  if (!std::filesystem::exists(path, ec)) return make_error(path + ": no such file or directory");
  return make_error(path +
                    ": unknown model file type (expected .gguf, .safetensors, "
                    "model.safetensors.index.json or a directory)");
}

}  // namespace kvant
