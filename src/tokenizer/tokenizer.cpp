// Encoding and decoding over a loaded TokenizerState, the StreamDecoder, and
// the derivations every loader shares (TokenizerBuilder::build). Loading
// itself is in tokenizer_gguf.cpp and tokenizer_hf.cpp.
//
// encode(): added tokens are cut out of the raw text first (leftmost-longest);
// each stretch between them is pre-tokenized (byte-level) or normalized
// (SentencePiece: ' ' -> U+2581) and BPE-merged, word by word. This is the
// order HF tokenizers applies its stages in, which the fixtures check.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "tokenizer/tokenizer_state.h"
#include "tokenizer/utf8.h"

namespace kvant {
namespace {

const std::string kEmpty;

// Control tokens that end a turn in the chat formats kvant knows.
constexpr std::string_view kEogTexts[] = {
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|end|>",
    "<|return|>",
    "<eos>",
    "</s>",
    "<|END_OF_TURN_TOKEN|>",
};

struct EncodeScratch {
  std::vector<std::string_view> pieces;
  std::vector<int32_t> symbols;
  std::string buffer;
  BpeScratch bpe;
};

void encode_byte_level(const TokenizerState& s, std::string_view segment, EncodeScratch& w,
                       std::vector<int32_t>& out) {
  w.pieces.clear();
  if (s.pre.empty()) {
    w.pieces.push_back(segment);
  } else {
    s.pre.split(segment, w.pieces);
  }
  for (std::string_view piece : w.pieces) {
    if (s.ignore_merges) {
      w.buffer.clear();
      for (char c : piece) utf8::append_code_point(utf8::byte_char(uint8_t(c)), w.buffer);
      if (auto it = s.ids.find(w.buffer); it != s.ids.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    // A byte the vocabulary has no symbol for becomes <unk> only when the
    // BPE model has one; otherwise it is dropped, as HF does. SmolLM2's
    // vocabulary lacks 21 of the 256 bytes (0x04, 0x13, 0xF1, 0xF5, ...).
    w.symbols.clear();
    for (char c : piece) {
      if (const int32_t id = s.byte_ids[uint8_t(c)]; id >= 0) {
        w.symbols.push_back(id);
      } else if (s.bpe_unk) {
        w.symbols.push_back(s.unk);
      }
    }
    bpe_merge(w.symbols, s.merges, w.bpe, out);
  }
}

void encode_sentencepiece(const TokenizerState& s, std::string_view segment, bool at_text_start,
                          EncodeScratch& w, std::vector<int32_t>& out) {
  std::string& norm = w.buffer;
  norm.clear();
  if (s.add_space_prefix && at_text_start) norm.append(utf8::kMetaspace);
  for (char c : segment) {
    if (c == ' ') {
      norm.append(utf8::kMetaspace);
    } else {
      norm += c;
    }
  }
  if (s.ignore_merges) {
    if (auto it = s.ids.find(norm); it != s.ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols as HF's BPE makes them: a code point that is a token, or
  // its bytes as <0xNN> tokens, or <unk> (consecutive unknowns fused). A
  // pending <unk> is flushed only before the next in-vocabulary character,
  // which is where HF places it too.
  w.symbols.clear();
  bool pending_unk = false;
  size_t i = 0;
  while (i < norm.size()) {
    const size_t start = i;
    const uint32_t cp = utf8::next_code_point(norm, i);
    if (auto it = s.char_ids.find(cp); it != s.char_ids.end()) {
      if (pending_unk) w.symbols.push_back(s.unk);
      pending_unk = false;
      w.symbols.push_back(it->second);
      continue;
    }
    if (s.byte_fallback) {
      bool all = true;
      for (size_t k = start; k < i; ++k) all = all && s.byte_ids[uint8_t(norm[k])] >= 0;
      if (all) {
        for (size_t k = start; k < i; ++k) w.symbols.push_back(s.byte_ids[uint8_t(norm[k])]);
        continue;
      }
    }
    if (!s.bpe_unk) continue;  // nothing to stand for it: dropped, as HF does without unk
    if (pending_unk && !s.fuse_unk) w.symbols.push_back(s.unk);
    pending_unk = true;
  }
  if (pending_unk) w.symbols.push_back(s.unk);
  bpe_merge(w.symbols, s.merges, w.bpe, out);
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  const TokenizerState& s = *s_;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::to_valid(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && s.adds_bos && s.bos >= 0) out.push_back(s.bos);
  EncodeScratch w;
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedTokenMatcher::Match m = s.added.find(text, pos, parse_special);
    const size_t end = m.id >= 0 ? m.begin : text.size();
    if (end > pos) {
      const std::string_view segment = text.substr(pos, end - pos);
      if (s.kind == BpeKind::ByteLevel) {
        encode_byte_level(s, segment, w, out);
      } else {
        encode_sentencepiece(s, segment, pos == 0, w, out);
      }
    }
    if (m.id < 0) break;
    out.push_back(m.id);
    pos = m.end;
  }
  return out;
}

std::string_view Tokenizer::output_piece(int32_t id, bool first, bool skip_special) const {
  const TokenizerState& s = *s_;
  if (id < 0 || size_t(id) >= s.piece.size()) return {};
  if (skip_special && s.type[size_t(id)] == TokenType::Control) return {};
  std::string_view p = s.piece[size_t(id)];
  // The prefix space encode() added is not part of the text.
  if (first && s.add_space_prefix && !p.empty() && p[0] == ' ') p.remove_prefix(1);
  return p;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    const std::string_view p = output_piece(id, first, skip_special);
    if (p.empty()) continue;
    first = false;
    bytes.append(p);
  }
  return utf8::to_valid(bytes);
}

int32_t Tokenizer::bos_id() const { return s_->bos; }
int32_t Tokenizer::eos_id() const { return s_->eos; }
bool Tokenizer::adds_bos() const { return s_->adds_bos; }
int32_t Tokenizer::vocab_size() const { return int32_t(s_->text.size()); }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return s_->eog; }
bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(s_->eog.begin(), s_->eog.end(), id);
}
const std::string& Tokenizer::token_text(int32_t id) const {
  return id >= 0 && size_t(id) < s_->text.size() ? s_->text[size_t(id)] : kEmpty;
}
const std::string& Tokenizer::token_piece(int32_t id) const {
  return id >= 0 && size_t(id) < s_->piece.size() ? s_->piece[size_t(id)] : kEmpty;
}
TokenType Tokenizer::token_type(int32_t id) const {
  return id >= 0 && size_t(id) < s_->type.size() ? s_->type[size_t(id)] : TokenType::Undefined;
}
std::optional<int32_t> Tokenizer::token_id(std::string_view text) const {
  auto it = s_->ids.find(text);
  if (it == s_->ids.end()) return std::nullopt;
  return it->second;
}
const std::string& Tokenizer::chat_template() const { return s_->chat_template; }
const std::string& Tokenizer::model_kind() const { return s_->model_kind; }

std::string StreamDecoder::push(int32_t id) {
  const std::string_view p = tok_->output_piece(id, !started_, skip_special_);
  if (p.empty()) return {};
  started_ = true;
  pending_.append(p);
  std::string out;
  const size_t used = utf8::append_lossy(pending_, out, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  utf8::append_lossy(pending_, out, /*final=*/true);
  pending_.clear();
  started_ = false;
  return out;
}

Result<Tokenizer> TokenizerBuilder::build(TokenizerState&& st, const std::string& what) {
  TokenizerState& s = st;
  const size_t n = s.text.size();
  if (n == 0) return make_error(what + ": empty vocabulary");
  if (s.type.size() != n) s.type.resize(n, TokenType::Normal);
  for (int32_t* id : {&s.bos, &s.eos, &s.unk}) {
    if (*id >= int32_t(n))
      return make_error(what + ": special token id " + std::to_string(*id) +
                        " is outside the vocabulary of " + std::to_string(n));
  }
  if (s.ids.empty()) {
    s.ids.reserve(n);
    for (size_t i = 0; i < n; ++i) s.ids.emplace(s.text[i], int32_t(i));
  }

  s.byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string key;
    if (s.kind == BpeKind::ByteLevel) {
      utf8::append_code_point(utf8::byte_char(uint8_t(b)), key);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      key = buf;
    }
    if (auto it = s.ids.find(key); it != s.ids.end()) s.byte_ids[size_t(b)] = it->second;
  }

  s.piece.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = s.text[i];
    const TokenType ty = s.type[i];
    std::string& p = s.piece[i];
    if (ty == TokenType::Control || ty == TokenType::UserDefined) {
      p = t;
      // A SentencePiece user-defined token spelled with U+2581 stands for spaces.
      if (s.kind == BpeKind::SentencePiece && ty == TokenType::UserDefined) {
        p.clear();
        for (size_t k = 0; k < t.size();) {
          if (t.compare(k, 3, utf8::kMetaspace) == 0) {
            p += ' ';
            k += 3;
          } else {
            p += t[k++];
          }
        }
      }
      continue;
    }
    if (s.kind == BpeKind::ByteLevel) {
      bool in_alphabet = true;
      for (size_t k = 0; k < t.size() && in_alphabet;) {
        const int b = utf8::char_byte(utf8::next_code_point(t, k));
        if (b < 0) {
          in_alphabet = false;
        } else {
          p += char(b);
        }
      }
      if (!in_alphabet) p = t;  // not a byte-level spelling: the text itself
    } else {
      unsigned v = 0;
      if (ty == TokenType::Byte && t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X>", &v) == 1) {
        p.assign(1, char(v));
        continue;
      }
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, 3, utf8::kMetaspace) == 0) {
          p += ' ';
          k += 3;
        } else {
          p += t[k++];
        }
      }
    }
  }

  if (s.kind == BpeKind::SentencePiece) {
    for (size_t i = 0; i < n; ++i) {
      const std::string& t = s.text[i];
      if (t.empty() || !utf8::is_valid(t)) continue;
      size_t k = 0;
      const uint32_t cp = utf8::next_code_point(t, k);
      if (k == t.size()) s.char_ids.try_emplace(cp, int32_t(i));
    }
  }

  s.eog.clear();
  if (s.eos >= 0) s.eog.push_back(s.eos);
  for (int32_t id : s.extra_eog) {
    if (id >= 0 && size_t(id) < n) s.eog.push_back(id);
  }
  for (std::string_view t : kEogTexts) {
    auto it = s.ids.find(t);
    if (it != s.ids.end() && s.type[size_t(it->second)] == TokenType::Control)
      s.eog.push_back(it->second);
  }
  std::sort(s.eog.begin(), s.eog.end());
  s.eog.erase(std::unique(s.eog.begin(), s.eog.end()), s.eog.end());

  return Tokenizer(std::make_shared<const TokenizerState>(std::move(st)));
}

}  // namespace kvant
