// Chat prompt formatting for the model families kvant serves. Rather than run
// a Jinja interpreter, each known template is recognized (from the text a
// GGUF or tokenizer_config.json ships, or the architecture when there is
// none) and rendered by a small function that reproduces it byte for byte
// (tests/fixtures/chat, rendered by the real templates via
// tools/fixtures/gen_chat.py). An unrecognized template is an error naming
// it, and --chat-template NAME (chat_format_from_name) overrides detection.
// Tokenizing the result is the caller's: formats that write BOS themselves
// (Gemma, Llama 3; chat_format_writes_bos) must be encoded with add_bos=false
// and parse_special=true.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/result.h"

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

}  // namespace kvant
