// A Jinja2 interpreter for chat templates: the language subset published
// chat templates use, rendered byte for byte as Python's jinja2 renders it
// under transformers' settings (apply_chat_template: an immutable sandbox,
// trim_blocks and lstrip_blocks on, the loop controls break/continue, the
// generation tag, and the globals raise_exception, strftime_now,
// namespace and dict, with tojson being json.dumps(..., ensure_ascii=False)).
//
// Supported: {{ }}, {% %}, {# #} with -/+ whitespace control; if/elif/else,
// for (else, filter condition, loop.*, tuple targets, break, continue),
// set (tuples, namespace attributes, block form), macro (defaults, varargs,
// kwargs, caller), call, filter blocks, with, block, print; the operators,
// literals, attribute/item/slice access, Python string/dict/list methods and
// the filters and tests of jinja2 that templates use. Not supported:
// template inheritance and includes (extends, include, import), recursive
// loops, and a few rarely used filters (groupby, wordwrap, urlize, ...),
// which fail with a message naming them. Python ints are 64-bit here
// (overflow is an error) and case mapping covers Latin, Greek and Cyrillic.
//
// Rendering is bounded: output size, total work (loop iterations, calls,
// data built) and nesting depth each stop a hostile template with an error.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/result.h"

namespace kvant::jinja {

struct Limits {
  size_t max_output_bytes = size_t(16) << 20;  // rendered text, and any one string built
  uint64_t max_work =
      50'000'000;       // loop iterations + calls + (bytes built / 64) + (values built / 16)
  int max_depth = 400;  // nested statements, expressions and macro calls
};

// Parsed once, a Template may be rendered by several threads at once.
class Template {
 public:
  // Parses once; a syntax error names its line and column.
  static Result<Template> parse(std::string_view text);

  // Renders with the variables of `context` (a JSON object; key order is
  // kept, so that tojson prints objects as they were given). Errors name the
  // template line; raise_exception(msg) fails with msg.
  Result<std::string> render(const nlohmann::ordered_json& context,
                             const Limits& limits = Limits()) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kvant::jinja
