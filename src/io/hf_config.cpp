// config.json goes through the same strict parser as safetensors headers, so
// a duplicated key is an error rather than a silent "last one wins".
#include "io/hf_config.h"

#include <filesystem>

#include "io/json_text.h"

namespace kvant {

Result<nlohmann::json> read_hf_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  auto j = read_json_file(path);
  if (!j) return j.error();
  if (!j->is_object()) return make_error(path + ": not a JSON object");
  return j;
}

}  // namespace kvant
