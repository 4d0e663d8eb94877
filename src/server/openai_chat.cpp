// Chat messages, tools and structured-output fields of a request
// (openai_chat.h).
#include "server/openai_chat.h"

#include <set>

namespace kvant::server {
namespace {

using ojson = nlohmann::ordered_json;

ApiError bad(std::string message, std::string param, std::string code = "") {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError unsupported(const std::string& param, const std::string& why = "") {
  return bad("'" + param + "' is not supported by this server" + why, param, "unsupported_parameter");
}

const char* kind(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "a boolean";
    case ojson::value_t::string: return "a string";
    case ojson::value_t::array: return "an array";
    case ojson::value_t::object: return "an object";
    case ojson::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

// Content: a string, or a list of {"type": "text", "text": ...} parts.
std::optional<ApiError> content_text(const ojson& c, const std::string& param, std::string& out) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array())
    return bad("'" + param + "' must be a string or a list of text parts, got " + kind(c), param);
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& part = c[k];
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      return bad(param + "[" + std::to_string(k) +
                     "] must be {\"type\": \"text\", \"text\": string}; other parts are not supported",
                 param);
    out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

// An assistant message's tool_calls, with arguments as objects (what chat
// templates expect) from the JSON text OpenAI's clients send.
std::optional<ApiError> read_tool_calls(const ojson& calls, const std::string& p, ojson& out) {
  if (!calls.is_array()) return bad("'" + p + "' must be an array", p);
  out = ojson::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string q = p + "[" + std::to_string(k) + "]";
    const ojson& c = calls[k];
    if (!c.is_object()) return bad("'" + q + "' must be an object", q);
    for (const auto& [key, v] : c.items())
      if (key != "id" && key != "type" && key != "function" && key != "index" && !v.is_null())
        return unsupported(q + "." + key);
    if (c.contains("type") && c["type"] != "function")
      return bad("'" + q + ".type' must be \"function\"", q + ".type");
    if (!c.contains("function") || !c["function"].is_object())
      return bad("'" + q + ".function' is required and must be an object", q + ".function");
    const ojson& fn = c["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      return bad("'" + q + ".function.name' is required and must be a string", q + ".function.name");
    ojson args = ojson::object();
    if (fn.contains("arguments") && !fn["arguments"].is_null()) {
      const ojson& a = fn["arguments"];
      if (a.is_string()) {
        args = ojson::parse(a.get<std::string>(), nullptr, false);
        if (args.is_discarded() || !args.is_object())
          return bad("'" + q + ".function.arguments' must be a JSON object (as text)", q + ".function.arguments");
      } else if (a.is_object()) {
        args = a;
      } else {
        return bad("'" + q + ".function.arguments' must be a JSON object as text", q + ".function.arguments");
      }
    }
    ojson t = ojson::object();
    if (c.contains("id") && c["id"].is_string()) t["id"] = c["id"];
    t["type"] = "function";
    t["function"] = {{"name", fn["name"]}, {"arguments", std::move(args)}};
    out.push_back(std::move(t));
  }
  return std::nullopt;
}

std::optional<ApiError> read_message(const ojson& msg, size_t i, ojson& out) {
  const std::string p = "messages[" + std::to_string(i) + "]";
  if (!msg.is_object()) return bad("'" + p + "' must be an object", p);
  auto role = msg.find("role");
  if (role == msg.end() || !role->is_string())
    return bad("'" + p + ".role' is required and must be a string", p + ".role");
  const std::string rs = role->get<std::string>();
  if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer" && rs != "tool")
    return bad("'" + p + ".role' must be system, developer, user, assistant or tool, got '" + rs + "'",
               p + ".role");
  out = ojson::object();
  out["role"] = rs == "developer" ? "system" : rs;
  auto c = msg.find("content");
  const bool has_calls = msg.contains("tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
  if (c == msg.end() || c->is_null()) {
    if (rs != "assistant") return bad("'" + p + ".content' is required", p + ".content");
    // An assistant turn that only calls tools: templates read its content
    // as a string (Qwen3's tests it for </think>), so it is "".
    out["content"] = "";
  } else {
    std::string text;
    if (auto e = content_text(*c, p + ".content", text)) return e;
    out["content"] = std::move(text);
  }
  for (const auto& [k, v] : msg.items()) {
    if (k == "role" || k == "content" || v.is_null()) continue;
    const std::string q = p + "." + k;
    if (k == "name") {
      if (!v.is_string()) return bad("'" + q + "' must be a string", q);
      out["name"] = v;
    } else if (k == "tool_calls") {
      if (rs != "assistant") return bad("'" + q + "' is allowed on assistant messages only", q);
      if (!has_calls) continue;
      ojson calls;
      if (auto e = read_tool_calls(v, q, calls)) return e;
      out["tool_calls"] = std::move(calls);
    } else if (k == "tool_call_id") {
      if (rs != "tool") return bad("'" + q + "' is allowed on tool messages only", q);
      if (!v.is_string()) return bad("'" + q + "' must be a string", q);
      out["tool_call_id"] = v;
    } else if (k == "reasoning_content" || k == "reasoning") {
      if (rs != "assistant") return bad("'" + q + "' is allowed on assistant messages only", q);
      if (!v.is_string()) return bad("'" + q + "' must be a string", q);
      out["reasoning_content"] = v;
    } else {
      return unsupported(q);
    }
  }
  return std::nullopt;
}

// A function's name as OpenAI allows it: letters, digits, '_', '-' and '.'.
bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
  return true;
}

std::optional<ApiError> read_tool_list(const ojson& tools, std::set<std::string>& names) {
  if (!tools.is_array()) return bad(std::string("'tools' must be an array, got ") + kind(tools), "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    if (!t.is_object()) return bad("'" + p + "' must be an object", p);
    if (t.value("type", ojson()) != "function")
      return bad("'" + p + ".type' must be \"function\" (the only tool type supported)", p + ".type");
    for (const auto& [k, v] : t.items())
      if (k != "type" && k != "function" && !v.is_null()) return unsupported(p + "." + k);
    if (!t.contains("function") || !t["function"].is_object())
      return bad("'" + p + ".function' is required and must be an object", p + ".function");
    const ojson& fn = t["function"];
    for (const auto& [k, v] : fn.items()) {
      if (v.is_null()) continue;
      if (k == "name" || k == "description" || k == "parameters" || k == "strict") continue;
      return unsupported(p + ".function." + k);
    }
    if (!fn.contains("name") || !fn["name"].is_string() || !valid_name(fn["name"].get<std::string>()))
      return bad("'" + p + ".function.name' must be 1 to 64 letters, digits, '_', '-' or '.'", p + ".function.name");
    if (!names.insert(fn["name"].get<std::string>()).second)
      return bad("'tools' declares the function '" + fn["name"].get<std::string>() + "' twice", p + ".function.name");
    if (fn.contains("description") && !fn["description"].is_null() && !fn["description"].is_string())
      return bad("'" + p + ".function.description' must be a string", p + ".function.description");
    if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object())
      return bad("'" + p + ".function.parameters' must be a JSON Schema object", p + ".function.parameters");
    if (fn.contains("strict") && !fn["strict"].is_null() && !fn["strict"].is_boolean())
      return bad("'" + p + ".function.strict' must be a boolean", p + ".function.strict");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_chat_messages(const ojson& body, ParsedRequest& r) {
  auto m = body.find("messages");
  if (m == body.end() || m->is_null()) return bad("'messages' is required", "messages");
  if (!m->is_array()) return bad(std::string("'messages' must be an array, got ") + kind(*m), "messages");
  if (m->empty()) return bad("'messages' must not be empty", "messages");
  r.chat.messages = ojson::array();
  for (size_t i = 0; i < m->size(); ++i) {
    ojson out;
    if (auto e = read_message((*m)[i], i, out)) return e;
    r.chat_bytes += int64_t(out.dump(-1, ' ', false, ojson::error_handler_t::replace).size());
    r.chat.messages.push_back(std::move(out));
  }
  return std::nullopt;
}

std::optional<ApiError> read_tools(const ojson& body, ParsedRequest& r) {
  std::set<std::string> names;
  const ojson* tools = nullptr;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (auto e = read_tool_list(*t, names)) return e;
    if (!t->empty()) tools = &*t;
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "auto") r.tool_choice = ParsedRequest::ToolChoice::Auto;
      else if (s == "none") r.tool_choice = ParsedRequest::ToolChoice::None;
      else if (s == "required") r.tool_choice = ParsedRequest::ToolChoice::Required;
      else return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}, got \"" + s + "\"", "tool_choice");
    } else if (c->is_object() && c->value("type", ojson()) == "function" && c->contains("function") &&
               (*c)["function"].is_object() && (*c)["function"].contains("name") &&
               (*c)["function"]["name"].is_string()) {
      r.tool_choice = ParsedRequest::ToolChoice::Function;
      r.tool_function = (*c)["function"]["name"].get<std::string>();
      if (!names.count(r.tool_function))
        return bad("'tool_choice' names the function '" + r.tool_function + "', which 'tools' does not declare", "tool_choice");
    } else {
      return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
    }
    if (!tools && r.tool_choice == ParsedRequest::ToolChoice::Required)
      return bad("'tool_choice' \"required\" needs 'tools'", "tool_choice");
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) return bad(std::string("'parallel_tool_calls' must be a boolean, got ") + kind(*p), "parallel_tool_calls");
    r.parallel_tool_calls = p->get<bool>();
  }
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) return bad(std::string("'chat_template_kwargs' must be an object, got ") + kind(*k), "chat_template_kwargs");
    for (const auto& [key, v] : k->items()) {
      (void)v;
      if (key == "messages" || key == "tools" || key == "add_generation_prompt" || key == "documents")
        return bad("'chat_template_kwargs." + key + "' is set by the request itself", "chat_template_kwargs." + key);
    }
    r.chat.kwargs = *k;
  }
  // tool_choice "none": the model is not shown the tools.
  if (tools && r.tool_choice != ParsedRequest::ToolChoice::None) r.chat.tools = *tools;
  else if (!tools && r.tool_choice == ParsedRequest::ToolChoice::Auto) r.tool_choice = ParsedRequest::ToolChoice::None;
  return std::nullopt;
}

namespace {

// A schema given as an object (or a boolean), or as JSON text.
std::optional<ApiError> schema_value(const ojson& v, const std::string& param, ojson& out) {
  if (v.is_string()) {
    out = ojson::parse(v.get<std::string>(), nullptr, false);
    if (out.is_discarded()) return bad("'" + param + "' is not valid JSON", param);
  } else {
    out = v;
  }
  if (!out.is_object() && !out.is_boolean()) return bad("'" + param + "' must be a JSON Schema object", param);
  return std::nullopt;
}

std::optional<ApiError> choice_list(const ojson& v, const std::string& param, std::vector<std::string>& out) {
  if (!v.is_array() || v.empty()) return bad("'" + param + "' must be a non-empty list of strings", param);
  for (const auto& c : v) {
    if (!c.is_string()) return bad("'" + param + "' must be a non-empty list of strings", param);
    out.push_back(c.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> read_response_format(const ojson& rf, grammar::OutputSpec& spec, bool& set) {
  if (!rf.is_object()) return bad(std::string("'response_format' must be an object, got ") + kind(rf), "response_format");
  const ojson type = rf.value("type", ojson());
  if (type == "text") {
    for (const auto& [k, v] : rf.items())
      if (k != "type" && !v.is_null()) return unsupported("response_format." + k);
    return std::nullopt;
  }
  if (type == "json_object") {
    for (const auto& [k, v] : rf.items())
      if (k != "type" && !v.is_null()) return unsupported("response_format." + k);
    spec.kind = grammar::OutputSpec::Kind::JsonObject;
    set = true;
    return std::nullopt;
  }
  if (type != "json_schema")
    return bad("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
  for (const auto& [k, v] : rf.items())
    if (k != "type" && k != "json_schema" && !v.is_null()) return unsupported("response_format." + k);
  const ojson js = rf.value("json_schema", ojson());
  if (!js.is_object()) return bad("'response_format.json_schema' is required and must be an object", "response_format.json_schema");
  for (const auto& [k, v] : js.items()) {
    if (v.is_null()) continue;
    if (k == "name" || k == "description") {
      if (!v.is_string()) return bad("'response_format.json_schema." + k + "' must be a string", "response_format.json_schema." + k);
    } else if (k == "strict") {
      if (!v.is_boolean()) return bad("'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict");
    } else if (k != "schema") {
      return unsupported("response_format.json_schema." + k);
    }
  }
  if (!js.contains("schema") || js["schema"].is_null())
    return bad("'response_format.json_schema.schema' is required", "response_format.json_schema.schema");
  if (auto e = schema_value(js["schema"], "response_format.json_schema.schema", spec.schema)) return e;
  spec.kind = grammar::OutputSpec::Kind::JsonSchema;
  set = true;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_output_format(const ojson& body, ParsedRequest& r) {
  grammar::OutputSpec spec;
  std::string from;
  auto take = [&](const std::string& name) -> std::optional<ApiError> {
    if (!from.empty())
      return bad("'" + name + "' and '" + from + "' both constrain the output; give one", name);
    from = name;
    return std::nullopt;
  };
  for (const auto& [k, v] : body.items()) {
    if (v.is_null()) continue;
    if (k == "response_format") {
      bool set = false;
      if (auto e = read_response_format(v, spec, set)) return e;
      if (set) if (auto e = take(k)) return e;
    } else if (k == "structured_outputs") {
      if (!v.is_object()) return bad(std::string("'structured_outputs' must be an object, got ") + kind(v), k);
      for (const auto& [sk, sv] : v.items()) {
        if (sv.is_null()) continue;
        const std::string p = "structured_outputs." + sk;
        if (sk == "json") {
          if (auto e = schema_value(sv, p, spec.schema)) return e;
          spec.kind = grammar::OutputSpec::Kind::JsonSchema;
        } else if (sk == "regex") {
          if (!sv.is_string()) return bad("'" + p + "' must be a string", p);
          spec.kind = grammar::OutputSpec::Kind::Regex;
          spec.regex = sv.get<std::string>();
        } else if (sk == "choice") {
          if (auto e = choice_list(sv, p, spec.choices)) return e;
          spec.kind = grammar::OutputSpec::Kind::Choice;
        } else {
          return unsupported(p, " (structured_outputs takes one of json, regex, choice)");
        }
        if (auto e = take(p)) return e;
      }
    } else if (k == "guided_json") {
      if (auto e = schema_value(v, k, spec.schema)) return e;
      spec.kind = grammar::OutputSpec::Kind::JsonSchema;
      if (auto e = take(k)) return e;
    } else if (k == "guided_regex") {
      if (!v.is_string()) return bad("'guided_regex' must be a string", k);
      spec.kind = grammar::OutputSpec::Kind::Regex;
      spec.regex = v.get<std::string>();
      if (auto e = take(k)) return e;
    } else if (k == "guided_choice") {
      if (auto e = choice_list(v, k, spec.choices)) return e;
      spec.kind = grammar::OutputSpec::Kind::Choice;
      if (auto e = take(k)) return e;
    }
  }
  if (!from.empty()) {
    r.output = std::move(spec);
    r.output_param = from;
  }
  return std::nullopt;
}

}  // namespace kvant::server
