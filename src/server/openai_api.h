// The OpenAI wire format for kvant's server: request bodies of
// /v1/chat/completions and /v1/completions parsed and checked into a
// ParsedRequest (or an ApiError naming the field, with its HTTP status), and
// the JSON of responses, stream chunks and error objects. Pure functions over
// strings and JSON: no sockets and no engine calls (/tokenize is given the
// tokenizer).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/output_grammar.h"
#include "server/server.h"

namespace kvant::server {

// The most choices one request may ask for ('n').
inline constexpr int32_t kMaxChoices = 64;

// Choice i's seed when a request asks for n > 1 choices with a seed:
// choice 0 keeps the request's seed, the others get distinct ones derived
// from it (so the whole answer repeats for the same seed).
uint64_t choice_seed(uint64_t seed, int32_t choice);

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};
// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

enum class Endpoint { Chat, Completion };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;
  ChatInput chat;                   // chat: messages, tools, template switches
  int64_t chat_bytes = 0;           // the conversation's size, for the prompt size cap
  // Tool calling (chat): tool_choice "auto" (the model decides; its calls
  // are parsed), "none" (tools are not shown and nothing is parsed),
  // "required" (at least one call, enforced) or a named function (enforced).
  enum class ToolChoice { Auto, None, Required, Function };
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_function;        // ToolChoice::Function
  bool parallel_tool_calls = true;  // false: at most one call
  // Structured output: what the output must be (response_format, or the
  // structured_outputs / guided_* extensions); unset: free text. Tool-call
  // constraints are added once the prompt is rendered.
  std::optional<grammar::OutputSpec> output;
  std::string output_param;         // the field it came from, for errors
  // Filled in when the request is prepared: the compiled constraint every
  // choice starts its own copy of, and how its output is parsed.
  std::shared_ptr<grammar::CompiledConstraint> constraint;
  bool parse_output = false;        // chat: split reasoning / tool calls out of the text
  bool reasoning_done = false;      // the prompt closed reasoning: no thinking first
  ChatOutputOptions output_options;
  std::string prompt;               // completions, text prompt
  std::vector<int32_t> prompt_ids;  // completions, a prompt given as token ids
  bool prompt_is_ids = false;
  SamplingParams sampling;
  StopParams stop;
  int32_t max_tokens = 0;  // 0: up to the context
  // Choices sampled from the one prompt (1..kMaxChoices). Choice i > 0
  // samples with its own seed (choice_seed) and reuses the prompt's pages.
  int32_t n = 1;
  int32_t best_of = 0;  // completions: 0 = absent, else equal to n
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  std::string user;
  // Completions only. echo: the prompt comes back before the completion,
  // with its tokens' logprobs when `logprobs` is set (the first token has
  // none); max_tokens 0 is then allowed and generates nothing.
  bool echo = false;
  bool prompt_only = false;  // echo with max_tokens 0
  // Not OpenAI's: the first prompt token whose logprob is computed (default
  // 1); tokens before it are echoed with null logprobs and may come from the
  // prefix cache, which makes scoring a continuation after a long shared
  // context cheap.
  int64_t prompt_logprobs_from = 1;
  // vLLM's: tokens in logprobs are written "token_id:<id>" instead of text.
  bool tokens_as_ids = false;
  // Not OpenAI's: speculative decoding by prompt lookup ("speculative"),
  // off unless asked for. The output is the same either way.
  SpeculativeParams speculative;
};
// Draft tokens per step when a request asks for speculative decoding
// without naming a count.
constexpr int32_t kDefaultSpeculativeTokens = 4;

// Parses and checks a request body; `model_name` is the one model served.
// A field this server does not read is refused (400, naming it, code
// unsupported_parameter) unless it is null or asks for nothing (no tools,
// response_format text, store false).
struct ParseOutcome {
  std::optional<ParsedRequest> request;
  ApiError error;
};
// `max_logprobs`: the most alternatives per token a request may ask for
// (completions' `logprobs`; more than kMaxTopLogprobs only for the prompt's
// tokens, with echo and max_tokens 0).
ParseOutcome parse_request(Endpoint endpoint, std::string_view body, const std::string& model_name,
                           int32_t max_logprobs = kMaxTopLogprobs);

// POST /tokenize (vLLM's form): {"prompt": text, "add_special_tokens": true,
// "model": optional, "parse_special": true (kvant's)} -> {"tokens": [...], "count": n, "max_model_len": ctx}.
// `error.message` is empty on success.
struct TokenizeOutcome {
  nlohmann::json response;
  ApiError error;
};
TokenizeOutcome tokenize_request(std::string_view body, const std::string& model_name,
                                 const Tokenizer& tok, int64_t max_model_len);

// One generated token's logprobs, as text, for the response.
struct TokenLogprobText {
  std::string token;  // the token's bytes (may be part of a UTF-8 character)
  float logprob = 0;
  bool has_logprob = true;  // false: an echoed prompt token without one (null)
  std::vector<std::pair<std::string, float>> top;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);

// The logprobs object of a choice for these tokens (chat or legacy
// completions layout); `text_offset` is where the first token's text begins
// (completions only).
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobText>& tokens,
                             int64_t text_offset);

struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// One choice of a whole response.
struct ChoiceResult {
  std::string text;
  std::vector<TokenLogprobText> logprobs;
  std::string finish, error, error_code;
  // Chat output that was parsed (ParsedRequest::parse_output): `text` is
  // then the content, beside the reasoning and the tool calls.
  bool parsed = false;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};
// A whole (non-streamed) response with these choices (index = position).
nlohmann::json full_response(Endpoint endpoint, const ResponseMeta& meta,
                             std::span<const ChoiceResult> choices, bool with_logprobs,
                             const Usage& usage);
// A whole (non-streamed) response of one choice. A failed request's choice carries
// {"error": {"message": error, "type": "server_error", "code": error_code}}.
nlohmann::json full_response(Endpoint endpoint, const ResponseMeta& meta, const std::string& text,
                             const std::vector<TokenLogprobText>* logprobs,
                             std::string_view finish_reason, std::string_view error,
                             const Usage& usage, std::string_view error_code = "");
// One stream chunk: a text delta (first: with the assistant role), and/or a
// finish; `logprobs` may be null.
// `parsed` (chat output parsing): the delta's reasoning and tool calls,
// with `text` its content.
nlohmann::json stream_chunk(Endpoint endpoint, const ResponseMeta& meta, bool first,
                            const std::string& text, const std::vector<TokenLogprobText>* logprobs,
                            int64_t text_offset, std::string_view finish_reason,
                            std::string_view error, std::string_view error_code = "",
                            int32_t index = 0, const ChatOutputDelta* parsed = nullptr);
// An OpenAI tool call object: {"id", "type": "function", "function": {"name", "arguments"}}
// (streamed: with its "index" first).
nlohmann::json tool_call_json(const ToolCall& c, int index = -1);
// The last chunk when stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage);

// JSON text that never throws on bytes that are not UTF-8 (they become U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace kvant::server
