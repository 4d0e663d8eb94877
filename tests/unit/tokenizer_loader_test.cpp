// Loading tests that need no model file: from_hf_json on the committed tiny
// tokenizer.json (ids from HF, tests/fixtures/tokenizer/hf_tiny), a
// SentencePiece-style vocabulary written as an in-memory GGUF, the stream
// decoder across split characters, and the errors malformed inputs give.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace kvant {
namespace {

using testing::fixture_path;
using testing::ids_str;

// ---------------------------------------------------------------- hf_tiny

Tokenizer tiny() {
  auto t = Tokenizer::from_hf_json(fixture_path("tokenizer/hf_tiny/tokenizer.json"));
  EXPECT_TRUE(t.ok()) << t.error().message;
  return std::move(t.value());
}

TEST(TokenizerHfJson, TinyMatchesHf) {
  const Tokenizer tok = tiny();
  size_t n = 0;
  for (const auto& r : testing::read_jsonl(fixture_path("tokenizer/hf_tiny/expected.jsonl"))) {
    const std::string text = r["text"].get<std::string>();
    const bool bos = r.value("mode", "") == "bos";
    EXPECT_EQ(ids_str(tok.encode(text, bos)), ids_str(r["ids"].get<std::vector<int32_t>>()))
        << nlohmann::json(text).dump();
    if (!bos) {
      EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
    }
    ++n;
  }
  EXPECT_GT(n, 50u);
}

TEST(TokenizerHfJson, TinyConfig) {
  const Tokenizer tok = tiny();
  EXPECT_TRUE(tok.adds_bos());
  EXPECT_EQ(tok.bos_id(), tok.token_id("<|begin_of_text|>"));
  EXPECT_EQ(tok.eos_id(), tok.token_id("<|eot_id|>"));
  EXPECT_TRUE(tok.is_eog(*tok.token_id("<|eot_id|>")));
  EXPECT_TRUE(tok.is_eog(*tok.token_id("<|end_of_text|>")));
  EXPECT_EQ(tok.model_kind(), "gpt2");
  EXPECT_EQ(tok.token_type(*tok.token_id("<think>")), TokenType::UserDefined);
  EXPECT_TRUE(tok.is_special(*tok.token_id("<|eot_id|>")));
  // parse_special=false: the special token is text, the user-defined one is not.
  const auto ids = tok.encode("<|eot_id|><think>", false, false);
  EXPECT_GT(ids.size(), 2u);
  EXPECT_EQ(ids.back(), tok.token_id("<think>"));
  EXPECT_EQ(tok.decode(ids), "<|eot_id|><think>");
}

TEST(TokenizerStream, HoldsBackSplitCharacters) {
  const Tokenizer tok = tiny();
  const std::string text = "naïve 中文 😀👨‍👩‍👧 ok";
  const auto ids = tok.encode(text, false);
  StreamDecoder sd(tok);
  std::string all;
  size_t held = 0;
  for (int32_t id : ids) {
    const std::string part = sd.push(id);
    EXPECT_TRUE(utf8::is_valid(part));
    held += part.empty();
    all += part;
  }
  all += sd.finish();
  EXPECT_EQ(all, text);
  EXPECT_GT(held, 0u);  // the tiny vocabulary splits the CJK and emoji bytes
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer tok = tiny();
  auto byte_token = [&](uint8_t b) {
    std::string s;
    utf8::append_code_point(utf8::byte_char(b), s);
    return *tok.token_id(s);
  };
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(byte_token(0xE4)), "");
  EXPECT_EQ(sd.push(byte_token(0xB8)), "");
  EXPECT_EQ(sd.push(byte_token('a')), std::string(utf8::kReplacement) + "a");
  EXPECT_EQ(sd.push(byte_token(0xF0)), "");
  EXPECT_EQ(sd.finish(), std::string(utf8::kReplacement));
  const std::vector<int32_t> ids{byte_token(0xE4), byte_token(0xB8), byte_token('a'),
                                 byte_token(0xF0)};
  EXPECT_EQ(tok.decode(ids),
            std::string(utf8::kReplacement) + "a" + std::string(utf8::kReplacement));
  EXPECT_EQ(sd.push(-5), "");  // out of range: nothing
}

// --------------------------------------------------------- HF JSON errors

std::string write_temp(const std::string& name, const std::string& content) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kvant_tok_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path) << content;
  return path.string();
}

TEST(TokenizerHfJson, ErrorsNameTheProblem) {
  auto missing = Tokenizer::from_hf_json("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent/tokenizer.json"), std::string::npos);

  auto bad = Tokenizer::from_hf_json(write_temp("bad.json", "{\"model\": {"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("invalid JSON"), std::string::npos);

  auto wp = Tokenizer::from_hf_json(
      write_temp("wp.json", R"({"model": {"type": "WordPiece", "vocab": {}}})"));
  ASSERT_FALSE(wp.ok());
  EXPECT_NE(wp.error().message.find("WordPiece"), std::string::npos);

  auto pre = Tokenizer::from_hf_json(
      write_temp("pre.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                      "pre_tokenizer": {"type": "Whitespace"}, "decoder": {"type": "ByteLevel"}})"));
  ASSERT_FALSE(pre.ok());
  EXPECT_NE(pre.error().message.find("Whitespace"), std::string::npos);

  auto merge = Tokenizer::from_hf_json(write_temp(
      "merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
                        "pre_tokenizer": {"type": "ByteLevel"}})"));
  ASSERT_FALSE(merge.ok());
  EXPECT_NE(merge.error().message.find("merges[0]"), std::string::npos);

  auto gap = Tokenizer::from_hf_json(
      write_temp("gap.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2}, "merges": []},
                      "pre_tokenizer": {"type": "ByteLevel"}})"));
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.error().message.find("id 1"), std::string::npos);
}

TEST(TokenizerHfJson, ChatTemplateFromJinjaFileBeside) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kvant_tok_jinja_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture_path("tokenizer/hf_tiny/tokenizer.json"),
                             dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "chat_template.jinja") << "{{ bos_token }}<|start_header_id|>";
  auto tok = Tokenizer::from_hf_json((dir / "tokenizer.json").string());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->chat_template(), "{{ bos_token }}<|start_header_id|>");
  EXPECT_TRUE(tok->adds_bos());  // from the post-processor, no tokenizer_config.json here
  EXPECT_EQ(tok->eos_id(), -1);
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------- in-memory GGUF

// Writes a GGUF v3 image with metadata only (no tensors).
class GgufWriter {
 public:
  void str(const std::string& key, const std::string& v) {
    head(key, 8);
    string(v);
  }
  void u32(const std::string& key, uint32_t v) {
    head(key, 4);
    raw(v);
  }
  void boolean(const std::string& key, bool v) {
    head(key, 7);
    raw(uint8_t(v));
  }
  void strs(const std::string& key, const std::vector<std::string>& v) {
    head(key, 9);
    raw(uint32_t(8));
    raw(uint64_t(v.size()));
    for (const auto& s : v) string(s);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    head(key, 9);
    raw(uint32_t(5));
    raw(uint64_t(v.size()));
    for (int32_t x : v) raw(x);
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    head(key, 9);
    raw(uint32_t(6));
    raw(uint64_t(v.size()));
    for (float x : v) raw(x);
  }
  std::vector<uint8_t> image() const {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    const uint32_t magic = 0x46554747, version = 3;
    const uint64_t n_tensors = 0, n_kv = count_;
    put(&magic, 4);
    put(&version, 4);
    put(&n_tensors, 8);
    put(&n_kv, 8);
    out.insert(out.end(), body_.begin(), body_.end());
    while (out.size() % 32) out.push_back(0);
    return out;
  }

 private:
  template <class T>
  void raw(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    body_.insert(body_.end(), b, b + sizeof(T));
  }
  void string(const std::string& s) {
    raw(uint64_t(s.size()));
    body_.insert(body_.end(), s.begin(), s.end());
  }
  void head(const std::string& key, uint32_t type) {
    string(key);
    raw(type);
    ++count_;
  }
  std::vector<uint8_t> body_;
  uint64_t count_ = 0;
};

// A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens,
// then pieces with descending scores, then a user-defined run of spaces.
struct SpmVocab {
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types{2, 3, 3};
  std::vector<float> scores{0, 0, 0};
  SpmVocab() {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      tokens.push_back(buf);
      types.push_back(6);
      scores.push_back(0);
    }
    const char* pieces[] = {"\xE2\x96\x81",
                            "a",
                            "b",
                            "c",
                            "\xE2\x96\x81"
                            "a",
                            "ab",
                            "bc",
                            "\xE2\x96\x81"
                            "ab",
                            "abc"};
    float score = 0;
    for (const char* p : pieces) {
      tokens.push_back(p);
      types.push_back(1);
      scores.push_back(score--);
    }
    tokens.push_back("   ");  // three spaces, as llama.cpp writes a user-defined "▁▁▁"
    types.push_back(4);
    scores.push_back(-1000);
  }
  int32_t id(const std::string& t) const {
    return int32_t(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
  }
};

Result<Tokenizer> spm_tokenizer(const SpmVocab& v, bool space_prefix,
                                std::vector<uint8_t>& storage) {
  GgufWriter w;
  w.str("general.architecture", "llama");
  w.str("tokenizer.ggml.model", "llama");
  w.strs("tokenizer.ggml.tokens", v.tokens);
  w.i32s("tokenizer.ggml.token_type", v.types);
  w.f32s("tokenizer.ggml.scores", v.scores);
  w.u32("tokenizer.ggml.bos_token_id", 1);
  w.u32("tokenizer.ggml.eos_token_id", 2);
  w.u32("tokenizer.ggml.unknown_token_id", 0);
  w.boolean("tokenizer.ggml.add_space_prefix", space_prefix);
  storage = w.image();
  auto g = GgufFile::parse(storage, "spm.gguf");
  if (!g) return g.error();
  return Tokenizer::from_gguf(*g);
}

TEST(TokenizerGguf, SentencePieceMergesByScoreAndFallsBackToBytes) {
  SpmVocab v;
  std::vector<uint8_t> img;
  auto tok = spm_tokenizer(v, false, img);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  // Scores: "▁a" (-4) merges before "ab" (-5); "▁ab" = (▁a, b).
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int32_t>{v.id("ab")}));
  EXPECT_EQ(tok->encode(" ab", false), (std::vector<int32_t>{v.id("\xE2\x96\x81"
                                                                  "ab")}));
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{v.id("abc")}));
  // Unknown characters fall back to their UTF-8 bytes.
  EXPECT_EQ(tok->encode("\xC3\xA9", false), (std::vector<int32_t>{3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("a \xC3\xA9 abc", false)), "a \xC3\xA9 abc");
  // The user-defined run of spaces is respelled "▁▁▁", so raw spaces are BPE
  // input (as in HF's tokenizer.json) while it still decodes as spaces.
  const int32_t run = v.id("   ");
  EXPECT_EQ(tok->token_text(run), "\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81");
  EXPECT_EQ(tok->token_piece(run), "   ");
  EXPECT_TRUE(tok->adds_bos());  // the default for SentencePiece vocabularies
  EXPECT_EQ(tok->encode("a", true).front(), 1);
  EXPECT_EQ(tok->eog_ids(), (std::vector<int32_t>{2}));
}

TEST(TokenizerGguf, SpacePrefixIsAddedAndStripped) {
  SpmVocab v;
  std::vector<uint8_t> img;
  auto tok = spm_tokenizer(v, true, img);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const auto ids = tok->encode("ab", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{v.id("\xE2\x96\x81"
                                            "ab")}));
  EXPECT_EQ(tok->decode(ids), "ab");
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(ids[0]) + sd.finish(), "ab");
}

TEST(TokenizerGguf, ErrorsNameTheField) {
  std::vector<uint8_t> img;
  {
    GgufWriter w;
    w.str("tokenizer.ggml.model", "bert");
    w.strs("tokenizer.ggml.tokens", {"a"});
    img = w.image();
    auto g = GgufFile::parse(img, "bert.gguf");
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto t = Tokenizer::from_gguf(*g);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("'bert'"), std::string::npos);
    EXPECT_NE(t.error().message.find("bert.gguf"), std::string::npos);
  }
  {
    GgufWriter w;
    w.str("tokenizer.ggml.model", "gpt2");
    w.strs("tokenizer.ggml.tokens", {"a", "b"});
    w.i32s("tokenizer.ggml.token_type", {1});
    img = w.image();
    auto g = GgufFile::parse(img, "types.gguf");
    ASSERT_TRUE(g.ok());
    auto t = Tokenizer::from_gguf(*g);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("token_type"), std::string::npos);
  }
  {
    GgufWriter w;
    w.str("tokenizer.ggml.model", "gpt2");
    w.strs("tokenizer.ggml.tokens", {"a", "b"});
    w.strs("tokenizer.ggml.merges", {"a c"});
    img = w.image();
    auto g = GgufFile::parse(img, "merges.gguf");
    ASSERT_TRUE(g.ok());
    auto t = Tokenizer::from_gguf(*g);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("merges[0]"), std::string::npos);
  }
  {
    GgufWriter w;
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", "mystery");
    w.strs("tokenizer.ggml.tokens", {"a"});
    w.strs("tokenizer.ggml.merges", {});
    img = w.image();
    auto g = GgufFile::parse(img, "pre.gguf");
    ASSERT_TRUE(g.ok());
    auto t = Tokenizer::from_gguf(*g);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("mystery"), std::string::npos);
  }
  {
    GgufWriter w;
    w.str("tokenizer.ggml.model", "gpt2");
    w.strs("tokenizer.ggml.tokens", {"a"});
    w.strs("tokenizer.ggml.merges", {});
    w.u32("tokenizer.ggml.eos_token_id", 7);
    img = w.image();
    auto g = GgufFile::parse(img, "eos.gguf");
    ASSERT_TRUE(g.ok());
    auto t = Tokenizer::from_gguf(*g);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("7"), std::string::npos);
  }
}

TEST(TokenizerGguf, InvalidUtf8InputIsRepairedFirst) {
  SpmVocab v;
  std::vector<uint8_t> img;
  auto tok = spm_tokenizer(v, false, img);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->decode(tok->encode("a\xFF"
                                    "b",
                                    false)),
            "a" + std::string(utf8::kReplacement) + "b");
}

}  // namespace
}  // namespace kvant
