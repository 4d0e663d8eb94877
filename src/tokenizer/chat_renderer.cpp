// Choosing how chat prompts are rendered (chat_template.h, ChatRenderer).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/chat_template.h"

namespace kvant {

namespace {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot read the chat template file '" + path + "'");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

Result<ChatRenderer> ChatRenderer::create(const std::string& choice,
                                          std::string_view model_template, std::string_view arch,
                                          std::string bos_text, std::string eos_text) {
  ChatRenderer r;
  r.bos_ = std::move(bos_text);
  r.eos_ = std::move(eos_text);
  std::error_code ec;
  if (!choice.empty() && std::filesystem::is_regular_file(choice, ec)) {
    auto text = read_text_file(choice);
    if (!text) return text.error();
    auto t = JinjaChatTemplate::parse(*text);
    if (!t) return make_error(choice + ": " + t.error().message);
    r.jinja_ = std::move(*t);
    r.text_ = std::move(*text);
    r.what_ = "the Jinja template " + choice;
    return r;
  }
  if (!choice.empty()) {
    auto f = chat_format_from_name(choice);
    if (!f) return f.error();
    r.format_ = *f;
    r.what_ = "the built-in " + std::string(chat_format_name(*f)) + " format";
    return r;
  }
  if (!model_template.empty()) {
    auto t = JinjaChatTemplate::parse(model_template);
    if (t) {
      r.jinja_ = std::move(*t);
      r.text_ = std::string(model_template);
      r.what_ = "the model's own chat template";
      return r;
    }
    // A template the interpreter cannot parse may still be one of the
    // built-in formats.
    auto f = detect_chat_format(model_template, arch);
    if (!f)
      return make_error("the model's chat template does not parse (" + t.error().message +
                        ") and is not a known format; choose one with --chat-template");
    r.format_ = *f;
    r.what_ = "the built-in " + std::string(chat_format_name(*f)) +
              " format (the model's template does not parse: " + t.error().message + ")";
    return r;
  }
  auto f = detect_chat_format(model_template, arch);
  if (!f) return f.error();
  r.format_ = *f;
  r.what_ = "the built-in " + std::string(chat_format_name(*f)) + " format";
  return r;
}

Result<std::string> ChatRenderer::render(std::span<const ChatMessage> messages,
                                         bool add_generation_prompt) const {
  if (messages.empty()) return make_error("the conversation is empty");
  if (jinja_) return jinja_->render(messages, add_generation_prompt, bos_, eos_);
  return render_chat(format_, messages, add_generation_prompt, bos_);
}

Result<std::string> ChatRenderer::render(const JinjaChatInput& input) const {
  if (jinja_) {
    JinjaChatInput in = input;
    if (!in.variables.contains("bos_token")) in.variables["bos_token"] = bos_;
    if (!in.variables.contains("eos_token")) in.variables["eos_token"] = eos_;
    return jinja_->render(in);
  }
  if (!input.tools.is_null())
    return make_error(what_ + " has no tool support; serve with a chat template that has (--chat-template FILE.jinja)");
  if (!input.variables.empty())
    return make_error(what_ + " takes no template switches (chat_template_kwargs)");
  std::vector<ChatMessage> msgs;
  for (const auto& m : input.messages) {
    const std::string role = m.value("role", "");
    if (m.contains("tool_calls") || role == "tool")
      return make_error(what_ + " cannot render tool calls or tool results; serve with a chat template that can (--chat-template FILE.jinja)");
    const auto& c = m.value("content", nlohmann::ordered_json());
    msgs.push_back({role, c.is_string() ? c.get<std::string>() : std::string()});
  }
  return render(msgs, input.add_generation_prompt);
}

}  // namespace kvant
