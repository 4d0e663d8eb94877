// Implementation of chat_output.h: the split of <think> reasoning from the
// rest, the scan for tool-call markers shared by the marker-delimited
// formats, and one reader per format for the text between a call's markers.
#include "tokenizer/chat_output.h"

#include <algorithm>
#include <array>
#include <optional>

namespace kvant {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// The markers around tool calls. Formats without sections leave the section
// markers empty: each call then stands alone in the text.
struct Markers {
  std::string_view section_begin;
  std::string_view section_end;
  std::string_view call_begin;
  std::string_view call_end;
};

constexpr Markers kTagMarkers = {"", "", "<tool_call>", "</tool_call>"};
constexpr Markers kDeepSeekMarkers = {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                      "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"};
constexpr Markers kKimiMarkers = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                  "<|tool_call_begin|>", "<|tool_call_end|>"};
constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";
constexpr std::string_view kKimiArguments = "<|tool_call_argument_begin|>";

const Markers& markers_of(ToolFormat format) {
  switch (format) {
    case ToolFormat::DeepSeekV3:
    case ToolFormat::DeepSeekV31:
      return kDeepSeekMarkers;
    case ToolFormat::KimiK2:
      return kKimiMarkers;
    default:
      return kTagMarkers;
  }
}

constexpr std::array<std::pair<ToolFormat, std::string_view>, 8> kFormatNames = {{
    {ToolFormat::Hermes, "hermes"},
    {ToolFormat::Qwen3Coder, "qwen3_coder"},
    {ToolFormat::Llama3, "llama3_json"},
    {ToolFormat::DeepSeekV3, "deepseek_v3"},
    {ToolFormat::DeepSeekV31, "deepseek_v31"},
    {ToolFormat::KimiK2, "kimi_k2"},
    {ToolFormat::Glm45, "glm45"},
    {ToolFormat::None, "none"},
}};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  const size_t b = skip_space(s, 0);
  size_t e = s.size();
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Length of the longest end of `text` that is a proper beginning of `marker`:
// text that must wait for what follows before it can be passed on.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

// Reads JSON text one character at a time, telling brackets outside strings
// apart: step() is +1 for an opening bracket, -1 for a closing one, else 0.
struct BracketScanner {
  bool in_string = false;
  bool escaped = false;
  int step(char c) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      return 0;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') return 1;
    if (c == '}' || c == ']') return -1;
    return 0;
  }
};

// Deepest nesting of objects and arrays in JSON text.
int json_depth(std::string_view s) {
  BracketScanner scan;
  int depth = 0, deepest = 0;
  for (char c : s) {
    depth += scan.step(c);
    deepest = std::max(deepest, depth);
  }
  return deepest;
}

// JSON text parsed, or a discarded value when it does not parse. Nesting
// deeper than any tool's arguments need is refused too: copying and
// serializing a value recurse once per level.
ojson parse_json(std::string_view s) {
  constexpr int kMaxDepth = 128;
  if (json_depth(s) > kMaxDepth) return ojson(ojson::value_t::discarded);
  return ojson::parse(s.begin(), s.end(), nullptr, false);
}

// Compact JSON text; invalid UTF-8 in strings is replaced, not an exception.
std::string compact(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

// A tool call as read from the text, before the checks all formats share.
struct RawCall {
  std::string id;  // empty: numbered by the stream
  std::string name;
  ojson args;
};

// A function name: not empty, and none of the characters that show the text
// was not a name (whitespace, controls, markup and JSON punctuation).
bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7f) return false;
    if (c == '<' || c == '>' || c == '{' || c == '}' || c == '"') return false;
  }
  return true;
}

// The function object ({"name", "parameters", ...}) named `name` in a tools
// array, whose entries are {"type": "function", "function": {...}} or the
// function object itself.
const ojson* find_function(const ojson& tools, std::string_view name) {
  if (!tools.is_array()) return nullptr;
  for (const ojson& tool : tools) {
    if (!tool.is_object()) continue;
    const ojson* fn = &tool;
    if (auto it = tool.find("function"); it != tool.end() && it->is_object()) fn = &*it;
    auto n = fn->find("name");
    if (n != fn->end() && n->is_string() && n->get_ref<const std::string&>() == name) return fn;
  }
  return nullptr;
}

// The JSON schema of one parameter of a function, or nullptr.
const ojson* property_schema(const ojson* fn, const std::string& key) {
  if (fn == nullptr) return nullptr;
  auto params = fn->find("parameters");
  if (params == fn->end() || !params->is_object()) return nullptr;
  auto props = params->find("properties");
  if (props == params->end() || !props->is_object()) return nullptr;
  auto schema = props->find(key);
  if (schema == props->end() || !schema->is_object()) return nullptr;
  return &*schema;
}

bool has_type(const ojson& v, std::string_view type) {
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

// The JSON value of a parameter written as raw text (Qwen3Coder, Glm45).
// Declared "string": the text itself. Other declared types: the text parsed
// as JSON when it parses, else the text. A type list that includes "string"
// takes the parsed value only when it has one of the other listed types.
// Undeclared: the parsed value when it is a number, boolean, null, object or
// array, else the text.
ojson typed_value(std::string_view raw, const ojson* schema) {
  std::vector<std::string_view> types;
  if (schema != nullptr) {
    if (auto t = schema->find("type"); t != schema->end()) {
      if (t->is_string()) types.push_back(t->get_ref<const std::string&>());
      if (t->is_array()) {
        for (const ojson& e : *t)
          if (e.is_string()) types.push_back(e.get_ref<const std::string&>());
      }
    }
  }
  const ojson parsed = parse_json(raw);
  const bool ok = !parsed.is_discarded();
  if (types.empty()) return ok && !parsed.is_string() ? parsed : ojson(std::string(raw));
  if (std::find(types.begin(), types.end(), "string") == types.end()) {
    return ok ? parsed : ojson(std::string(raw));
  }
  for (std::string_view type : types) {
    if (ok && has_type(parsed, type)) return parsed;
  }
  return ojson(std::string(raw));
}

// {"name": ..., "arguments" or "parameters": {...}} (Hermes, Llama3). Without
// either arguments key the call has no arguments.
std::optional<RawCall> call_from_object(const ojson& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  RawCall c{{}, name->get<std::string>(), ojson::object()};
  for (const char* key : {"arguments", "parameters"}) {
    if (auto a = j.find(key); a != j.end()) {
      c.args = *a;
      break;
    }
  }
  return c;
}

std::optional<RawCall> read_hermes(std::string_view body) {
  return call_from_object(parse_json(body));
}

// <function=NAME> then <parameter=KEY>\nVALUE\n</parameter> for each argument,
// then </function> (tolerated missing at the end of the block).
std::optional<RawCall> read_qwen3_coder(std::string_view body, const ojson& tools) {
  constexpr std::string_view kFnOpen = "<function=", kFnClose = "</function>";
  constexpr std::string_view kParamOpen = "<parameter=", kParamClose = "</parameter>";
  const std::string_view s = trim(body);
  if (!s.starts_with(kFnOpen)) return std::nullopt;
  const size_t name_end = s.find('>', kFnOpen.size());
  if (name_end == std::string_view::npos) return std::nullopt;
  RawCall c{
      {}, std::string(trim(s.substr(kFnOpen.size(), name_end - kFnOpen.size()))), ojson::object()};
  const ojson* fn = find_function(tools, c.name);
  size_t i = name_end + 1;
  while (true) {
    i = skip_space(s, i);
    if (i == s.size()) break;
    const std::string_view rest = s.substr(i);
    if (rest.starts_with(kFnClose)) {
      if (skip_space(s, i + kFnClose.size()) != s.size()) return std::nullopt;
      break;
    }
    if (!rest.starts_with(kParamOpen)) return std::nullopt;
    const size_t key_end = s.find('>', i + kParamOpen.size());
    if (key_end == std::string_view::npos) return std::nullopt;
    const std::string key(trim(s.substr(i + kParamOpen.size(), key_end - i - kParamOpen.size())));
    const size_t value_end = s.find(kParamClose, key_end + 1);
    if (key.empty() || value_end == std::string_view::npos) return std::nullopt;
    std::string_view value = s.substr(key_end + 1, value_end - key_end - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    c.args[key] = typed_value(value, property_schema(fn, key));
    i = value_end + kParamClose.size();
  }
  return c;
}

// NAME, then <arg_key>KEY</arg_key><arg_value>VALUE</arg_value> for each
// argument, with or without whitespace between the parts. Values are taken
// as written, as the templates write string values.
std::optional<RawCall> read_glm45(std::string_view body, const ojson& tools) {
  constexpr std::string_view kKeyOpen = "<arg_key>", kKeyClose = "</arg_key>";
  constexpr std::string_view kValueOpen = "<arg_value>", kValueClose = "</arg_value>";
  size_t i = std::min(body.find(kKeyOpen), body.size());
  RawCall c{{}, std::string(trim(body.substr(0, i))), ojson::object()};
  const ojson* fn = find_function(tools, c.name);
  while ((i = skip_space(body, i)) < body.size()) {
    if (!body.substr(i).starts_with(kKeyOpen)) return std::nullopt;
    const size_t key_end = body.find(kKeyClose, i + kKeyOpen.size());
    if (key_end == std::string_view::npos) return std::nullopt;
    const std::string key(trim(body.substr(i + kKeyOpen.size(), key_end - i - kKeyOpen.size())));
    i = skip_space(body, key_end + kKeyClose.size());
    if (key.empty() || !body.substr(i).starts_with(kValueOpen)) return std::nullopt;
    const size_t value_end = body.find(kValueClose, i + kValueOpen.size());
    if (value_end == std::string_view::npos) return std::nullopt;
    const std::string_view value =
        body.substr(i + kValueOpen.size(), value_end - i - kValueOpen.size());
    c.args[key] = typed_value(value, property_schema(fn, key));
    i = value_end + kValueClose.size();
  }
  return c;
}

// TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n``` (the type, "function", is not
// checked; the fence is optional).
std::optional<RawCall> read_deepseek_v3(std::string_view body) {
  const size_t sep = body.find(kDeepSeekSep);
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string_view rest = body.substr(sep + kDeepSeekSep.size());
  const size_t newline = rest.find('\n');
  if (newline == std::string_view::npos) return std::nullopt;
  std::string_view args = trim(rest.substr(newline + 1));
  if (args.starts_with("```json")) {
    args.remove_prefix(7);
  } else if (args.starts_with("```")) {
    args.remove_prefix(3);
  }
  if (args.ends_with("```")) args.remove_suffix(3);
  return RawCall{{}, std::string(trim(rest.substr(0, newline))), parse_json(args)};
}

// NAME<｜tool▁sep｜>ARGS
std::optional<RawCall> read_deepseek_v31(std::string_view body) {
  const size_t sep = body.find(kDeepSeekSep);
  if (sep == std::string_view::npos) return std::nullopt;
  return RawCall{{},
                 std::string(trim(body.substr(0, sep))),
                 parse_json(body.substr(sep + kDeepSeekSep.size()))};
}

// functions.NAME:N<|tool_call_argument_begin|>ARGS; the id is the whole
// "functions.NAME:N".
std::optional<RawCall> read_kimi_k2(std::string_view body) {
  const size_t sep = body.find(kKimiArguments);
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string_view id = trim(body.substr(0, sep));
  std::string_view name = id;
  if (name.starts_with("functions.")) name.remove_prefix(10);
  if (const size_t colon = name.rfind(':'); colon != std::string_view::npos) {
    name = name.substr(0, colon);
  }
  return RawCall{std::string(id), std::string(name),
                 parse_json(body.substr(sep + kKimiArguments.size()))};
}

// The checks every format shares: a plausible name, arguments that are an
// object, and a function the request declared (when it declared any).
std::optional<ToolCall> checked(std::optional<RawCall> c, const ChatOutputOptions& o) {
  if (!c || !valid_name(c->name) || !c->args.is_object()) return std::nullopt;
  const ojson& tools = o.tool_schemas;
  if (tools.is_array() && !tools.empty() && find_function(tools, c->name) == nullptr) {
    return std::nullopt;
  }
  return ToolCall{std::move(c->id), std::move(c->name), compact(c->args)};
}

// The call written between one call's markers, or nullopt when it is not one.
std::optional<ToolCall> read_call(std::string_view body, const ChatOutputOptions& o) {
  switch (o.tools) {
    case ToolFormat::Hermes:
      return checked(read_hermes(body), o);
    case ToolFormat::Qwen3Coder:
      return checked(read_qwen3_coder(body, o.tool_schemas), o);
    case ToolFormat::DeepSeekV3:
      return checked(read_deepseek_v3(body), o);
    case ToolFormat::DeepSeekV31:
      return checked(read_deepseek_v31(body), o);
    case ToolFormat::KimiK2:
      return checked(read_kimi_k2(body), o);
    case ToolFormat::Glm45:
      return checked(read_glm45(body, o.tool_schemas), o);
    default:
      return std::nullopt;
  }
}

// The index just past the JSON object or array that starts at s[i] (an
// opening bracket), found by matching brackets outside strings, or npos
// when it does not end.
size_t json_value_end(std::string_view s, size_t i) {
  BracketScanner scan;
  int depth = 0;
  for (; i < s.size(); ++i) {
    depth += scan.step(s[i]);
    if (depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

// A whole Llama 3 reply: [<|python_tag|>] {call} [; {call}]... [;]. Every
// call must be accepted, or the reply is not tool calls at all.
std::optional<std::vector<ToolCall>> read_llama3(std::string_view text,
                                                 const ChatOutputOptions& o) {
  std::string_view s = trim(text);
  if (s.starts_with(kPythonTag)) s = trim(s.substr(kPythonTag.size()));
  std::vector<ToolCall> calls;
  size_t i = 0;
  while ((i = skip_space(s, i)) < s.size()) {
    if (s[i] != '{') return std::nullopt;
    const size_t end = json_value_end(s, i);
    if (end == std::string_view::npos) return std::nullopt;
    std::optional<ToolCall> call = checked(call_from_object(parse_json(s.substr(i, end - i))), o);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    i = skip_space(s, end);
    if (i < s.size()) {
      if (s[i] != ';') return std::nullopt;
      ++i;
    }
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

}  // namespace

Result<ToolFormat> tool_format_from_name(std::string_view name) {
  std::string choices;
  for (const auto& [format, n] : kFormatNames) {
    if (n == name) return format;
    choices += choices.empty() ? "" : ", ";
    choices += n;
  }
  return make_error("unknown tool parser '" + std::string(name) + "' (choices: " + choices + ")");
}

std::string_view tool_format_name(ToolFormat format) {
  for (const auto& [f, n] : kFormatNames) {
    if (f == format) return n;
  }
  return "none";
}

ToolFormat detect_tool_format(std::string_view t) {
  const auto has = [t](std::string_view marker) {
    return t.find(marker) != std::string_view::npos;
  };
  // GLM's and Qwen3-Coder's templates also contain <tool_call>, so their own
  // markers are tested first.
  if (has("<arg_key>")) return ToolFormat::Glm45;
  if (has("<function=")) return ToolFormat::Qwen3Coder;
  if (has("<|tool_calls_section_begin|>")) return ToolFormat::KimiK2;
  if (has("tool▁sep")) {
    // DeepSeek V3 and R1 write the tool type before the separator and fence
    // the arguments; V3.1 writes the name and the bare JSON.
    return has("```json") || has("function<｜tool▁sep｜>") ? ToolFormat::DeepSeekV3
                                                           : ToolFormat::DeepSeekV31;
  }
  if (has("<tool_call>")) return ToolFormat::Hermes;
  if (has("Environment: ipython") || has("\"parameters\": dictionary")) return ToolFormat::Llama3;
  return ToolFormat::None;
}

ReasoningFormat detect_reasoning_format(std::string_view t) {
  for (std::string_view marker : {kThinkOpen, kThinkClose, std::string_view("reasoning_content")}) {
    if (t.find(marker) != std::string_view::npos) return ReasoningFormat::ThinkTags;
  }
  return ReasoningFormat::None;
}

bool prompt_opens_reasoning(std::string_view rendered_prompt) {
  return trim(rendered_prompt).ends_with(kThinkOpen);
}

bool prompt_closes_reasoning(std::string_view rendered_prompt) {
  return trim(rendered_prompt).ends_with(kThinkClose);
}

void ChatOutputStream::TrimmedSink::put(std::string_view text, std::string& out) {
  if (!started) {
    text.remove_prefix(skip_space(text, 0));
    if (text.empty()) return;
    started = true;
  }
  size_t e = text.size();
  while (e > 0 && is_space(text[e - 1])) --e;
  if (e > 0) {
    out += pending;
    out.append(text.substr(0, e));
    pending.clear();
  }
  pending.append(text.substr(e));
}

ChatOutputStream::ChatOutputStream(ChatOutputOptions options) : o_(std::move(options)) {
  if (o_.reasoning == ReasoningFormat::ThinkTags) {
    think_ = o_.starts_in_reasoning ? Think::Inside : Think::Before;
  }
  if (o_.tools == ToolFormat::Llama3) {
    scan_ = Scan::LlamaStart;
  } else if (o_.tools != ToolFormat::None) {
    scan_ = Scan::Text;
  }
}

ChatOutputDelta ChatOutputStream::push(std::string_view piece) {
  if (!finished_) {
    rbuf_.append(piece);
    run(false);
  }
  return std::exchange(out_, {});
}

ChatOutputDelta ChatOutputStream::finish() {
  if (!finished_) {
    run(true);
    finished_ = true;
  }
  return std::exchange(out_, {});
}

void ChatOutputStream::run(bool final) {
  split_reasoning(final);
  if (scan_ == Scan::LlamaStart || scan_ == Scan::LlamaWhole) {
    scan_llama3(final);
  } else {
    while (scan_step(final)) {
    }
  }
}

// Moves rbuf_ into the reasoning and into tbuf_ (the text scanned for tool
// calls), holding back what may be the start of <think> or </think>.
void ChatOutputStream::split_reasoning(bool final) {
  while (true) {
    switch (think_) {
      case Think::Off:
        tbuf_ += rbuf_;
        rbuf_.clear();
        return;
      case Think::After:
        if (skip_space_) {
          rbuf_.erase(0, skip_space(rbuf_, 0));
          if (rbuf_.empty()) return;
          skip_space_ = false;
        }
        tbuf_ += rbuf_;
        rbuf_.clear();
        return;
      case Think::Before:
      case Think::Inside: {
        const bool before = think_ == Think::Before;
        const std::string_view tag = before ? kThinkOpen : kThinkClose;
        const std::string_view buf = rbuf_;
        const size_t p = buf.find(tag);
        const size_t n = p != std::string_view::npos ? p
                         : final                     ? buf.size()
                                                     : buf.size() - partial_marker(buf, tag);
        if (before) {
          tbuf_.append(buf.substr(0, n));
        } else {
          reasoning_.put(buf.substr(0, n), out_.reasoning);
        }
        if (p == std::string_view::npos) {
          rbuf_.erase(0, n);
          return;
        }
        rbuf_.erase(0, p + tag.size());
        think_ = before ? Think::Inside : Think::After;
        skip_space_ = !before;
        break;
      }
    }
  }
}

// Raw text of a tool-call section: dropped when `structural` (markers and
// the whitespace between calls) once a call of the section is accepted,
// content otherwise; held until the section shows which.
void ChatOutputStream::section_text(std::string_view raw, bool structural) {
  if (section_live_) {
    if (!structural) put_content(raw);
    return;
  }
  held_all_.append(raw);
  if (!structural) held_content_.append(raw);
}

// Ends a section: one without an accepted call was never a section, and all
// of its text is content.
void ChatOutputStream::close_section() {
  if (!section_live_) put_content(held_all_);
  held_all_.clear();
  held_content_.clear();
  section_live_ = false;
  scan_ = Scan::Text;
}

// One step of the scan of tbuf_ for tool calls; false when it must wait for
// more text (or, when final, has consumed everything).
bool ChatOutputStream::scan_step(bool final) {
  const Markers& m = markers_of(o_.tools);
  const bool sections = !m.section_begin.empty();
  std::string_view buf = tbuf_;
  switch (scan_) {
    case Scan::Text: {
      const std::string_view opener = sections ? m.section_begin : m.call_begin;
      const size_t p = buf.find(opener);
      if (p == std::string_view::npos) {
        const size_t n = final ? buf.size() : buf.size() - partial_marker(buf, opener);
        put_content(buf.substr(0, n));
        tbuf_.erase(0, n);
        return false;
      }
      put_content(buf.substr(0, p));
      if (sections) {
        section_text(m.section_begin, true);
        tbuf_.erase(0, p + m.section_begin.size());
        scan_ = Scan::InSection;
      } else {
        tbuf_.erase(0, p);
        scan_ = Scan::InCall;
        call_scan_ = 0;
      }
      return true;
    }
    case Scan::InSection: {
      const size_t space = skip_space(buf, 0);
      section_text(buf.substr(0, space), true);
      tbuf_.erase(0, space);
      buf = tbuf_;
      if (buf.starts_with(m.call_begin)) {
        scan_ = Scan::InCall;
        call_scan_ = 0;
        return true;
      }
      if (buf.starts_with(m.section_end)) {
        section_text(m.section_end, true);
        tbuf_.erase(0, m.section_end.size());
        close_section();
        return true;
      }
      if (!final && (m.call_begin.starts_with(buf) || m.section_end.starts_with(buf))) return false;
      // Other text, or the end: the section is over.
      close_section();
      return !tbuf_.empty();
    }
    case Scan::InCall:
      return end_call(final);
    case Scan::Plain:
    default:
      put_content(buf);
      tbuf_.clear();
      return false;
  }
}

// The open call (tbuf_ starts with its opening marker) once its closing
// marker has arrived; at the end, an unterminated call is content.
bool ChatOutputStream::end_call(bool final) {
  const Markers& m = markers_of(o_.tools);
  const bool sections = !m.section_begin.empty();
  const std::string_view buf = tbuf_;
  const size_t p = buf.find(m.call_end, std::max(m.call_begin.size(), call_scan_));
  if (p == std::string_view::npos) {
    if (!final) {
      call_scan_ = buf.size() > m.call_end.size() ? buf.size() - m.call_end.size() : 0;
      return false;
    }
    if (sections) {
      section_text(buf, false);
      tbuf_.clear();
      close_section();
    } else {
      put_content(buf);
      tbuf_.clear();
      scan_ = Scan::Text;
    }
    return false;
  }
  const size_t whole = p + m.call_end.size();
  std::optional<ToolCall> call =
      read_call(buf.substr(m.call_begin.size(), p - m.call_begin.size()), o_);
  if (call) {
    if (sections && !section_live_) {
      put_content(held_content_);
      held_all_.clear();
      held_content_.clear();
      section_live_ = true;
    }
    emit(std::move(*call));
  } else if (sections) {
    section_text(buf.substr(0, whole), false);
  } else {
    put_content(buf.substr(0, whole));
  }
  tbuf_.erase(0, whole);
  scan_ = sections ? Scan::InSection : Scan::Text;
  return true;
}

// Llama 3 writes no markers: a reply that starts with '{' or <|python_tag|>
// is held whole and read at the end; any other reply is content.
void ChatOutputStream::scan_llama3(bool final) {
  if (scan_ == Scan::LlamaStart) {
    const std::string_view rest = std::string_view(tbuf_).substr(skip_space(tbuf_, 0));
    if (rest.starts_with('{') || rest.starts_with(kPythonTag)) {
      scan_ = Scan::LlamaWhole;
    } else if (!final && kPythonTag.starts_with(rest)) {
      return;
    } else {
      scan_ = Scan::Plain;
      put_content(tbuf_);
      tbuf_.clear();
      return;
    }
  }
  if (!final) return;
  if (std::optional<std::vector<ToolCall>> calls = read_llama3(tbuf_, o_)) {
    for (ToolCall& call : *calls) emit(std::move(call));
  } else {
    put_content(tbuf_);
  }
  tbuf_.clear();
}

void ChatOutputStream::emit(ToolCall call) {
  if (call.id.empty()) call.id = o_.id_prefix + std::to_string(next_index_);
  out_.tool_calls.emplace_back(next_index_++, std::move(call));
}

ChatOutput parse_chat_output(std::string_view text, const ChatOutputOptions& options) {
  ChatOutputStream stream(options);
  ChatOutput out;
  for (ChatOutputDelta d : {stream.push(text), stream.finish()}) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (auto& [index, call] : d.tool_calls) out.tool_calls.push_back(std::move(call));
  }
  return out;
}

}  // namespace kvant
