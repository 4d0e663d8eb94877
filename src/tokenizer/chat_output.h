// Parsing of a chat model's generated text into the parts of an OpenAI chat
// completion message: reasoning ("reasoning_content"), content and tool
// calls. Each tool-call format is the one a family's chat template renders
// for an assistant message's tool_calls (tests/fixtures/jinja/templates),
// since that is what the model was trained to emit:
//
//   Hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//                (Qwen2.5, Qwen3 and Qwen3-MoE chat models; one block per call)
//   Qwen3Coder   <tool_call>\n<function=f>\n<parameter=k>\nvalue\n</parameter>\n
//                </function>\n</tool_call>   (Qwen3-Coder)
//   Llama3       the whole reply is {"name": "f", "parameters": {...}}, optionally
//                after <|python_tag|>; several calls separated by ';'
//   DeepSeekV3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n
//                ```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//                (DeepSeek V3 and R1; their template is not among the fixtures)
//   DeepSeekV31  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}
//                <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   KimiK2       <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
//                <|tool_call_argument_begin|>{...}<|tool_call_end|>...
//                <|tool_calls_section_end|>
//   Glm45        <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
//                (GLM-4.5/4.6 put newlines between the parts, GLM-4.7/5 do not)
//
// Reasoning (ReasoningFormat::ThinkTags) is the text of the first <think>
// ... </think> block; text before <think> is content. With
// starts_in_reasoning the output begins inside the block, and without a
// </think> the rest of the output is reasoning. Output that cannot be read
// as a tool call is never dropped and never an error: it stays in the
// content, verbatim.
//
// ChatOutputStream does the work; parse_chat_output() is one push of the
// whole text followed by finish(), so a stream's deltas, concatenated, equal
// the parse of the whole text however the text was split.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace kvant {

enum class ToolFormat { None, Hermes, Qwen3Coder, Llama3, DeepSeekV3, DeepSeekV31, KimiK2, Glm45 };
enum class ReasoningFormat { None, ThinkTags };

// From a --tool-parser name: hermes, qwen3_coder, llama3_json, deepseek_v3,
// deepseek_v31, kimi_k2, glm45, none. The error lists the choices.
Result<ToolFormat> tool_format_from_name(std::string_view name);
// The --tool-parser name of a format (tool_format_from_name's inverse).
std::string_view tool_format_name(ToolFormat format);

// The format a chat template renders tool calls in, from the markers in its
// text; None when the template renders no tool calls kvant can read.
ToolFormat detect_tool_format(std::string_view chat_template);
// ThinkTags when the template handles <think> tags or reasoning_content.
ReasoningFormat detect_reasoning_format(std::string_view chat_template);
// Whether a rendered prompt ends inside an unclosed <think> (trailing
// whitespace aside), so the model's output begins in its reasoning: the
// value for ChatOutputOptions::starts_in_reasoning.
bool prompt_opens_reasoning(std::string_view rendered_prompt);
// Whether a rendered prompt ends with a closed </think> (the template turned
// thinking off, as Qwen3's enable_thinking=false does with an empty block):
// the output is the answer, without reasoning.
bool prompt_closes_reasoning(std::string_view rendered_prompt);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // compact JSON text of an object, e.g. {"city":"Paris"}
  bool operator==(const ToolCall&) const = default;
};

struct ChatOutput {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ChatOutput&) const = default;
};

struct ChatOutputOptions {
  ToolFormat tools = ToolFormat::None;  // None: no tool-call parsing
  ReasoningFormat reasoning = ReasoningFormat::None;
  // The prompt ended with an unclosed <think>: the output begins inside the
  // reasoning, without an opening tag.
  bool starts_in_reasoning = false;
  // The request's "tools" array ([{"type": "function", "function": {"name",
  // "parameters"}}, ...]); may be null. When it is a non-empty array, a call
  // naming a function not in it is not accepted. The declared parameter
  // types convert the raw text values of Qwen3Coder and Glm45 to JSON.
  nlohmann::ordered_json tool_schemas;
  // Call ids are id_prefix + the call's index in the response ("call_0",
  // "call_1", ...), except Kimi K2's, which are the model's own
  // "functions.name:N" strings.
  std::string id_prefix = "call_";
};

// What became final in one push: text to append to the reasoning and the
// content, and the tool calls completed, each whole, with its index among
// the response's tool calls.
struct ChatOutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<std::pair<int, ToolCall>> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Incremental parser for text arriving in pieces. Text that may be the start
// of a marker is held back until the following text settles it; a tool call
// comes out once its closing marker has arrived (Llama3's, whose reply has no
// closing marker, at finish()). finish() flushes what is held: an
// unterminated tool call comes out as content, as written. A DeepSeek or
// Kimi tool-call section is content as written, markers included, until one
// of its calls is accepted; from then on its markers and the whitespace
// between its calls are dropped, and only rejected calls stay content.
//
// Whitespace rules, the same for any split: reasoning is stripped of leading
// and trailing whitespace; content is stripped of leading and trailing
// whitespace (so content that is only whitespace, as between tool calls,
// comes out empty) and of the whitespace right after </think>.
class ChatOutputStream {
 public:
  explicit ChatOutputStream(ChatOutputOptions options);

  ChatOutputDelta push(std::string_view piece);
  // Ends the text; later pushes are ignored and return nothing.
  ChatOutputDelta finish();

 private:
  enum class Think { Off, Before, Inside, After };
  enum class Scan { Plain, Text, InSection, InCall, LlamaStart, LlamaWhole };

  // Appends text to an output with leading whitespace dropped and trailing
  // whitespace held back until non-whitespace text follows it.
  struct TrimmedSink {
    bool started = false;
    std::string pending;
    void put(std::string_view text, std::string& out);
  };

  void run(bool final);
  void split_reasoning(bool final);
  bool scan_step(bool final);
  bool end_call(bool final);
  void scan_llama3(bool final);
  void emit(ToolCall call);
  void put_content(std::string_view text) { content_.put(text, out_.content); }
  void section_text(std::string_view raw, bool structural);
  void close_section();

  ChatOutputOptions o_;
  std::string rbuf_;  // text not yet split into reasoning and the rest
  std::string tbuf_;  // text after the reasoning split, not yet scanned for tool calls
  Think think_ = Think::Off;
  Scan scan_ = Scan::Plain;
  bool skip_space_ = false;  // drop the whitespace right after </think>
  size_t call_scan_ = 0;     // where to resume looking for the end of the open call
  // A tool-call section (DeepSeek, Kimi) stays raw text until one of its
  // calls is accepted: held_all_ is all of it so far, held_content_ the part
  // that is content either way (rejected calls).
  bool section_live_ = false;
  std::string held_all_;
  std::string held_content_;
  int next_index_ = 0;
  bool finished_ = false;
  TrimmedSink reasoning_;
  TrimmedSink content_;
  ChatOutputDelta out_;
};

ChatOutput parse_chat_output(std::string_view text, const ChatOutputOptions& options);

}  // namespace kvant
