// Chat rendering against the real Jinja templates (tests/fixtures/chat/
// chat.json, from tools/fixtures/gen_chat.py): byte-identical output for 20
// conversations with and without the generation prompt, the same errors
// where a template raises, and detection of each template's format.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace kvant {
namespace {

nlohmann::json load_fixture() {
  std::ifstream in(testing::fixture_path("chat/chat.json"));
  return nlohmann::json::parse(in);
}

TEST(ChatTemplate, MatchesJinjaRenderings) {
  const nlohmann::json fx = load_fixture();
  std::vector<std::vector<ChatMessage>> convs;
  for (const auto& c : fx["conversations"]) {
    std::vector<ChatMessage> msgs;
    for (const auto& m : c)
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    convs.push_back(std::move(msgs));
  }
  ASSERT_GE(convs.size(), 20u);
  size_t checked = 0;
  for (const auto& [name, t] : fx["templates"].items()) {
    auto format =
        detect_chat_format(t["template"].get<std::string>(), t["arch"].get<std::string>());
    ASSERT_TRUE(format.ok()) << name << ": " << format.error().message;
    EXPECT_EQ(chat_format_name(*format), t["format"].get<std::string>()) << name;
    const std::string bos = t["bos"].get<std::string>();
    for (const auto& r : t["renders"]) {
      const auto& msgs = convs[r["conversation"].get<size_t>()];
      const bool gen = r["add_generation_prompt"].get<bool>();
      auto got = render_chat(*format, msgs, gen, bos);
      ++checked;
      if (r.contains("error")) {
        EXPECT_FALSE(got.ok()) << name << " conversation " << r["conversation"] << " should fail";
        if (!got.ok()) {
          EXPECT_NE(got.error().message.find("alternate"), std::string::npos)
              << got.error().message;
        }
        continue;
      }
      ASSERT_TRUE(got.ok()) << name << " conversation " << r["conversation"] << ": "
                            << got.error().message;
      EXPECT_EQ(*got, r["text"].get<std::string>())
          << name << " conversation " << r["conversation"] << " gen " << gen;
    }
  }
  EXPECT_EQ(checked, 5u * 40u);
}

TEST(ChatTemplate, DetectionFromArchitectureAndErrors) {
  EXPECT_EQ(detect_chat_format("", "gemma3").value(), ChatFormat::Gemma);
  auto none = detect_chat_format("", "llama");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("'llama'"), std::string::npos);
  auto unknown = detect_chat_format(
      "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}", "llama");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("[INST]"), std::string::npos);
  auto llama31 = detect_chat_format(
      "{{- bos_token }}<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
      "December "
      "2023<|eot_id|>",
      "llama");
  ASSERT_FALSE(llama31.ok());
  EXPECT_NE(llama31.error().message.find("3.1"), std::string::npos);
  EXPECT_EQ(detect_chat_format("...You are Qwen, created by Alibaba Cloud...<|im_start|>", "qwen2")
                .value(),
            ChatFormat::Qwen25);
}

TEST(ChatTemplate, NamesRoundTrip) {
  for (ChatFormat f : {ChatFormat::Chatml, ChatFormat::Smollm2, ChatFormat::Qwen2,
                       ChatFormat::Qwen25, ChatFormat::Gemma, ChatFormat::Llama3}) {
    auto back = chat_format_from_name(chat_format_name(f));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, f);
  }
  auto bad = chat_format_from_name("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("vicuna"), std::string::npos);
  EXPECT_TRUE(chat_format_writes_bos(ChatFormat::Gemma));
  EXPECT_FALSE(chat_format_writes_bos(ChatFormat::Smollm2));
}

TEST(ChatTemplate, Qwen25DefaultSystemPrompt) {
  const std::vector<ChatMessage> msgs{{"user", "Hi"}};
  EXPECT_EQ(render_chat(ChatFormat::Qwen25, msgs, true, "").value(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(render_chat(ChatFormat::Chatml, {}, true, "").ok());
}

// The rendered SmolLM2 prompt tokenizes with its control tokens intact.
TEST(ChatTemplate, SmolLM2PromptTokenizes) {
  std::string why;
  const Tokenizer* tok = testing::gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf", &why);
  if (!tok) GTEST_SKIP() << why;
  auto format = detect_chat_format(tok->chat_template(), "llama");
  ASSERT_TRUE(format.ok());
  const std::vector<ChatMessage> msgs{{"user", "Hi"}};
  const auto ids = tok->encode(render_chat(*format, msgs, true, "").value(), false);
  EXPECT_EQ(ids.front(), *tok->token_id("<|im_start|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok->token_id("<|im_end|>")), 2);
}

// What --chat-template and the model's own template choose.
TEST(ChatTemplate, RendererChoosesTheModelsOwnTemplate) {
  std::string why;
  const Tokenizer* tok = testing::gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf", &why);
  if (!tok) GTEST_SKIP() << why;
  const std::vector<ChatMessage> msgs{{"system", "Be brief."}, {"user", "Hi"}};
  // The model's own (Jinja) template, equal to the built-in format it matches.
  auto own = ChatRenderer::create("", tok->chat_template(), "llama", "", "");
  ASSERT_TRUE(own.ok()) << own.error().message;
  EXPECT_EQ(own->description(), "the model's own chat template");
  EXPECT_EQ(own->render(msgs, true).value(),
            render_chat(ChatFormat::Smollm2, msgs, true, "").value());
  EXPECT_FALSE(own->render({}, true).ok());
  // A built-in name.
  auto named = ChatRenderer::create("gemma", tok->chat_template(), "llama", "<bos>", "<eos>");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->render(msgs, true).value(),
            render_chat(ChatFormat::Gemma, msgs, true, "<bos>").value());
  // A Jinja file.
  const std::string qwen = std::string(KVANT_FIXTURES) + "/jinja/templates/qwen3.jinja";
  auto file = ChatRenderer::create(qwen, tok->chat_template(), "llama", "", "");
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(file->render({{{"user", "Hi"}}}, true).value(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // No template: the architecture's built-in format; unknown names fail.
  auto arch = ChatRenderer::create("", "", "gemma3", "<bos>", "<eos>");
  ASSERT_TRUE(arch.ok());
  EXPECT_NE(arch->description().find("gemma"), std::string::npos);
  EXPECT_FALSE(ChatRenderer::create("no-such-format", "", "llama", "", "").ok());
  // A template the interpreter cannot parse falls back to the format it is
  // recognized as, or fails naming both reasons.
  EXPECT_FALSE(ChatRenderer::create("", "{% extends 'x' %}", "llama", "", "").ok());
}

}  // namespace
}  // namespace kvant
