// Tokenizer::from_gguf: reads llama.cpp's tokenizer.* metadata keys.
//
// A SentencePiece-style ("llama") vocabulary in GGUF has scores but no
// merges. The merges are derived the way Hugging Face derives them when it
// converts such a vocabulary (generate_merges): every split (l, r) of a token
// t, at a code point boundary, with l and r both tokens, is a merge; merges
// are ordered by t's score, best first, then by longer l, then longer r, then
// file order. For Gemma the order of the tokens in the file is the sort key
// instead of the score (its control and user-defined tokens carry -1000 but
// merge first), which is how transformers converts Gemma GGUF files. (Only
// runs of 32 or more spaces depend on how the user-defined whitespace pieces
// are ordered among themselves; tools/fixtures/gen_tokenizer.py says more.)
#include <algorithm>

#include "tokenizer/tokenizer_state.h"
#include "tokenizer/utf8.h"

namespace kvant {
namespace {

bool only_spaces(const std::string& t) {
  return !t.empty() && t.find_first_not_of(' ') == std::string::npos;
}

struct Candidate {
  float score;
  int32_t len_l, len_r;  // in code points
  int32_t left, right, result;
};

void derive_merges(TokenizerState& s, const std::vector<double>* scores, bool by_position) {
  std::vector<Candidate> all;
  all.reserve(s.text.size() * 2);
  std::vector<Candidate> local;
  for (size_t m = 0; m < s.text.size(); ++m) {
    const std::string& t = s.text[m];
    if (!utf8::is_valid(t)) continue;
    const float score = by_position || !scores ? -float(m) : float((*scores)[m]);
    const int32_t n_cp = int32_t(utf8::count_code_points(t));
    local.clear();
    size_t k = 0;
    int32_t cp = 0;
    utf8::next_code_point(t, k);
    ++cp;
    while (k < t.size()) {
      auto l = s.ids.find(std::string_view(t).substr(0, k));
      auto r = s.ids.find(std::string_view(t).substr(k));
      if (l != s.ids.end() && r != s.ids.end())
        local.push_back({score, cp, n_cp - cp, l->second, r->second, int32_t(m)});
      utf8::next_code_point(t, k);
      ++cp;
    }
    std::sort(local.begin(), local.end(), [](const Candidate& a, const Candidate& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
    all.insert(all.end(), local.begin(), local.end());
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    return a.len_r > b.len_r;
  });
  s.merges.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i)
    s.merges.add(all[i].left, all[i].right, uint32_t(i), all[i].result);
}

Result<void> read_merges(const GgufFile& f, TokenizerState& s, const std::string& what) {
  const auto* merges = f.get_strings("tokenizer.ggml.merges");
  if (!merges) return make_error(what + ": byte-level vocabulary without tokenizer.ggml.merges");
  s.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& m = (*merges)[i];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos)
      return make_error(what + ": tokenizer.ggml.merges[" + std::to_string(i) + "] '" + m +
                        "' is not two tokens separated by a space");
    auto l = s.ids.find(std::string_view(m).substr(0, sp));
    auto r = s.ids.find(std::string_view(m).substr(sp + 1));
    auto res = s.ids.find(m.substr(0, sp) + m.substr(sp + 1));
    if (l == s.ids.end() || r == s.ids.end() || res == s.ids.end())
      return make_error(what + ": tokenizer.ggml.merges[" + std::to_string(i) + "] '" + m +
                        "' names a token that is not in the vocabulary");
    s.merges.add(l->second, r->second, uint32_t(i), res->second);
  }
  return {};
}

int32_t read_id(const GgufFile& f, const std::string& key) {
  const auto v = f.get_int(key);
  return v && *v >= 0 && *v <= INT32_MAX ? int32_t(*v) : -1;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  const std::string what = f.path() + ": tokenizer";
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return make_error(what + ": missing tokenizer.ggml.model");
  TokenizerState s;
  s.model_kind = *model;
  if (*model == "gpt2") {
    s.kind = BpeKind::ByteLevel;
  } else if (*model == "llama") {
    s.kind = BpeKind::SentencePiece;
  } else {
    return make_error(what + ": unsupported tokenizer.ggml.model '" + *model +
                      "' (supported: gpt2, llama)");
  }
  const auto* tokens = f.get_strings("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) return make_error(what + ": missing tokenizer.ggml.tokens");
  if (tokens->size() > size_t(INT32_MAX)) return make_error(what + ": vocabulary too large");
  s.text = *tokens;
  const size_t n = s.text.size();

  s.type.assign(n, TokenType::Normal);
  if (const auto* types = f.get_numbers("tokenizer.ggml.token_type")) {
    if (types->size() != n)
      return make_error(what + ": tokenizer.ggml.token_type has " + std::to_string(types->size()) +
                        " entries for " + std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i) {
      const double t = (*types)[i];
      if (t < 0 || t > 6 || t != double(int(t)))
        return make_error(what + ": tokenizer.ggml.token_type[" + std::to_string(i) +
                          "] = " + std::to_string(t) + " is not a token type (0..6)");
      s.type[i] = TokenType(int(t));
    }
  }

  // llama.cpp stores SentencePiece user-defined runs of spaces with real
  // spaces; tokenizer.json spells them with U+2581, as encoding sees them.
  if (s.kind == BpeKind::SentencePiece) {
    for (size_t i = 0; i < n; ++i) {
      if (s.type[i] != TokenType::UserDefined || !only_spaces(s.text[i])) continue;
      std::string respelled;
      for (size_t k = 0; k < s.text[i].size(); ++k) respelled.append(utf8::kMetaspace);
      s.text[i] = std::move(respelled);
    }
  }
  s.ids.reserve(n);
  for (size_t i = 0; i < n; ++i)
    s.ids.insert_or_assign(s.text[i], int32_t(i));  // last wins, as HF's dict

  s.bos = read_id(f, "tokenizer.ggml.bos_token_id");
  s.eos = read_id(f, "tokenizer.ggml.eos_token_id");
  s.unk = read_id(f, "tokenizer.ggml.unknown_token_id");
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (const int32_t id = read_id(f, key); id >= 0) s.extra_eog.push_back(id);
  }
  const bool spm = s.kind == BpeKind::SentencePiece;
  s.adds_bos = f.get_int("tokenizer.ggml.add_bos_token").value_or(spm ? 1 : 0) != 0;
  s.add_space_prefix = spm && f.get_int("tokenizer.ggml.add_space_prefix").value_or(1) != 0;
  s.chat_template = f.get_string("tokenizer.chat_template").value_or("");

  if (spm) {
    const std::string arch = f.get_string("general.architecture").value_or("");
    const auto* scores = f.get_numbers("tokenizer.ggml.scores");
    if (scores && scores->size() != n)
      return make_error(what + ": tokenizer.ggml.scores has " + std::to_string(scores->size()) +
                        " entries for " + std::to_string(n) + " tokens");
    derive_merges(s, scores, arch.rfind("gemma", 0) == 0);
    s.bpe_unk = s.unk >= 0;
    s.byte_fallback = true;
    s.fuse_unk = true;
  } else {
    if (auto r = read_merges(f, s, what); !r) return r.error();
    const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
    auto pt = PreTokenizer::for_gguf_pre(pre);
    if (!pt) return make_error(what + ": " + pt.error().message);
    s.pre = std::move(pt.value());
    s.ignore_merges = pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe";
  }

  for (size_t i = 0; i < n; ++i) {
    if (s.type[i] == TokenType::Control || s.type[i] == TokenType::UserDefined)
      s.added.add(s.text[i], int32_t(i), s.type[i] == TokenType::Control);
  }
  return TokenizerBuilder::build(std::move(s), what);
}

}  // namespace kvant
