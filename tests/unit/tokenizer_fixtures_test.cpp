// Token ids against Hugging Face `tokenizers` for the two real vocabularies
// (tests/fixtures/tokenizer/{smollm2,gemma3}.jsonl, written by
// tools/fixtures/gen_tokenizer.py), plus decode round trips and the stream
// decoder on the same strings. Skips when the GGUF files are not under
// KVANT_MODELS; the reference tokenizer.json files exported beside them
// (models/tokenizers/) check from_hf_json on the same fixtures.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace kvant {
namespace {

using testing::fixture_path;
using testing::ids_str;
using testing::read_jsonl;

struct Outcome {
  size_t checked = 0, mismatched = 0;
};

std::string fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t id : ids) {
    for (int k = 0; k < 4; ++k) {
      h ^= (uint32_t(id) >> (8 * k)) & 0xFF;
      h *= 0x100000001B3ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Outcome check_fixtures(const Tokenizer& tok, const std::string& fixture, const std::string& label) {
  Outcome o;
  for (const auto& rec : read_jsonl(fixture_path(fixture))) {
    if (rec.contains("file")) {  // the whole of a data file, compared by count and hash
      const std::string path = testing::shared_data_path(rec["file"].get<std::string>());
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        std::printf("[%s] %s not found; whole-file check skipped\n", label.c_str(), path.c_str());
        continue;
      }
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok.encode(text, false);
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("[%s] %s: %zu bytes -> %zu ids in %.3f s\n", label.c_str(),
                  rec["file"].get<std::string>().c_str(), text.size(), ids.size(), sec);
      ++o.checked;
      EXPECT_EQ(ids.size(), rec["count"].get<size_t>()) << label << " whole file";
      EXPECT_EQ(fnv1a64(ids), rec["fnv1a64"].get<std::string>()) << label << " whole file";
      if (ids.size() != rec["count"].get<size_t>() ||
          fnv1a64(ids) != rec["fnv1a64"].get<std::string>())
        ++o.mismatched;
      continue;
    }
    const std::string text = rec["text"].get<std::string>();
    const std::string mode = rec.value("mode", "");
    const auto want = rec["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, mode == "bos", mode != "nospecial");
    ++o.checked;
    if (got != want) {
      if (++o.mismatched <= 8) {
        ADD_FAILURE() << label << " mode '" << mode << "' text " << nlohmann::json(text).dump()
                      << "\n  want " << ids_str(want) << "\n  got  " << ids_str(got);
      }
    }
  }
  std::printf("[%s] %zu of %zu fixture records match\n", label.c_str(), o.checked - o.mismatched,
              o.checked);
  EXPECT_EQ(o.mismatched, 0u) << label;
  EXPECT_GT(o.checked, 2000u) << label;
  return o;
}

// decode(encode(s)) == s and the stream decoder agrees with decode().
void check_round_trips(const Tokenizer& tok, const std::string& fixture, bool metaspace_lossy,
                       const std::string& label) {
  // Byte-level: bytes without a symbol (SmolLM2 lacks 0x04, 0x13, ...) are dropped.
  bool known_byte[256];
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    utf8::append_code_point(utf8::byte_char(uint8_t(b)), spelled);
    known_byte[b] = tok.model_kind() != "gpt2" || tok.token_id(spelled).has_value();
  }
  size_t n = 0, bad_trip = 0, bad_stream = 0;
  for (const auto& rec : read_jsonl(fixture_path(fixture))) {
    if (!rec.contains("text") || rec.value("mode", "") != "") continue;
    const std::string text = rec["text"].get<std::string>();
    const auto ids = tok.encode(text, false);
    const std::string back = tok.decode(ids);
    // SentencePiece: a literal U+2581 in the input decodes as a space.
    bool lossy = metaspace_lossy && text.find(utf8::kMetaspace) != std::string::npos;
    for (char c : text) lossy = lossy || !known_byte[uint8_t(c)];
    if (!lossy && back != text && ++bad_trip <= 5)
      ADD_FAILURE() << label << " round trip of " << nlohmann::json(text).dump() << " gave "
                    << nlohmann::json(back).dump();
    StreamDecoder sd(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = sd.push(id);
      if (!utf8::is_valid(part)) ++bad_stream;
      streamed += part;
    }
    streamed += sd.finish();
    if (streamed != back && ++bad_stream <= 5)
      ADD_FAILURE() << label << " stream decode of " << nlohmann::json(text).dump() << " gave "
                    << nlohmann::json(streamed).dump();
    ++n;
  }
  EXPECT_EQ(bad_trip, 0u) << label;
  EXPECT_EQ(bad_stream, 0u) << label;
  EXPECT_GT(n, 2000u);
}

const Tokenizer* load_or_skip(const std::string& file) {
  std::string why;
  const Tokenizer* t = testing::gguf_tokenizer(file, &why);
  if (!t && std::filesystem::exists(testing::model_path(file))) ADD_FAILURE() << why;
  return t;
}

constexpr const char* kSmol = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kGemma = "gemma-3-270m-q4_k_m.gguf";

TEST(TokenizerSmolLM2, MatchesHfFixtures) {
  const Tokenizer* tok = load_or_skip(kSmol);
  if (!tok) GTEST_SKIP() << "model file not available";
  check_fixtures(*tok, "tokenizer/smollm2.jsonl", "smollm2 gguf");
}

TEST(TokenizerSmolLM2, RoundTripAndStream) {
  const Tokenizer* tok = load_or_skip(kSmol);
  if (!tok) GTEST_SKIP() << "model file not available";
  check_round_trips(*tok, "tokenizer/smollm2.jsonl", false, "smollm2");
}

TEST(TokenizerSmolLM2, Metadata) {
  const Tokenizer* tok = load_or_skip(kSmol);
  if (!tok) GTEST_SKIP() << "model file not available";
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_EQ(tok->model_kind(), "gpt2");
  EXPECT_EQ(tok->token_id("<|im_end|>"), 2);
  EXPECT_EQ(tok->token_text(2), "<|im_end|>");
  EXPECT_EQ(tok->eog_ids(), (std::vector<int32_t>{0, 2}));  // <|endoftext|>, <|im_end|>
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_NE(tok->chat_template().find("<|im_start|>"), std::string::npos);
  // add_bos is not honoured: SmolLM2 does not add BOS.
  EXPECT_EQ(tok->encode("Hi", true), tok->encode("Hi", false));
  EXPECT_EQ(tok->decode(tok->encode("<|im_start|>user", false), true), "user");
}

TEST(TokenizerGemma3, MatchesHfFixtures) {
  const Tokenizer* tok = load_or_skip(kGemma);
  if (!tok) GTEST_SKIP() << "model file not available";
  check_fixtures(*tok, "tokenizer/gemma3.jsonl", "gemma3 gguf");
}

TEST(TokenizerGemma3, RoundTripAndStream) {
  const Tokenizer* tok = load_or_skip(kGemma);
  if (!tok) GTEST_SKIP() << "model file not available";
  check_round_trips(*tok, "tokenizer/gemma3.jsonl", true, "gemma3");
}

TEST(TokenizerGemma3, Metadata) {
  const Tokenizer* tok = load_or_skip(kGemma);
  if (!tok) GTEST_SKIP() << "model file not available";
  EXPECT_EQ(tok->vocab_size(), 262144);
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_EQ(tok->model_kind(), "llama");
  EXPECT_EQ(tok->token_id("<end_of_turn>"), 106);
  EXPECT_TRUE(tok->is_eog(1));
  EXPECT_TRUE(tok->is_eog(106));
  EXPECT_FALSE(tok->is_eog(105));
  EXPECT_TRUE(tok->chat_template().empty());
  EXPECT_EQ(tok->encode("Hi", true).front(), 2);
  EXPECT_EQ(tok->token_piece(138), "  ");  // user-defined run of spaces
  EXPECT_EQ(tok->token_type(238), TokenType::Byte);
  EXPECT_EQ(tok->token_piece(238), std::string(1, '\0'));
}

// The same fixtures through the exported reference tokenizer.json files
// (written by gen_tokenizer.py into the git-ignored models/tokenizers/).
void check_exported(const std::string& name, bool metaspace_lossy) {
  const std::string path = testing::model_path("tokenizers/" + name + "/tokenizer.json");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not exported";
  auto tok = Tokenizer::from_hf_json(path);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  check_fixtures(*tok, "tokenizer/" + name + ".jsonl", name + " tokenizer.json");
  check_round_trips(*tok, "tokenizer/" + name + ".jsonl", metaspace_lossy,
                    name + " tokenizer.json");
}

TEST(TokenizerHfJson, SmolLM2Exported) {
  check_exported("smollm2", false);
  const std::string path = testing::model_path("tokenizers/smollm2/tokenizer.json");
  if (!std::filesystem::exists(path)) return;
  auto tok = Tokenizer::from_hf_json(path);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_NE(tok->chat_template().find("SmolLM"), std::string::npos);
}
TEST(TokenizerHfJson, Gemma3Exported) { check_exported("gemma3", true); }

}  // namespace
}  // namespace kvant
