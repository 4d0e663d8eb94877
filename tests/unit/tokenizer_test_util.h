// Shared helpers for the tokenizer tests: fixture paths, JSONL reading, and
// one lazily loaded Tokenizer per model file (loading Gemma's 262k-token
// vocabulary takes a moment, so the tests share it).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

namespace kvant::testing {

inline std::string fixture_path(const std::string& rel) {
  return std::string(KVANT_FIXTURES) + "/" + rel;
}
inline std::string model_path(const std::string& rel) {
  return std::string(KVANT_MODELS) + "/" + rel;
}
// shared/data sits beside the repository checkout.
inline std::string shared_data_path(const std::string& rel) {
  return (std::filesystem::path(KVANT_FIXTURES) / ".." / ".." / ".." / "shared" / "data" / rel)
      .string();
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// The tokenizer of a GGUF under KVANT_MODELS, or nullptr (with the reason in
// *why) when the file is absent or fails to load.
inline const Tokenizer* gguf_tokenizer(const std::string& file, std::string* why) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  static std::map<std::string, std::string> errors;
  if (auto it = cache.find(file); it != cache.end()) return it->second.get();
  if (auto it = errors.find(file); it != errors.end()) {
    *why = it->second;
    return nullptr;
  }
  const std::string path = model_path(file);
  std::string err;
  if (!std::filesystem::exists(path)) {
    err = path + " not found";
  } else if (auto g = GgufFile::open(path); !g) {
    err = g.error().message;
  } else if (auto t = Tokenizer::from_gguf(*g); !t) {
    err = t.error().message;
  } else {
    return (cache[file] = std::make_unique<Tokenizer>(std::move(t.value()))).get();
  }
  errors[file] = err;
  *why = err;
  return nullptr;
}

inline std::string ids_str(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace kvant::testing
