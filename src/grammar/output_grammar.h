// The grammars a chat request's output is held to: a JSON schema or any
// JSON object (response_format), a regular expression or a choice list
// (kvant's extensions), and forced tool calls (tool_choice "required" or a
// named function) written in the model family's own tool-call format
// (tokenizer/chat_output.h), which is what its parser reads back.
//
// Markers such as <|tool_call_begin|> are the model's special token when
// its vocabulary has one with that text, and plain bytes otherwise. For a
// model that thinks in <think> tags the constrained part may be preceded
// by its reasoning: free text up to </think> (required when the prompt
// already opened the tag).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/result.h"
#include "grammar/grammar.h"
#include "grammar/token_constraint.h"
#include "tokenizer/chat_output.h"

namespace kvant::grammar {

struct OutputSpec {
  enum class Kind { JsonObject, JsonSchema, Regex, Choice, ToolCalls };
  Kind kind = Kind::JsonObject;
  nlohmann::ordered_json schema;     // JsonSchema
  std::string regex;                 // Regex
  std::vector<std::string> choices;  // Choice
  // ToolCalls: the request's tools, the one function to call ("" = any),
  // whether several calls may come, and the format.
  nlohmann::ordered_json tools;
  std::string function;
  bool parallel = true;
  ToolFormat format = ToolFormat::None;
  ReasoningFormat reasoning = ReasoningFormat::None;
  bool starts_in_reasoning = false;
  // A key naming everything above, for caching compiled grammars.
  std::string cache_key() const;
};

// Compiles `spec` for `vocab`. Errors are the client's (a bad schema, an
// unsupported keyword, a format without forced tool calls).
Result<std::shared_ptr<CompiledConstraint>> compile_output(const OutputSpec& spec,
                                                           std::shared_ptr<const VocabIndex> vocab);

}  // namespace kvant::grammar
