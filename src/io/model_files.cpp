// ModelFiles (model_files.h).
#include "io/model_files.h"

#include <filesystem>
#include <fstream>

#include "io/compressed_tensors.h"
#include "io/gguf_source.h"

namespace kvant {

Result<std::shared_ptr<const ModelFiles>> ModelFiles::open(const std::string& path) {
  namespace fs = std::filesystem;
  auto f = std::make_shared<ModelFiles>();
  f->path_ = path;
  std::error_code ec;
  f->directory_ = fs::is_directory(path, ec);
  if (f->directory_) {
    const std::string cfg = (fs::path(path) / "config.json").string();
    std::ifstream in(cfg);
    if (!in) return make_error(cfg + ": cannot open");
    try {
      f->config_ = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      return make_error(cfg + ": invalid JSON: " + e.what());
    }
    f->fp8_ = is_fp8_quantization_config(f->config_);
    auto s = f->fp8_ ? Result<std::optional<Int4Scheme>>(std::optional<Int4Scheme>())
                     : parse_quantization_config(f->config_);
    f->int4_ = s && s->has_value();
  }
  if (f->directory_) {
    auto src = open_tensor_source(path);
    if (!src) return src.error();
    f->tensors_ = std::move(*src);
  } else {
    // A model file is a GGUF (its metadata holds the config).
    auto g = GgufFile::open(path);
    if (!g) return g.error();
    f->tensors_ = make_gguf_source(std::move(*g));
  }
  ++opened_;
  return std::shared_ptr<const ModelFiles>(std::move(f));
}

}  // namespace kvant
