// The immutable state behind a Tokenizer, filled by the loaders
// (tokenizer_gguf.cpp, tokenizer_hf.cpp) and finished in one place
// (TokenizerBuilder::build), which derives everything both loaders share:
// decoded pieces, byte and character lookups, end-of-generation ids. Private
// to src/tokenizer.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace kvant {

// Lets the spelling -> id map be searched with a string_view, no copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenIds = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

enum class BpeKind {
  ByteLevel,      // GPT-2 alphabet, regex pre-tokenizer, no unknowns
  SentencePiece,  // spaces -> U+2581, code points as symbols, <0xNN> byte fallback
};

struct TokenizerState {
  BpeKind kind = BpeKind::ByteLevel;
  std::string model_kind;  // "gpt2" or "llama"

  // Filled by the loader.
  std::vector<std::string> text;  // vocabulary spelling, by id
  std::vector<TokenType> type;
  TokenIds ids;  // spelling -> id
  MergeTable merges;
  AddedTokenMatcher added;
  PreTokenizer pre;               // byte-level only; empty = whole segment is one word
  bool ignore_merges = false;     // a word that is itself a token skips BPE (Llama 3)
  bool byte_fallback = true;      // SentencePiece
  bool fuse_unk = true;           // SentencePiece
  bool add_space_prefix = false;  // SentencePiece: "▁" before the text, stripped on decode
  int32_t bos = -1, eos = -1, unk = -1;
  // Whether BPE maps a character it has no symbol for to `unk` (else drops
  // it). GGUF byte-level files name an unknown token their BPE never uses.
  bool bpe_unk = false;
  std::vector<int32_t> extra_eog;  // ids the file names as end-of-turn (eot, eom)
  bool adds_bos = false;
  std::string chat_template;

  // Derived by TokenizerBuilder::build.
  std::vector<std::string> piece;       // decoded bytes, by id
  std::array<int32_t, 256> byte_ids{};  // byte -> its symbol (alphabet char or <0xNN>), -1 if none
  std::unordered_map<uint32_t, int32_t> char_ids;  // SentencePiece: one-code-point tokens
  std::vector<int32_t> eog;
};

class TokenizerBuilder {
 public:
  // Checks the ids, derives the lookups and wraps the state.
  static Result<Tokenizer> build(TokenizerState&& state, const std::string& what);
};

}  // namespace kvant
