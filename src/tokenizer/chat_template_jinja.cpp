// JinjaChatTemplate: a model's own chat template rendered with the Jinja
// interpreter, with the message preparation transformers' apply_chat_template
// does before rendering.
#include "tokenizer/chat_template.h"

namespace kvant {

namespace {

// apply_chat_template's preparation of one message: keys with null values
// are dropped, and reasoning (the first of reasoning_content, thinking,
// reasoning that is set) is stored as {"thinking": r, **message,
// "reasoning_content": r}, in that key order.
nlohmann::ordered_json prepare_message(const nlohmann::ordered_json& msg) {
  nlohmann::ordered_json kept = nlohmann::ordered_json::object();
  for (const auto& [k, v] : msg.items())
    if (!v.is_null()) kept[k] = v;
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if (kept.contains(key)) {
      reasoning = &kept[key];
      break;
    }
  }
  if (!reasoning) return kept;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  out["thinking"] = *reasoning;
  for (const auto& [k, v] : kept.items()) out[k] = v;
  out["reasoning_content"] = *reasoning;
  return out;
}

}  // namespace

Result<JinjaChatTemplate> JinjaChatTemplate::parse(std::string_view text) {
  auto t = jinja::Template::parse(text);
  if (!t.ok()) return make_error("chat template: " + t.error().message);
  JinjaChatTemplate out;
  out.template_ = std::move(t.value());
  return out;
}

Result<std::string> JinjaChatTemplate::render(const JinjaChatInput& in,
                                              const jinja::Limits& limits) const {
  if (!in.messages.is_array()) return make_error("chat template: messages must be a list");
  if (in.messages.empty()) return make_error("chat template: the conversation has no messages");
  if (!in.tools.is_null() && !in.tools.is_array())
    return make_error("chat template: tools must be a list");
  if (!in.variables.is_object()) return make_error("chat template: variables must be an object");
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = nlohmann::ordered_json::array();
  for (const auto& m : in.messages) {
    if (!m.is_object()) return make_error("chat template: each message must be an object");
    ctx["messages"].push_back(prepare_message(m));
  }
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  for (const auto& [k, v] : in.variables.items()) {
    if (ctx.contains(k))
      return make_error("chat template: variable '" + k + "' is reserved for the conversation");
    ctx[k] = v;
  }
  auto out = template_.render(ctx, limits);
  if (!out.ok()) return make_error("chat template: " + out.error().message);
  return out;
}

Result<std::string> JinjaChatTemplate::render(std::span<const ChatMessage> messages,
                                              bool add_generation_prompt, std::string_view bos_text,
                                              std::string_view eos_text) const {
  JinjaChatInput in;
  for (const ChatMessage& m : messages)
    in.messages.push_back({{"role", m.role}, {"content", m.content}});
  in.add_generation_prompt = add_generation_prompt;
  in.variables["bos_token"] = std::string(bos_text);
  in.variables["eos_token"] = std::string(eos_text);
  return render(in);
}

}  // namespace kvant
