// kvant's OpenAI-compatible HTTP server: /v1/chat/completions,
// /v1/completions (plain and SSE streaming; `echo` with prompt logprobs),
// /v1/models, /tokenize, /health and /metrics (Prometheus text), over
// Boost.Beast on one Asio I/O thread, with request bodies parsed and
// tokenized on a small worker pool and the engine driven by a loop thread of
// its own. It owns HTTP, the OpenAI wire format, admission (Host/Origin, API
// key before the body is read, connection limits and timeouts, a byte
// budget, queue limits by requests and by prompt tokens), client
// disconnects (the request is cancelled) and graceful shutdown on SIGTERM /
// SIGINT (a second signal exits at once). It does not own tokenization policy or chat templates: the caller
// passes a function that turns chat messages into prompt tokens, so this
// layer includes only the engine's public header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "disagg/kv_transport.h"
#include "engine/engine.h"
#include "tokenizer/chat_output.h"

namespace kvant::server {

// A conversation as the chat template sees it: OpenAI message objects
// (role, content as text, tool_calls with their arguments as objects,
// tool_call_id, name, reasoning_content), the request's tools (null: none)
// and the template switches it passed (chat_template_kwargs, such as
// enable_thinking). Keys keep the client's order.
struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};
struct RenderedChat {
  std::vector<int32_t> ids;
  // The prompt ends inside an open <think>: the output begins in reasoning.
  bool starts_in_reasoning = false;
  // The prompt ends with a closed </think>: thinking is off for this answer.
  bool reasoning_done = false;
};
// Renders and tokenizes a conversation with the generation prompt appended.
using ChatRenderer = std::function<Result<RenderedChat>(const ChatInput&)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                 // empty: no authentication
  std::string model_name;              // the id /v1/models lists and requests must name
  int64_t max_body_bytes = 32 << 20;   // larger request bodies get 413
  // Completions' `logprobs` at most (above kMaxTopLogprobs: prompt tokens only).
  int32_t max_logprobs = kMaxTopLogprobs;
  int64_t max_waiting = 1024;          // queued (not yet running) requests before 429
  // Prompt tokens of queued requests before 429; 0: four times the KV
  // cache's token capacity.
  int64_t max_queued_tokens = 0;
  // Bytes all requests together may hold (bodies while read and parsed,
  // then prompt tokens, echo text and the room for their answers); beyond
  // it a request gets 429 with Retry-After (413 when it alone is larger).
  int64_t max_request_bytes = int64_t(1) << 30;
  int64_t max_connections = 4096;         // open connections; over it the longest-idle one closes
  int64_t max_connections_per_address = 512;
  double header_timeout_seconds = 30;     // headers of a request (and keep-alive idle time)
  double body_timeout_seconds = 30;       // a body, plus 1 s per 64 KiB of it
  int workers = 2;                        // threads that parse and tokenize request bodies
  int64_t max_worker_queue = 256;         // their queue, beyond which requests get 503
  // Host / Origin allow-lists (admission.h): empty with a loopback bind
  // means loopback names and origins only.
  std::vector<std::string> allowed_hosts, allowed_origins;
  double shutdown_grace_seconds = 30;  // in-flight requests get this long after SIGTERM
  ChatRenderer render_chat;            // required for /v1/chat/completions
  // How the model writes tool calls and reasoning (tokenizer/chat_output.h):
  // what its output is parsed with, and the layout a forced tool call
  // (tool_choice "required" or a named function) is constrained to. With
  // ToolFormat::None, requests with tools are refused.
  ToolFormat tool_format = ToolFormat::None;
  ReasoningFormat reasoning_format = ReasoningFormat::None;
  // Disaggregated prefill and decode (README: Disaggregated serving).
  // "" (colocated), "prefill" or "decode".
  std::string role;
  // prefill: the KV transfer listener's port (on `host`; 0: any free one).
  int kv_port = 0;
  // decode: the prefill servers' KV transfer addresses ("host:port") this
  // server may pull from; a request names one in its X-Kvant-Prefill header.
  std::vector<std::string> prefill_peers;
  disagg::TcpTransportOptions kv_transport;
  // Called once the port is bound (tests and the CLI print the address).
  std::function<void(const std::string& host, int port)> on_listening;
};

// Serves until SIGTERM or SIGINT; then stops accepting, lets in-flight
// requests finish (cancelling what is left after the grace period) and
// returns 0. Returns non-zero when it cannot bind or the engine fails.
int run_server(Engine& engine, const ServerOptions& options);

}  // namespace kvant::server
