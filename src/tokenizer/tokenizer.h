// Text <-> token ids for the engine: byte-level BPE (GPT-2 style: SmolLM2,
// Llama 3, Qwen2/3) and SentencePiece-style BPE with byte fallback (Gemma),
// loaded from a GGUF's tokenizer.* metadata or a Hugging Face tokenizer.json.
// Encoding matches Hugging Face `tokenizers` id for id (tests/fixtures/
// tokenizer, tools/fixtures/gen_tokenizer.py). A Tokenizer is immutable after
// loading and cheap to copy (shared state), so any number of threads may use
// one at once. Chat formatting lives in chat_template.h; sampling and stop
// strings are the engine's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "io/gguf.h"

namespace kvant {

// GGUF's tokenizer.ggml.token_type values.
enum class TokenType : uint8_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

struct TokenizerState;

class Tokenizer {
 public:
  static Result<Tokenizer> from_gguf(const GgufFile& file);
  // Reads tokenizer.json and, when present beside it, tokenizer_config.json
  // (add_bos_token, bos_token, eos_token, chat_template).
  static Result<Tokenizer> from_hf_json(const std::string& tokenizer_json_path);

  // `add_bos` is honoured only if the model adds BOS (adds_bos()). With
  // `parse_special` false, control/special tokens written in the text are
  // tokenized as plain text; user-defined added tokens are still matched.
  // Invalid UTF-8 in `text` is replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const;

  // Concatenates the tokens' bytes; invalid UTF-8 becomes U+FFFD (one per
  // maximal invalid subpart). `skip_special` drops control tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t bos_id() const;  // -1 when the vocabulary has none
  int32_t eos_id() const;
  bool adds_bos() const;
  int32_t vocab_size() const;
  // End-of-generation ids: eos plus <|im_end|>, <end_of_turn>, <|eot_id|>,
  // <|endoftext|>, ... when present as control tokens. Sorted.
  const std::vector<int32_t>& eog_ids() const;
  bool is_eog(int32_t id) const;

  // The token as the vocabulary spells it ("Ġthe", "▁the", "<0x0A>").
  // Out-of-range ids give an empty string.
  const std::string& token_text(int32_t id) const;
  std::optional<int32_t> token_id(std::string_view text) const;
  // The bytes the token stands for when decoded (" the", "\n"); may be a
  // fragment of a UTF-8 sequence.
  const std::string& token_piece(int32_t id) const;
  TokenType token_type(int32_t id) const;
  bool is_special(int32_t id) const { return token_type(id) == TokenType::Control; }

  // The chat template the model ships (GGUF tokenizer.chat_template or
  // tokenizer_config.json); empty when it has none.
  const std::string& chat_template() const;
  // "gpt2" (byte-level BPE) or "llama" (SentencePiece-style BPE).
  const std::string& model_kind() const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerState> s) : s_(std::move(s)) {}
  friend class TokenizerBuilder;
  friend class StreamDecoder;
  // The bytes `id` contributes to decoded text at this position (empty when
  // skipped); `first` marks the first token that produces output.
  std::string_view output_piece(int32_t id, bool first, bool skip_special) const;
  std::shared_ptr<const TokenizerState> s_;
};

// Streaming detokenization: push ids one at a time and get text that is
// always valid UTF-8; a multi-byte character split across tokens is held
// back until complete. The concatenation of every push() and finish() equals
// decode() of the same ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(&tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);
  // Emits what is held back, with U+FFFD for an incomplete sequence; the
  // decoder can then be reused for a new sequence.
  std::string finish();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  bool started_ = false;
  std::string pending_;
};

}  // namespace kvant
