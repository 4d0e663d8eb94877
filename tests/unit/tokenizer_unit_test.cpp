// Model-free tokenizer tests: UTF-8 repair, the added-token matcher, the BPE
// merge loop, and the pre-tokenizer regexes against HF's splits for the
// Llama 3, Qwen2 and GPT-2 families (tests/fixtures/tokenizer/pretok_*.jsonl).
#include <gtest/gtest.h>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace kvant {
namespace {

std::string lossy(std::string_view s) { return utf8::to_valid(s); }
const std::string kFffd(utf8::kReplacement);

TEST(TokenizerUtf8, LossyRepairUsesMaximalSubparts) {
  EXPECT_EQ(lossy("plain ascii"), "plain ascii");
  EXPECT_EQ(lossy("\xE4\xB8\xAD\xE6\x96\x87"), "\xE4\xB8\xAD\xE6\x96\x87");  // 中文
  EXPECT_EQ(lossy("\xE4\xB8"
                  "a"),
            kFffd + "a");                                   // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // a surrogate: three
  EXPECT_EQ(lossy("\xC0\xAF"), kFffd + kFffd);              // overlong
  EXPECT_EQ(lossy("\xF0\x9F\x98"), kFffd);                  // truncated emoji at the end
  EXPECT_EQ(lossy("\x80x\xFF"), kFffd + "x" + kFffd);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
}

TEST(TokenizerUtf8, IncompleteTailIsHeldBackUntilFinal) {
  std::string out;
  EXPECT_EQ(utf8::append_lossy("ab\xF0\x9F", out, false), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8::append_lossy("\xF0\x9F\x98\x80", out, false), 4u);
  EXPECT_EQ(out, "\xF0\x9F\x98\x80");
  out.clear();
  // A byte that can never continue the sequence is replaced at once.
  EXPECT_EQ(utf8::append_lossy("\xF0"
                               "a",
                               out, false),
            2u);
  EXPECT_EQ(out, kFffd + "a");
}

TEST(TokenizerUtf8, ByteAlphabetIsGpt2s) {
  EXPECT_EQ(utf8::byte_char('a'), uint32_t('a'));
  EXPECT_EQ(utf8::byte_char(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(utf8::byte_char('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(utf8::byte_char(0xAD), 0x143u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(utf8::char_byte(utf8::byte_char(uint8_t(b))), b);
  EXPECT_EQ(utf8::char_byte(0x2581), -1);
}

TEST(TokenizerAddedTokens, LeftmostLongestAndSpecialSwitch) {
  AddedTokenMatcher m;
  m.add("<a>", 1, true);
  m.add("<ab>", 2, true);
  m.add("<a", 3, false);
  m.add("\n", 4, false);
  m.add("\n\n", 5, false);
  auto r = m.find("x<ab>y", 0, true);
  EXPECT_EQ(r.id, 2);
  EXPECT_EQ(r.begin, 1u);
  EXPECT_EQ(r.end, 5u);
  EXPECT_EQ(m.find("x<ab>y", 0, false).id, 3);  // only the user-defined "<a"
  EXPECT_EQ(m.find("a\n\n\nb", 0, true).id, 5);
  EXPECT_EQ(m.find("a\n\n\nb", 3, true).id, 4);
  EXPECT_EQ(m.find("nothing", 0, true).id, -1);
}

TEST(TokenizerBpe, MergesByRankThenLeftmost) {
  // ids: a=0 b=1 c=2 ab=3 bc=4 abc=5
  MergeTable t;
  t.add(1, 2, 0, 4);  // b c -> bc, rank 0
  t.add(0, 1, 1, 3);  // a b -> ab, rank 1
  t.add(0, 4, 2, 5);  // a bc -> abc
  BpeScratch s;
  std::vector<int32_t> out;
  bpe_merge({0, 1, 2}, t, s, out);
  EXPECT_EQ(out, (std::vector<int32_t>{5}));
  out.clear();
  bpe_merge({0, 1, 0, 1}, t, s, out);  // equal ranks: leftmost first
  EXPECT_EQ(out, (std::vector<int32_t>{3, 3}));
  out.clear();
  bpe_merge({2, 2}, t, s, out);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 2}));
}

TEST(TokenizerPreTokenizer, WhitespaceClassesAreRewritten) {
  const std::string r = rewrite_whitespace_classes(R"(\s+(?!\S)|[^\s\p{L}]|\\s)");
  EXPECT_EQ(r.find("\\s"), r.rfind("\\s"));  // only the escaped-backslash one is left
  EXPECT_NE(r.find("[^\\t\\n"), std::string::npos);
  EXPECT_NE(r.find("\\x{3000}"), std::string::npos);
}

TEST(TokenizerPreTokenizer, RejectsBadRegexWithItsText) {
  auto p = PreTokenizer::from_patterns({"(unclosed"});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("(unclosed"), std::string::npos);
  EXPECT_FALSE(PreTokenizer::for_gguf_pre("no-such-family").ok());
}

void check_pretok(const char* family, std::string_view pattern) {
  auto pt = PreTokenizer::from_patterns({std::string(pattern)});
  ASSERT_TRUE(pt.ok()) << pt.error().message;
  const auto recs = testing::read_jsonl(
      testing::fixture_path(std::string("tokenizer/pretok_") + family + ".jsonl"));
  ASSERT_GT(recs.size(), 300u);
  size_t bad = 0;
  std::vector<std::string_view> pieces;
  for (const auto& r : recs) {
    const std::string text = r["text"].get<std::string>();
    pieces.clear();
    pt->split(text, pieces);
    const auto want = r["pieces"].get<std::vector<std::string>>();
    const std::vector<std::string> got(pieces.begin(), pieces.end());
    if (got != want && ++bad <= 5)
      ADD_FAILURE() << family << ": " << nlohmann::json(text).dump() << "\n want "
                    << nlohmann::json(want).dump() << "\n got  " << nlohmann::json(got).dump();
  }
  EXPECT_EQ(bad, 0u) << family << " of " << recs.size();
}

TEST(TokenizerPreTokenizer, Llama3MatchesHf) { check_pretok("llama3", kLlama3Split); }
TEST(TokenizerPreTokenizer, Qwen2MatchesHf) { check_pretok("qwen2", kQwen2Split); }
TEST(TokenizerPreTokenizer, Gpt2MatchesHf) { check_pretok("gpt2", kGpt2Split); }

TEST(TokenizerPreTokenizer, LongWhitespaceRunDoesNotOverflowTheJitStack) {
  auto pt = PreTokenizer::from_patterns({std::string(kLlama3Split)});
  ASSERT_TRUE(pt.ok());
  const std::string text = "a" + std::string(1 << 20, ' ') + "b";
  std::vector<std::string_view> pieces;
  pt->split(text, pieces);
  size_t total = 0;
  for (auto p : pieces) total += p.size();
  EXPECT_EQ(total, text.size());
  EXPECT_EQ(pieces.back(), " b");
}

}  // namespace
}  // namespace kvant
