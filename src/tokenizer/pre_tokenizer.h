// Pre-tokenization for byte-level BPE: cuts text into the pieces BPE runs on,
// as a sequence of regex splits in Hugging Face's "isolated" behaviour (each
// match and each gap between matches becomes a piece). Patterns are the HF
// ones, compiled with PCRE2 (UTF + UCP, JIT); `\s`/`\S` are rewritten to the
// Unicode White_Space set that HF's regex engine uses. It owns the per-family
// patterns (GPT-2, SmolLM2, Llama 3, Qwen2) and nothing about vocabularies.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace kvant {

inline constexpr std::string_view kGpt2Split =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// HF's Digits(individual_digits=true): every numeric character alone.
inline constexpr std::string_view kDigitsSplit = R"(\p{N})";

class PreTokenizer {
 public:
  // Each pattern splits every piece the previous one produced.
  static Result<PreTokenizer> from_patterns(const std::vector<std::string>& patterns);
  // The split for a GGUF tokenizer.ggml.pre value of a byte-level vocabulary.
  static Result<PreTokenizer> for_gguf_pre(std::string_view pre);

  // Appends the pieces of `text` (views into it). `text` must be valid UTF-8.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

  bool empty() const { return steps_.empty(); }

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;  // shared: compiled code is immutable
};

// `\s` -> HF's White_Space class, `\S` -> its complement (exposed for tests).
std::string rewrite_whitespace_classes(std::string_view pattern);

}  // namespace kvant
