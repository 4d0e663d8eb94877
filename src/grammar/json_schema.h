// JSON Schema (draft 2020-12) to grammar (grammar.h): the structured-output
// compiler behind response_format json_schema and forced tool calls.
//
// Supported keywords: type (a name or a list), enum, const, properties,
// required, additionalProperties, items, prefixItems, minItems, maxItems,
// uniqueItems false, minLength, maxLength, pattern (regex.h), format (date,
// time, date-time, uuid, email, ipv4), minimum / maximum / exclusiveMinimum /
// exclusiveMaximum on integers, anyOf, allOf of one schema, $ref within the
// document (recursion included), $defs / definitions, and the annotations
// (title, description, default, examples, $comment, $schema, $id, ...),
// which constrain nothing. Any other keyword is refused with an error that
// names it and where it is, unless `lenient` (tool parameter schemas, which
// describe rather than require), where it is dropped.
//
// The grammar is sound (every sentence is valid for the schema) but not
// complete where generation wants it so: properties come in the order
// "properties" lists them; an object that lists properties takes no others
// unless additionalProperties says so (OpenAI's strict mode has it false
// anyway; `spec_defaults` restores the specification's "allowed"); an
// integer is written without a fraction and with at most 18 digits, a
// fraction with at most 16 and an exponent with at most 3 (so values fit
// 64-bit integers and doubles, and a model cannot write digits forever);
// whitespace between tokens is at most `max_whitespace` bytes; and with `spec_defaults` off a schema
// without "type" takes the type its keywords imply (properties: object).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/result.h"
#include "grammar/grammar.h"

namespace kvant::grammar {

struct JsonSchemaOptions {
  bool lenient = false;
  bool spec_defaults = false;
  uint32_t max_whitespace = 24;
  uint32_t max_depth = 64;  // nesting of schemas within schemas
};

// Adds rules for `schema` to `g` and returns the rule matching one value.
Result<int32_t> compile_json_schema(const nlohmann::ordered_json& schema, Grammar& g,
                                    const JsonSchemaOptions& o = JsonSchemaOptions());
// The rule of any JSON object (response_format json_object).
Result<int32_t> json_object_rule(Grammar& g, const JsonSchemaOptions& o = JsonSchemaOptions());

// The spelling of integers in [lo, hi]; an absent bound is
// -/+kMaxJsonInteger (18 digits).
inline constexpr int64_t kMaxJsonInteger = 999999999999999999LL;
Expr integer_range_expr(const int64_t* lo, const int64_t* hi);

}  // namespace kvant::grammar
