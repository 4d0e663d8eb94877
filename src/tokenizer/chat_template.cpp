// Renderers for the recognized chat templates. Each mirrors one published
// Jinja template; comments name the template constructs whose exact effect
// matters (trim, where BOS goes, which messages a default applies to).
#include "tokenizer/chat_template.h"

#include <cstdint>

namespace kvant {
namespace {

constexpr std::string_view kSmollm2System =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
constexpr std::string_view kQwen2System = "You are a helpful assistant.";
constexpr std::string_view kQwen25System =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// Jinja's `trim` is Python's str.strip(): it removes every character for which
// str.isspace() is true, not only ASCII whitespace.
bool python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Decodes the code point starting at s[i] (s is assumed valid UTF-8; a stray
// byte counts as itself) and its length.
uint32_t code_point_at(std::string_view s, size_t i, size_t& len) {
  const uint8_t b = uint8_t(s[i]);
  len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
  if (i + len > s.size()) len = 1;
  if (len == 1) return b;
  uint32_t c = b & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) c = (c << 6) | (uint8_t(s[i + k]) & 0x3F);
  return c;
}

std::string_view jinja_trim(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t len;
    if (!python_space(code_point_at(s, b, len))) break;
    b += len;
  }
  size_t e = s.size();
  while (e > b) {
    size_t k = e - 1;  // step back to the start of the last code point
    while (k > b && (uint8_t(s[k]) & 0xC0) == 0x80) --k;
    size_t len;
    if (!python_space(code_point_at(s, k, len)) || k + len != e) break;
    e = k;
  }
  return s.substr(b, e - b);
}

void chatml_turn(std::string& out, std::string_view role, std::string_view content) {
  out += "<|im_start|>";
  out += role;
  out += '\n';
  out += content;
  out += "<|im_end|>\n";
}

// SmolLM2's and Qwen2's template: the default system turn is written inside
// the loop on its first iteration, so only when there is a first message.
std::string render_chatml(std::span<const ChatMessage> msgs, bool gen,
                          std::string_view default_system) {
  std::string out;
  if (!default_system.empty() && msgs.front().role != "system")
    chatml_turn(out, "system", default_system);
  for (const ChatMessage& m : msgs) chatml_turn(out, m.role, m.content);
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// Gemma 3: "{{ bos_token }}", a leading system message becomes a prefix
// (content + "\n\n", untrimmed) of the first remaining turn, every turn's
// content is trimmed, "assistant" is written "model", and roles must
// alternate starting with user (raise_exception otherwise).
Result<std::string> render_gemma(std::span<const ChatMessage> msgs, bool gen,
                                 std::string_view bos) {
  std::string out(bos);
  std::string prefix;
  if (msgs.front().role == "system") {
    prefix = msgs.front().content + "\n\n";
    msgs = msgs.subspan(1);
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if ((m.role == "user") != (i % 2 == 0))
      return make_error(
          "chat template (gemma): conversation roles must alternate user/assistant/user/"
          "assistant/... (message " +
          std::to_string(i) + " is '" + m.role + "')");
    out += "<start_of_turn>";
    out += m.role == "assistant" ? std::string_view("model") : std::string_view(m.role);
    out += '\n';
    if (i == 0) out += prefix;
    out += jinja_trim(m.content);
    out += "<end_of_turn>\n";
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

// Llama 3: BOS before the first message only; `message['content'] | trim`
// binds tighter than `+`, so only the content is trimmed.
std::string render_llama3(std::span<const ChatMessage> msgs, bool gen, std::string_view bos) {
  std::string out(bos);
  for (const ChatMessage& m : msgs) {
    out += "<|start_header_id|>";
    out += m.role;
    out += "<|end_header_id|>\n\n";
    out += jinja_trim(m.content);
    out += "<|eot_id|>";
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

Result<ChatFormat> detect_chat_format(std::string_view t, std::string_view arch) {
  if (t.empty()) {
    // "gemma3" from a GGUF, "Gemma3ForCausalLM" from a config.json.
    if (arch.rfind("gemma", 0) == 0 || arch.rfind("Gemma", 0) == 0) return ChatFormat::Gemma;
    return make_error(
        "no chat template in the model and no default for architecture '" + std::string(arch) +
        "'; choose one with --chat-template (chatml, smollm2, qwen2, qwen2.5, gemma, llama3)");
  }
  if (contains(t, "<start_of_turn>")) return ChatFormat::Gemma;
  if (contains(t, "<|start_header_id|>") && contains(t, "<|eot_id|>")) {
    // Llama 3.1+ templates always write a system turn with knowledge and
    // today's dates; rendering them as Llama 3 would silently drop it.
    if (contains(t, "Cutting Knowledge Date"))
      return make_error(
          "Llama 3.1-style chat template (dated system header) is not supported; "
          "--chat-template llama3 forces the Llama 3 format");
    return ChatFormat::Llama3;
  }
  if (contains(t, "<|im_start|>")) {
    if (contains(t, kSmollm2System)) return ChatFormat::Smollm2;
    if (contains(t, "You are Qwen, created by Alibaba Cloud")) return ChatFormat::Qwen25;
    if (contains(t, kQwen2System)) return ChatFormat::Qwen2;
    return ChatFormat::Chatml;
  }
  std::string head(t.substr(0, 80));
  for (char& c : head) c = c == '\n' ? ' ' : c;
  return make_error(
      "unrecognized chat template (starts \"" + head +
      "...\"); choose one with --chat-template (chatml, smollm2, qwen2, qwen2.5, gemma, llama3)");
}

Result<ChatFormat> chat_format_from_name(std::string_view n) {
  if (n == "chatml" || n == "qwen3") return ChatFormat::Chatml;
  if (n == "smollm2" || n == "smollm") return ChatFormat::Smollm2;
  if (n == "qwen2") return ChatFormat::Qwen2;
  if (n == "qwen2.5" || n == "qwen25") return ChatFormat::Qwen25;
  if (n == "gemma" || n == "gemma3") return ChatFormat::Gemma;
  if (n == "llama3" || n == "llama-3") return ChatFormat::Llama3;
  return make_error("unknown chat template name '" + std::string(n) +
                    "' (known: chatml, smollm2, qwen2, qwen2.5, gemma, llama3)");
}

std::string_view chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::Chatml:
      return "chatml";
    case ChatFormat::Smollm2:
      return "smollm2";
    case ChatFormat::Qwen2:
      return "qwen2";
    case ChatFormat::Qwen25:
      return "qwen2.5";
    case ChatFormat::Gemma:
      return "gemma";
    case ChatFormat::Llama3:
      return "llama3";
  }
  return "unknown";
}

bool chat_format_writes_bos(ChatFormat f) {
  return f == ChatFormat::Gemma || f == ChatFormat::Llama3;
}

Result<std::string> render_chat(ChatFormat f, std::span<const ChatMessage> msgs, bool gen,
                                std::string_view bos) {
  if (msgs.empty()) return make_error("chat template: the conversation has no messages");
  switch (f) {
    case ChatFormat::Chatml:
      return render_chatml(msgs, gen, {});
    case ChatFormat::Smollm2:
      return render_chatml(msgs, gen, kSmollm2System);
    case ChatFormat::Qwen2:
      return render_chatml(msgs, gen, kQwen2System);
    case ChatFormat::Qwen25:
      return render_chatml(msgs, gen, kQwen25System);
    case ChatFormat::Gemma:
      return render_gemma(msgs, gen, bos);
    case ChatFormat::Llama3:
      return render_llama3(msgs, gen, bos);
  }
  return make_error("chat template: unknown format");
}

}  // namespace kvant
