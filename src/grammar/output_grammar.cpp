// Output grammars (output_grammar.h): response formats and tool-call layouts.
#include "grammar/output_grammar.h"

#include <set>

#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace kvant::grammar {

namespace {

using ojson = nlohmann::ordered_json;

class Builder {
 public:
  Builder(const OutputSpec& s, const VocabIndex& v, Grammar& g) : s_(s), v_(v), g_(g) {}

  Result<int32_t> root() {
    auto body = constrained();
    if (!body) return body.error();
    const int32_t r = g_.add_rule("output");
    KV_TRY(g_.define(r, with_reasoning(std::move(*body))));
    return r;
  }

 private:
  // A marker: the special token of that text when the vocabulary has one.
  Expr marker(const std::string& text) {
    if (auto t = v_.special_token(text)) return Expr::token(*t);
    return Expr::lit(text);
  }

  Expr any_text() {
    if (any_ < 0) {
      any_ = g_.add_rule("text");
      (void)g_.define(any_, Expr::star(charset_expr(CharSet::any(), TextMode::Raw).value()));
    }
    return Expr::rule(any_);
  }

  Expr with_reasoning(Expr body) {
    if (s_.reasoning != ReasoningFormat::ThinkTags) return body;
    Expr close = Expr::seq({any_text(), marker("</think>"), Expr::star(Expr::bytes(space()))});
    if (s_.starts_in_reasoning) return Expr::seq({std::move(close), std::move(body)});
    Expr open = Expr::seq({Expr::star(Expr::bytes(space())), marker("<think>"), std::move(close)});
    return Expr::seq({Expr::opt(std::move(open)), std::move(body)});
  }

  static ByteSet space() {
    ByteSet s = ByteSet::of(' ');
    s.add('\n');
    return s;
  }

  Result<Expr> constrained() {
    JsonSchemaOptions jo;
    switch (s_.kind) {
      case OutputSpec::Kind::JsonObject: {
        auto r = json_object_rule(g_, jo);
        if (!r) return r.error();
        return Expr::rule(*r);
      }
      case OutputSpec::Kind::JsonSchema: {
        auto r = compile_json_schema(s_.schema, g_, jo);
        if (!r) return r.error();
        return Expr::rule(*r);
      }
      case OutputSpec::Kind::Regex: {
        RegexOptions ro;
        return compile_regex(s_.regex, g_, ro);
      }
      case OutputSpec::Kind::Choice: {
        std::vector<Expr> alts;
        for (const auto& c : s_.choices) alts.push_back(Expr::lit(c));
        if (alts.empty()) return make_error("the choice list is empty");
        return Expr::alt(std::move(alts));
      }
      case OutputSpec::Kind::ToolCalls:
        return tool_calls();
    }
    return make_error("unknown output kind");
  }

  // The JSON arguments of one function (its parameters schema; lenient
  // unless the function is declared strict).
  Result<Expr> arguments(const ojson& fn) {
    JsonSchemaOptions jo;
    jo.lenient = !(fn.contains("strict") && fn["strict"] == true);
    ojson params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"]
                                                                            : ojson{{"type", "object"}};
    if (!params.contains("type") && !params.contains("$ref") && !params.contains("anyOf")) params["type"] = "object";
    auto r = compile_json_schema(params, g_, jo);
    if (!r) return make_error("tools: function '" + fn.value("name", "") + "': " + r.error().message);
    return Expr::rule(*r);
  }

  // XML-style parameters (GLM, Qwen3-Coder): each declared parameter in
  // order, required ones always; a string value is raw text without '<',
  // any other value JSON of its schema.
  Result<Expr> xml_parameters(const ojson& fn, const Expr& key_open, const Expr& key_close,
                              const Expr& value_close) {
    const ojson params = fn.value("parameters", ojson::object());
    std::set<std::string> required;
    if (params.contains("required") && params["required"].is_array())
      for (const auto& r : params["required"])
        if (r.is_string()) required.insert(r.get<std::string>());
    std::vector<Expr> items;
    if (params.contains("properties") && params["properties"].is_object()) {
      for (const auto& [k, ps] : params["properties"].items()) {
        Expr value;
        if (ps.is_object() && ps.value("type", ojson()) == "string") {
          // Raw text: the listed values as written, else text without '<'.
          std::vector<Expr> listed;
          if (ps.contains("enum") && ps["enum"].is_array())
            for (const auto& v : ps["enum"])
              if (v.is_string() && v.get<std::string>().find('<') == std::string::npos)
                listed.push_back(Expr::lit(v.get<std::string>()));
          value = !listed.empty()
                      ? Expr::alt(std::move(listed))
                      : Expr::star(charset_expr(CharSet::of('<').complement(), TextMode::Raw).value());
        } else {
          JsonSchemaOptions jo;
          jo.lenient = true;
          auto r = compile_json_schema(ps, g_, jo);
          if (!r) return make_error("tools: function '" + fn.value("name", "") + "': " + r.error().message);
          value = Expr::rule(*r);
        }
        Expr pair = Expr::seq({key_open, Expr::lit(k), key_close, std::move(value), value_close});
        items.push_back(required.count(k) ? std::move(pair) : Expr::opt(std::move(pair)));
      }
    }
    return Expr::seq(std::move(items));
  }

  Result<Expr> one_call(const ojson& fn) {
    const std::string name = fn.value("name", "");
    const Expr nl = Expr::opt(Expr::lit("\n"));
    switch (s_.format) {
      case ToolFormat::Hermes: {
        auto a = arguments(fn);
        if (!a) return a.error();
        return Expr::seq({marker("<tool_call>"), Expr::lit("\n{\"name\": \"" + spell(name, TextMode::JsonString) + "\", \"arguments\": "),
                          std::move(*a), Expr::lit("}\n"), marker("</tool_call>")});
      }
      case ToolFormat::Llama3: {
        auto a = arguments(fn);
        if (!a) return a.error();
        return Expr::seq({Expr::lit("{\"name\": \"" + spell(name, TextMode::JsonString) + "\", \"parameters\": "),
                          std::move(*a), Expr::lit("}")});
      }
      case ToolFormat::DeepSeekV3: {
        auto a = arguments(fn);
        if (!a) return a.error();
        return Expr::seq({marker("<｜tool▁call▁begin｜>"), Expr::lit("function"), marker("<｜tool▁sep｜>"),
                          Expr::lit(name + "\n```json\n"), std::move(*a), Expr::lit("\n```"),
                          marker("<｜tool▁call▁end｜>")});
      }
      case ToolFormat::DeepSeekV31: {
        auto a = arguments(fn);
        if (!a) return a.error();
        return Expr::seq({marker("<｜tool▁call▁begin｜>"), Expr::lit(name), marker("<｜tool▁sep｜>"),
                          std::move(*a), marker("<｜tool▁call▁end｜>")});
      }
      case ToolFormat::KimiK2: {
        auto a = arguments(fn);
        if (!a) return a.error();
        return Expr::seq({marker("<|tool_call_begin|>"), Expr::lit("functions." + name + ":"),
                          Expr::repeat(Expr::byte_range('0', '9'), 1, 4), marker("<|tool_call_argument_begin|>"),
                          std::move(*a), marker("<|tool_call_end|>")});
      }
      case ToolFormat::Glm45: {
        // <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n...</tool_call>;
        // GLM-4.7 and later leave the newlines out.
        auto q = xml_parameters_glm(fn);
        if (!q) return q.error();
        return Expr::seq({marker("<tool_call>"), Expr::lit(name), nl, std::move(*q), marker("</tool_call>")});
      }
      case ToolFormat::Qwen3Coder: {
        auto p = xml_parameters(fn, Expr::lit("<parameter="), Expr::lit(">\n"), Expr::lit("\n</parameter>\n"));
        if (!p) return p.error();
        return Expr::seq({marker("<tool_call>"), Expr::lit("\n<function=" + name + ">\n"), std::move(*p),
                          Expr::lit("</function>\n"), marker("</tool_call>")});
      }
      case ToolFormat::None:
        break;
    }
    return make_error("this model has no tool-call format to force a call in");
  }

  Result<Expr> xml_parameters_glm(const ojson& fn) {
    const Expr nl = Expr::opt(Expr::lit("\n"));
    return xml_parameters(fn, marker("<arg_key>"), Expr::seq({marker("</arg_key>"), nl, marker("<arg_value>")}),
                          Expr::seq({marker("</arg_value>"), nl}));
  }

  Result<Expr> tool_calls() {
    if (!s_.tools.is_array() || s_.tools.empty()) return make_error("tool_choice requires 'tools'");
    std::vector<Expr> calls;
    for (const auto& t : s_.tools) {
      const ojson fn = t.value("function", ojson::object());
      if (!s_.function.empty() && fn.value("name", "") != s_.function) continue;
      auto c = one_call(fn);
      if (!c) return c.error();
      calls.push_back(std::move(*c));
    }
    if (calls.empty()) return make_error("tool_choice names the function '" + s_.function + "', which 'tools' does not declare");
    const int32_t call = g_.add_rule("call");
    KV_TRY(g_.define(call, Expr::alt(std::move(calls))));
    const bool many = s_.parallel && s_.format != ToolFormat::Llama3;
    Expr sep = Expr::opt(Expr::lit("\n"));
    Expr list = many ? Expr::seq({Expr::rule(call), Expr::star(Expr::seq({sep, Expr::rule(call)}))}) : Expr::rule(call);
    switch (s_.format) {
      case ToolFormat::DeepSeekV3:
      case ToolFormat::DeepSeekV31:
        return Expr::seq({marker("<｜tool▁calls▁begin｜>"), std::move(list), marker("<｜tool▁calls▁end｜>")});
      case ToolFormat::KimiK2:
        return Expr::seq({marker("<|tool_calls_section_begin|>"), std::move(list), marker("<|tool_calls_section_end|>")});
      default:
        return list;
    }
  }

  const OutputSpec& s_;
  const VocabIndex& v_;
  Grammar& g_;
  int32_t any_ = -1;
};

}  // namespace

std::string OutputSpec::cache_key() const {
  ojson k = ojson::array({int(kind), schema, regex, choices, tools, function, parallel, int(format),
                          int(reasoning), starts_in_reasoning});
  return k.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

Result<std::shared_ptr<CompiledConstraint>> compile_output(const OutputSpec& spec,
                                                           std::shared_ptr<const VocabIndex> vocab) {
  auto g = std::make_shared<Grammar>();
  Builder b(spec, *vocab, *g);
  auto r = b.root();
  if (!r) return r.error();
  KV_TRY(g->finish(*r));
  auto c = std::make_shared<CompiledConstraint>(std::move(g), std::move(vocab));
  if (auto s = c->start(); !s) return s.error();
  return c;
}

}  // namespace kvant::grammar
