// Tokenizer loading (tokenizer_files.h).
#include "tokenizer/tokenizer_files.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf.h"

namespace kvant {
namespace {

// The chat template of a Hugging Face directory (tokenizer_config.json).
std::string read_hf_chat_template(const std::string& dir) {
  std::ifstream f(std::filesystem::path(dir) / "tokenizer_config.json");
  if (!f) return "";
  auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
    return j["chat_template"].get<std::string>();
  return "";
}

// A tokenizer and template from a GGUF's metadata.
Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& g, std::string* chat_template) {
  auto t = Tokenizer::from_gguf(g);
  if (!t) return t.error();
  if (chat_template) *chat_template = g.get_string("tokenizer.chat_template").value_or("");
  return std::make_unique<Tokenizer>(std::move(*t));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFiles& files,
                                                  std::string* chat_template) {
  if (const GgufFile* g = files.gguf()) return from_gguf(*g, chat_template);
  return load_tokenizer_for(files.path(), chat_template);
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer_for(const std::string& model_path,
                                                      std::string* chat_template) {
  namespace fs = std::filesystem;
  if (fs::is_directory(model_path)) {
    const fs::path dir(model_path);
    if (!fs::exists(dir / "tokenizer.json") && fs::exists(dir / "tokenizer.gguf")) {
      // kvant quantize's output for a GGUF input: the tokenizer travels as a
      // GGUF file with metadata only.
      auto g = GgufFile::open((dir / "tokenizer.gguf").string());
      if (!g) return g.error();
      auto t = Tokenizer::from_gguf(*g);
      if (!t) return t.error();
      if (chat_template) *chat_template = g->get_string("tokenizer.chat_template").value_or("");
      return std::make_unique<Tokenizer>(std::move(*t));
    }
    auto t = Tokenizer::from_hf_json((fs::path(model_path) / "tokenizer.json").string());
    if (!t) return t.error();
    if (chat_template) *chat_template = read_hf_chat_template(model_path);
    return std::make_unique<Tokenizer>(std::move(*t));
  }
  auto g = GgufFile::open(model_path);
  if (!g) return g.error();
  return from_gguf(*g, chat_template);
}

}  // namespace kvant
