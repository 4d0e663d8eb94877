// libFuzzer target for the structured-output compilers (src/grammar): the
// input's first byte picks JSON Schema or a regular expression, the rest
// is the schema text or the pattern. What compiles is finished and matched
// against the input's own bytes and a few JSON values. Schemas and patterns
// come from requests, so nothing may crash, hang or grow without bound:
// every input ends in a grammar or an error with a message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace {

using kvant::grammar::Grammar;
using kvant::grammar::GrammarLimits;
using kvant::grammar::Matcher;
using kvant::grammar::MatcherLimits;

void check_error(const std::string& message) {
  if (message.empty()) std::abort();  // every error says what went wrong
}

void exercise(std::shared_ptr<Grammar> g, std::string_view input) {
  MatcherLimits ml;
  ml.max_nodes = 1 << 16;
  ml.max_states = 1 << 12;
  Matcher m(std::move(g), ml);
  for (std::string_view s : {input, std::string_view("{}"), std::string_view("[1,\"a\",null]"),
                             std::string_view("\"2026-12-05\""), std::string_view("-12.5e3")}) {
    int32_t st = m.start();
    for (unsigned char c : s) {
      if (st < 0) break;
      st = m.step(st, c);
    }
    if (st >= 0) (void)m.accepting(st);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  GrammarLimits gl;
  gl.max_elements = 1 << 18;
  gl.max_rules = 1 << 16;
  gl.max_repeat = 256;
  auto g = std::make_shared<Grammar>(gl);
  int32_t root = -1;
  if (data[0] & 1) {
    kvant::grammar::RegexOptions o;
    o.mode = data[0] & 2 ? kvant::grammar::TextMode::JsonString : kvant::grammar::TextMode::Raw;
    o.search = data[0] & 4;
    o.max_repeat = 256;
    auto e = kvant::grammar::compile_regex(text, *g, o);
    if (!e.ok()) return check_error(e.error().message), 0;
    root = g->add_rule("root");
    if (auto d = g->define(root, *e); !d.ok()) return check_error(d.error().message), 0;
  } else {
    const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) return 0;
    kvant::grammar::JsonSchemaOptions o;
    o.lenient = data[0] & 2;
    o.spec_defaults = data[0] & 4;
    auto r = kvant::grammar::compile_json_schema(schema, *g, o);
    if (!r.ok()) return check_error(r.error().message), 0;
    root = *r;
  }
  if (auto f = g->finish(root); !f.ok()) return check_error(f.error().message), 0;
  exercise(std::move(g), text);
  return 0;
}
