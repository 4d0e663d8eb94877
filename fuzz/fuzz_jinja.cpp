// libFuzzer target for the chat template interpreter (tokenizer/jinja.h):
// any text is parsed and, when it parses, rendered with a small fixed
// conversation under tight limits. Templates come from model files and
// requests, so nothing may crash, hang, read out of bounds or leak: every
// input ends in output or an error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "tokenizer/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Zürich?"},
      {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
      {"role": "tool", "content": "18°C", "tool_call_id": "c1"},
      {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "enable_thinking": false, "n": 3, "f": 2.5})");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto t = kvant::jinja::Template::parse(text);
  if (!t.ok()) {
    if (t.error().message.empty()) std::abort();  // every error says what went wrong
    return 0;
  }
  kvant::jinja::Limits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_work = 200000;
  limits.max_depth = 200;
  auto out = t->render(context(), limits);
  if (out.ok() && out->size() > limits.max_output_bytes) std::abort();
  if (!out.ok() && out.error().message.empty()) std::abort();
  return 0;
}
