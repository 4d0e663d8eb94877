// The server's response pieces that need no socket: model listings, error
// objects, logprobs as text, the engine request of a parsed one and the SSE
// events of one batch of engine events (used by http_server.cpp and
// generate.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/openai_api.h"

namespace kvant::server {

using Headers = std::vector<std::pair<std::string, std::string>>;
// Built outside coroutines: GCC 12 rejects brace-initialised arrays of
// string literals inside a coroutine body.
Headers header(std::string name, std::string value);

nlohmann::json model_json(const std::string& name, int64_t max_context);
nlohmann::json model_list_json(const nlohmann::json& m);
ApiError api_error(int status, std::string message, std::string type, std::string code = "");

// A token as logprobs show it: its text, or "token_id:<id>" when the request asks for ids.
std::string token_text(const Tokenizer& tok, bool as_ids, int32_t id);
// A generated token's logprob and its alternatives, as text.
TokenLogprobText token_logprob_text(const Tokenizer& tok, bool as_ids, const StepLogprobs& s);
// The echoed prompt's tokens with the prompt logprobs `plp` (null: none came).
std::vector<TokenLogprobText> echo_logprobs(const Tokenizer& tok, bool as_ids,
                                            const std::vector<int32_t>& echo_ids,
                                            const PromptLogprobs* plp);
// The engine's request for a parsed one, without its on_event callback.
kvant::Request engine_request(const ParsedRequest& pr, std::vector<int32_t> ids);
// One batch's SSE events of choice `index`; advances `text_offset` past
// the delta. `finished`: this choice's finish chunk follows its text.
// `parsed` (chat output parsing): the delta's reasoning and tool calls,
// `delta` being its content.
std::string sse_events(Endpoint endpoint, const ResponseMeta& meta, const ParsedRequest& pr,
                       int32_t index, bool first_chunk, const std::string& delta,
                       const std::vector<TokenLogprobText>& delta_lps, int64_t& text_offset,
                       bool finished, const std::string& finish, const std::string& error,
                       const std::string& error_code, const ChatOutputDelta* parsed = nullptr);
// The stream's end once every choice finished: the usage chunk when
// stream_options.include_usage asks for it, then [DONE].
std::string sse_tail(Endpoint endpoint, const ResponseMeta& meta, const ParsedRequest& pr,
                     const Usage& usage);
// What a client is told of a failed request: a stable message and code for
// an integrity abort (the page numbers stay in the log), the engine's
// message otherwise.
std::string client_error_text(ErrorCode code, const std::string& engine_message);
const char* client_error_code(ErrorCode code);  // "kv_integrity_error", "engine_error", ""


}  // namespace kvant::server
