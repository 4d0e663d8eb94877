// Forced tool calls (grammar/output_grammar.h) against their parsers
// (tokenizer/chat_output.h): for every tool-call format, random walks
// through the constraint over SmolLM2's vocabulary end in text that the
// format's parser reads back as tool calls naming a declared function with
// arguments that fit its parameters, and nothing else.
#include <gtest/gtest.h>

#include <random>

#include "grammar/output_grammar.h"
#include "tokenizer/chat_output.h"
#include "tokenizer_test_util.h"

namespace kvant::grammar {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& tools() {
  static const ojson t = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
  return t;
}

// One walk: random logits, a strong pull towards ending once allowed.
std::string walk(const CompiledConstraint& cc, const Tokenizer& tok, std::mt19937& rng, bool* ended) {
  auto c = cc.start();
  EXPECT_TRUE(c.ok());
  // Noise drawn once; each step reads it from a random offset.
  static std::vector<float> noise = [&] {
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<float> v(size_t(tok.vocab_size()) * 4);
    for (auto& x : v) x = n(rng);
    return v;
  }();
  std::vector<int32_t> out;
  *ended = false;
  for (int step = 0; step < 400 && c.ok(); ++step) {
    const size_t off = rng() % (noise.size() - size_t(tok.vocab_size()));
    std::vector<float> logits(noise.begin() + long(off), noise.begin() + long(off) + tok.vocab_size());
    for (int32_t e : tok.eog_ids()) logits[size_t(e)] += 50.f;
    EXPECT_TRUE((*c)->mask(logits).ok());
    const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_TRUE((*c)->accept(t).ok());
    if (tok.is_eog(t)) {
      *ended = true;
      break;
    }
    out.push_back(t);
  }
  return tok.decode(out);
}

void check_calls(const ChatOutput& o, const std::string& only, const std::string& text) {
  ASSERT_FALSE(o.tool_calls.empty()) << text;
  EXPECT_EQ(o.content, "") << text;
  for (const ToolCall& call : o.tool_calls) {
    const ojson args = ojson::parse(call.arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << call.arguments;
    if (!only.empty()) {
      EXPECT_EQ(call.name, only);
    }
    if (call.name == "get_weather") {
      ASSERT_TRUE(args.contains("city") && args.contains("days")) << call.arguments;
      EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << call.arguments;
      ASSERT_TRUE(args["days"].is_number_integer()) << call.arguments;
      EXPECT_GE(args["days"].get<int>(), 1);
      EXPECT_LE(args["days"].get<int>(), 7);
    } else {
      EXPECT_EQ(call.name, "add");
      EXPECT_TRUE(args["a"].is_number_integer() && args["b"].is_number_integer()) << call.arguments;
    }
  }
}

TEST(GrammarTools, ForcedCallsParseBackInEveryFormat) {
  std::string why;
  const Tokenizer* tok = testing::gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf", &why);
  if (!tok) GTEST_SKIP() << why;
  auto vocab = VocabIndex::build(*tok);
  const ToolFormat formats[] = {ToolFormat::Hermes,      ToolFormat::Qwen3Coder, ToolFormat::Llama3,
                                ToolFormat::DeepSeekV3,  ToolFormat::DeepSeekV31, ToolFormat::KimiK2,
                                ToolFormat::Glm45};
  std::mt19937 rng(5);
  for (ToolFormat f : formats) {
    for (const std::string only : {"", "add"}) {
      OutputSpec spec;
      spec.kind = OutputSpec::Kind::ToolCalls;
      spec.tools = tools();
      spec.function = only;
      spec.format = f;
      auto cc = compile_output(spec, vocab);
      ASSERT_TRUE(cc.ok()) << tool_format_name(f) << ": " << cc.error().message;
      ChatOutputOptions po;
      po.tools = f;
      po.tool_schemas = tools();
      int ended = 0;
      for (int w = 0; w < 6; ++w) {
        bool done = false;
        const std::string text = walk(**cc, *tok, rng, &done);
        if (!done) continue;
        ++ended;
        SCOPED_TRACE(std::string(tool_format_name(f)) + ": " + text);
        check_calls(parse_chat_output(text, po), only, text);
      }
      EXPECT_GE(ended, 4) << tool_format_name(f);

    }
  }
}

TEST(GrammarTools, ReasoningComesFirstForThinkingModels) {
  std::string why;
  const Tokenizer* tok = testing::gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf", &why);
  if (!tok) GTEST_SKIP() << why;
  OutputSpec spec;
  spec.kind = OutputSpec::Kind::JsonObject;
  spec.reasoning = ReasoningFormat::ThinkTags;
  spec.starts_in_reasoning = true;
  auto cc = compile_output(spec, VocabIndex::build(*tok));
  ASSERT_TRUE(cc.ok());
  EXPECT_TRUE((*cc)->accepts("Let me think.</think>\n{\"a\": 1}"));
  EXPECT_FALSE((*cc)->accepts("{\"a\": 1}")) << "the open reasoning must close first";
  spec.starts_in_reasoning = false;
  auto free = compile_output(spec, VocabIndex::build(*tok));
  ASSERT_TRUE(free.ok());
  EXPECT_TRUE((*free)->accepts("{\"a\": 1}"));
  EXPECT_TRUE((*free)->accepts("<think>hmm</think>\n\n{}"));
  EXPECT_FALSE((*free)->accepts("hmm {}"));
}

}  // namespace
}  // namespace kvant::grammar
