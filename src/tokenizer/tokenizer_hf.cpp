// Tokenizer::from_hf_json: reads a Hugging Face tokenizer.json with a BPE
// model, and tokenizer_config.json beside it when present.
//
// Supported pipelines are the ones the target models ship:
//  - byte-level: pre_tokenizer ByteLevel(use_regex), Split(Regex, Isolated),
//    Digits, or a Sequence of those; decoder ByteLevel;
//  - SentencePiece-style: normalizer Replace(" " -> "▁") and/or Prepend("▁")
//    (or pre_tokenizer Metaspace without splitting), byte_fallback.
// Anything else fails with an error naming the unsupported component rather
// than tokenizing differently from the reference. Known gaps: an NFC/NFKC
// normalizer is accepted but not applied (text already in NFC, as almost all
// text is, tokenizes identically); a Prepend normalizer is applied at the
// start of the text only (HF prepends to every stretch between added tokens);
// every added token is matched in the raw text (its normalized,
// lstrip/rstrip and single_word flags are ignored). The chat template comes
// from tokenizer_config.json, or chat_template.jinja beside it.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/json_text.h"
#include "tokenizer/tokenizer_state.h"
#include "tokenizer/utf8.h"

namespace kvant {
namespace {

using Json = nlohmann::json;

struct HfPipeline {
  std::vector<std::string> patterns;  // byte-level splits, in order
  bool byte_level = false;
  bool metaspace = false;  // spaces become U+2581 (normalizer or pre-tokenizer)
  bool prepend = false;    // "▁" before the text
};

std::string str_at(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool bool_at(const Json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

std::string quote_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

Result<void> read_pre_tokenizer(const Json& j, HfPipeline& p) {
  if (j.is_null()) return {};
  const std::string type = str_at(j, "type");
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      return make_error("pre_tokenizer Sequence without a list");
    for (const Json& e : *it) KV_TRY(read_pre_tokenizer(e, p));
    return {};
  }
  if (type == "ByteLevel") {
    p.byte_level = true;
    if (bool_at(j, "add_prefix_space", false))
      return make_error("pre_tokenizer ByteLevel with add_prefix_space is not supported");
    if (bool_at(j, "use_regex", true)) p.patterns.emplace_back(kGpt2Split);
    return {};
  }
  if (type == "Split") {
    const Json& pat = j.value("pattern", Json::object());
    const std::string behavior = str_at(j, "behavior");
    const bool invert = bool_at(j, "invert", false);
    // Gemma's Split(" ", MergedWithPrevious) runs after spaces became "▁": a no-op.
    if (pat.contains("String") && pat["String"] == " " && p.metaspace) return {};
    if (behavior != "Isolated" || invert)
      return make_error("pre_tokenizer Split with behavior '" + behavior + "'" +
                        (invert ? " (inverted)" : "") + " is not supported");
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      p.patterns.push_back(pat["Regex"].get<std::string>());
    } else if (pat.contains("String") && pat["String"].is_string()) {
      p.patterns.push_back(quote_regex(pat["String"].get<std::string>()));
    } else {
      return make_error("pre_tokenizer Split without a pattern");
    }
    return {};
  }
  if (type == "Digits") {
    p.patterns.emplace_back(bool_at(j, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
    return {};
  }
  if (type == "Metaspace") {
    if (bool_at(j, "split", true))
      return make_error("pre_tokenizer Metaspace with split=true is not supported");
    p.metaspace = true;
    const std::string scheme = str_at(j, "prepend_scheme");
    p.prepend = scheme.empty() ? bool_at(j, "add_prefix_space", true) : scheme != "never";
    return {};
  }
  return make_error("pre_tokenizer '" + type + "' is not supported");
}

Result<void> read_normalizer(const Json& j, HfPipeline& p) {
  if (j.is_null()) return {};
  const std::string type = str_at(j, "type");
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return make_error("normalizer Sequence without a list");
    for (const Json& e : *it) KV_TRY(read_normalizer(e, p));
    return {};
  }
  if (type == "Replace") {
    const Json& pat = j.value("pattern", Json::object());
    if (pat.value("String", "") == " " && str_at(j, "content") == utf8::kMetaspace) {
      p.metaspace = true;
      return {};
    }
    return make_error("normalizer Replace other than ' ' -> '\u2581' is not supported");
  }
  if (type == "Prepend") {
    if (str_at(j, "prepend") != utf8::kMetaspace)
      return make_error("normalizer Prepend other than '\u2581' is not supported");
    p.prepend = true;
    return {};
  }
  if (type == "NFC" || type == "NFKC") return {};  // see the file comment
  return make_error("normalizer '" + type + "' is not supported");
}

// The BOS a TemplateProcessing post-processor puts first, if any.
std::string leading_special(const Json& j) {
  if (!j.is_object()) return {};
  const std::string type = str_at(j, "type");
  if (type == "Sequence" && j.contains("processors")) {
    for (const Json& e : j["processors"]) {
      if (auto s = leading_special(e); !s.empty()) return s;
    }
    return {};
  }
  if (type != "TemplateProcessing" || !j.contains("single") || !j["single"].is_array() ||
      j["single"].empty())
    return {};
  const Json& first = j["single"][0];
  if (first.contains("SpecialToken")) return str_at(first["SpecialToken"], "id");
  return {};
}

std::string token_content(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return str_at(*it, "content");
  return {};
}

// An error about the file `what`: its path, then the message.
Error file_error(const std::string& what, const std::string& m) {
  return make_error(what + ": " + m);
}

// Puts the vocabulary and the added tokens into s.text and s.type (an added
// token is Control when special, else UserDefined) and returns how many ids
// there are; the ids may leave no gaps.
Result<size_t> read_vocab(const Json& model, const Json& added, const std::string& what,
                          TokenizerState& s) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX)
      return file_error(what, "vocab entry '" + tok + "' has an invalid id");
    max_id = std::max(max_id, id.get<int64_t>());
  }
  for (const Json& a : added) {
    if (!a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() >= INT32_MAX || !a.contains("content") || !a["content"].is_string())
      return file_error(what, "an added_tokens entry lacks a valid id or content");
    max_id = std::max(max_id, a["id"].get<int64_t>());
  }
  const size_t n = size_t(max_id + 1);
  s.text.assign(n, std::string());
  s.type.assign(n, TokenType::Normal);
  std::vector<bool> seen(n, false);
  for (const auto& [tok, id] : model["vocab"].items()) {
    s.text[size_t(id.get<int64_t>())] = tok;
    seen[size_t(id.get<int64_t>())] = true;
  }
  for (const Json& a : added) {
    const size_t id = size_t(a["id"].get<int64_t>());
    s.text[id] = a["content"].get<std::string>();
    s.type[id] = bool_at(a, "special", false) ? TokenType::Control : TokenType::UserDefined;
    seen[id] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!seen[i]) return file_error(what, "no token has id " + std::to_string(i));
  }
  return n;
}

// Reads the normalizer, pre-tokenizer and decoder into s: a byte-level
// pipeline with its regex splits, or a SentencePiece-style one with its
// prefix space and <0xNN> byte tokens (over the n ids read_vocab filled).
Result<void> read_pipeline(const Json& root, const Json& model, size_t n, const std::string& what,
                           TokenizerState& s) {
  HfPipeline p;
  // The normalizer first: it decides whether a Split on " " still means anything.
  if (root.contains("normalizer")) {
    if (auto r = read_normalizer(root["normalizer"], p); !r)
      return file_error(what, r.error().message);
  }
  if (root.contains("pre_tokenizer")) {
    if (auto r = read_pre_tokenizer(root["pre_tokenizer"], p); !r)
      return file_error(what, r.error().message);
  }
  const std::string decoder = root.contains("decoder") && root["decoder"].is_object()
                                  ? str_at(root["decoder"], "type")
                                  : std::string();
  s.byte_fallback = bool_at(model, "byte_fallback", false);
  if (p.byte_level || decoder == "ByteLevel") {
    s.kind = BpeKind::ByteLevel;
    s.model_kind = "gpt2";
    if (p.metaspace)
      return file_error(what, "a byte-level pipeline with a '\u2581' normalizer is not supported");
    auto pt = PreTokenizer::from_patterns(p.patterns);
    if (!pt) return file_error(what, pt.error().message);
    s.pre = std::move(pt.value());
  } else if (p.metaspace || s.byte_fallback) {
    s.kind = BpeKind::SentencePiece;
    s.model_kind = "llama";
    if (!p.patterns.empty())
      return file_error(what, "regex splits in a SentencePiece-style pipeline are not supported");
    s.add_space_prefix = p.prepend;
    for (size_t i = 0; i < n; ++i) {
      const std::string& t = s.text[i];
      if (s.byte_fallback && s.type[i] == TokenType::Normal && t.size() == 6 &&
          t.rfind("<0x", 0) == 0 && t[5] == '>' && std::isxdigit(uint8_t(t[3])) &&
          std::isxdigit(uint8_t(t[4])))
        s.type[i] = TokenType::Byte;
    }
  } else {
    return file_error(what, "neither a byte-level nor a SentencePiece-style BPE pipeline");
  }
  return {};
}

// Fills s.merges from the model's merges, each "a b" or [a, b], ranked by
// position; every part and result must be in s.ids.
Result<void> read_merges(const Json& model, const std::string& what, TokenizerState& s) {
  const Json merges = model.value("merges", Json::array());
  s.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    std::string l, r;
    if (m.is_string()) {
      const std::string& ms = m.get_ref<const std::string&>();
      const size_t sp = ms.find(' ', 1);
      if (sp == std::string::npos)
        return file_error(what, "merges[" + std::to_string(i) + "] is not 'a b'");
      l = ms.substr(0, sp);
      r = ms.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      l = m[0].get<std::string>();
      r = m[1].get<std::string>();
    } else {
      return file_error(what, "merges[" + std::to_string(i) + "] is neither 'a b' nor [a, b]");
    }
    auto li = s.ids.find(l), ri = s.ids.find(r), res = s.ids.find(l + r);
    if (li == s.ids.end() || ri == s.ids.end() || res == s.ids.end())
      return file_error(what, "merges[" + std::to_string(i) + "] ('" + l + "', '" + r +
                                  "') uses a token not in the vocabulary");
    s.merges.add(li->second, ri->second, uint32_t(i), res->second);
  }
  return {};
}

// Reads tokenizer_config.json beside `path` when present (bos and eos tokens,
// add_bos_token, the chat template), then chat_template.jinja beside it when
// that gave no chat template.
Result<void> read_tokenizer_config(const std::string& path, TokenizerState& s) {
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    auto cfg = read_json_file(config_path.string());
    if (!cfg) return cfg.error();
    const Json& c = *cfg;
    if (!c.is_object()) return make_error(config_path.string() + ": not a JSON object");
    auto lookup = [&](const char* key, int32_t& out) -> Result<void> {
      const std::string t = token_content(c, key);
      if (t.empty()) return {};
      auto it = s.ids.find(t);
      if (it == s.ids.end())
        return make_error(config_path.string() + ": " + key + " '" + t +
                          "' is not in the vocabulary");
      out = it->second;
      return {};
    };
    KV_TRY(lookup("bos_token", s.bos));
    KV_TRY(lookup("eos_token", s.eos));
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean())
      s.adds_bos = c["add_bos_token"].get<bool>() && s.bos >= 0;
    if (c.contains("chat_template")) {
      const Json& t = c["chat_template"];
      if (t.is_string()) {
        s.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // [{name, template}, ...]: the default one
        for (const Json& e : t) {
          if (e.is_object() && str_at(e, "name") == "default")
            s.chat_template = str_at(e, "template");
        }
      }
    }
  }
  if (s.chat_template.empty()) {
    const auto jinja = std::filesystem::path(path).parent_path() / "chat_template.jinja";
    if (std::filesystem::exists(jinja)) {
      std::ifstream in(jinja, std::ios::binary);
      s.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  return {};
}

}  // namespace

Result<Tokenizer> Tokenizer::from_hf_json(const std::string& path) {
  auto parsed = read_json_file(path);
  if (!parsed) return parsed.error();
  const Json& root = *parsed;
  const std::string what = path;
  auto fail = [&](const std::string& m) { return make_error(what + ": " + m); };
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object())
    return fail("no \"model\" object");
  const Json& model = root["model"];
  if (const std::string t = str_at(model, "type"); !t.empty() && t != "BPE")
    return fail("model type '" + t + "' is not supported (only BPE)");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return fail("model has no vocab object");

  TokenizerState s;
  // Vocabulary and added tokens; ids may leave no gaps in the final table.
  const Json added = root.value("added_tokens", Json::array());
  auto vocab_size = read_vocab(model, added, what, s);
  if (!vocab_size) return vocab_size.error();
  const size_t n = *vocab_size;

  KV_TRY(read_pipeline(root, model, n, what, s));
  s.fuse_unk = bool_at(model, "fuse_unk", false);
  s.ignore_merges = bool_at(model, "ignore_merges", false);

  s.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) s.ids.insert_or_assign(s.text[i], int32_t(i));
  // The model's own vocabulary wins over an added token of the same spelling.
  for (const auto& [tok, id] : model["vocab"].items())
    s.ids.insert_or_assign(tok, int32_t(id.get<int64_t>()));

  if (const std::string unk = str_at(model, "unk_token"); !unk.empty()) {
    auto it = s.ids.find(unk);
    if (it == s.ids.end()) return fail("unk_token '" + unk + "' is not in the vocabulary");
    s.unk = it->second;
    s.bpe_unk = true;
  }

  KV_TRY(read_merges(model, what, s));

  for (const Json& a : added) {
    const int32_t id = int32_t(a["id"].get<int64_t>());
    s.added.add(a["content"].get_ref<const std::string&>(), id,
                s.type[size_t(id)] == TokenType::Control);
  }

  if (const std::string bos = leading_special(root.value("post_processor", Json())); !bos.empty()) {
    if (auto it = s.ids.find(bos); it != s.ids.end()) {
      s.bos = it->second;
      s.adds_bos = true;
    }
  }

  KV_TRY(read_tokenizer_config(path, s));
  return TokenizerBuilder::build(std::move(s), what);
}

}  // namespace kvant
