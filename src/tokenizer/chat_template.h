// Chat prompt formatting for the model families kvant serves, two ways:
//
// - JinjaChatTemplate (chat_template_jinja.cpp) renders a model's own
//   template text (chat_template in tokenizer_config.json,
//   chat_template.jinja, GGUF tokenizer.chat_template) with kvant's Jinja
//   interpreter (tokenizer/jinja.h), exactly as transformers'
//   apply_chat_template does (tests/fixtures/jinja, rendered by
//   tools/fixtures/gen_jinja.py): messages with tool_calls and
//   reasoning_content, tool declarations, the special tokens and switches
//   such as enable_thinking.
// - The named formats below are built-in fallbacks for models without a
//   template, or for --chat-template NAME: each known template is
//   recognized (from its text, or the architecture when there is none) and
//   rendered by a small function that reproduces it byte for byte
//   (tests/fixtures/chat, via tools/fixtures/gen_chat.py). An unrecognized
//   template is an error naming it.
//
// Tokenizing the result is the caller's: formats that write BOS themselves
// (Gemma, Llama 3; chat_format_writes_bos, and templates that print
// bos_token) must be encoded with add_bos=false and parse_special=true.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/result.h"
#include "tokenizer/jinja.h"

namespace kvant {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (others pass through)
  std::string content;
};

enum class ChatFormat {
  Chatml,   // <|im_start|>role\n...<|im_end|>\n, no default system prompt (Qwen3, plain ChatML)
  Smollm2,  // ChatML + SmolLM2's default system prompt when the first message is not system
  Qwen2,    // ChatML + "You are a helpful assistant." by default (Qwen2/Qwen1.5 Instruct)
  Qwen25,   // ChatML + "You are Qwen, created by Alibaba Cloud. ..." by default (Qwen2.5)
  Gemma,    // <bos><start_of_turn>user|model ... system folded into the first user turn
  Llama3,   // <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
};

// From a template's text (GGUF tokenizer.chat_template, tokenizer_config.json
// chat_template); when it is empty, from the architecture (general.
// architecture), e.g. gemma3. Errors name what was not recognized.
Result<ChatFormat> detect_chat_format(std::string_view template_text, std::string_view arch);

// Names for a --chat-template flag: chatml, smollm2, qwen2, qwen2.5, gemma,
// llama3 (also a few aliases: qwen3 -> chatml, gemma3 -> gemma, llama-3).
Result<ChatFormat> chat_format_from_name(std::string_view name);
std::string_view chat_format_name(ChatFormat format);

// Whether render_chat() writes the BOS text itself.
bool chat_format_writes_bos(ChatFormat format);

// Renders the conversation; `bos_text` is the BOS token's text ("<bos>",
// "<|begin_of_text|>") for the formats that write it. Fails on an empty
// conversation and where the real template raises (Gemma: roles that do not
// alternate user/assistant after an optional system message).
Result<std::string> render_chat(ChatFormat format, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, std::string_view bos_text);

// What a chat template is rendered with. `messages` are OpenAI-style message
// objects (role, content as a string or a list of parts, tool_calls with
// arguments as an object, tool_call_id, reasoning_content, ...); keys keep
// their order, which tojson shows (parse requests with ordered_json, or
// tool schemas come out with sorted keys). `tools` is null or a list of tool
// schemas ({"type": "function", "function": {...}}). `variables` become
// template variables: the tokenizer's special tokens (bos_token,
// eos_token, ...) and switches such as enable_thinking or date_string.
struct JinjaChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: no tools
  bool add_generation_prompt = true;
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

// A model's own chat template, parsed once and rendered per request.
class JinjaChatTemplate {
 public:
  // Fails on a syntax error, naming its line and column.
  static Result<JinjaChatTemplate> parse(std::string_view template_text);

  // Renders as apply_chat_template does: message keys whose value is null
  // are dropped, reasoning given as reasoning_content, thinking or
  // reasoning is passed under both reasoning_content and thinking, and the
  // template sees messages, tools, documents (none), add_generation_prompt
  // and the variables. Errors carry the template's raise_exception message.
  Result<std::string> render(const JinjaChatInput& input,
                             const jinja::Limits& limits = jinja::Limits()) const;

  // Plain role/content messages with the BOS and EOS token texts.
  Result<std::string> render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                             std::string_view bos_text, std::string_view eos_text) const;

 private:
  jinja::Template template_;
};

// How a server or the CLI renders chat prompts. `choice` is what
// --chat-template says: "" (the model's own template, rendered by the Jinja
// interpreter; a template it cannot parse falls back to the built-in format
// it is recognized as; no template: the built-in format for the
// architecture), a built-in name (chat_format_from_name), or the path of a
// Jinja template file. Tokenize the result with add_bos=false and
// parse_special=true: templates write BOS themselves where the model wants it.
class ChatRenderer {
 public:
  static Result<ChatRenderer> create(const std::string& choice, std::string_view model_template,
                                     std::string_view arch, std::string bos_text,
                                     std::string eos_text);
  Result<std::string> render(std::span<const ChatMessage> messages,
                             bool add_generation_prompt) const;
  // A whole request: messages with tool calls and tool results, tools and
  // template switches (bos_token / eos_token are added unless given). A
  // built-in format renders plain role/content conversations only; tools,
  // tool calls and switches there are an error naming them.
  Result<std::string> render(const JinjaChatInput& input) const;
  // What renders, for logs: "the model's own chat template", ...
  const std::string& description() const { return what_; }
  // The Jinja template's text ("" for a built-in format): what tool-call
  // and reasoning formats are detected from.
  const std::string& template_text() const { return text_; }

 private:
  std::optional<JinjaChatTemplate> jinja_;
  ChatFormat format_ = ChatFormat::Chatml;
  std::string bos_, eos_, what_, text_;
};

}  // namespace kvant
