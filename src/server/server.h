// kvant's OpenAI-compatible HTTP server: /v1/chat/completions,
// /v1/completions (plain and SSE streaming; `echo` with prompt logprobs),
// /v1/models, /tokenize, /health and /metrics (Prometheus text), over Boost.Beast on one Asio I/O thread, with
// the engine driven by a loop thread of its own. It owns HTTP, the OpenAI
// wire format, admission (API key, body limit, waiting-queue limit), client
// disconnects (the request is cancelled) and graceful shutdown on SIGTERM /
// SIGINT. It does not own tokenization policy or chat templates: the caller
// passes a function that turns chat messages into prompt tokens, so this
// layer includes only the engine's public header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace kvant::server {

// (role, content) pairs in order.
using ChatMessages = std::vector<std::pair<std::string, std::string>>;
// Renders and tokenizes a conversation with the generation prompt appended.
using ChatRenderer = std::function<Result<std::vector<int32_t>>(const ChatMessages&)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                 // empty: no authentication
  std::string model_name;              // the id /v1/models lists and requests must name
  int64_t max_body_bytes = 32 << 20;   // larger request bodies get 413
  // Completions' `logprobs` at most (above kMaxTopLogprobs: prompt tokens only).
  int32_t max_logprobs = kMaxTopLogprobs;
  int64_t max_waiting = 1024;          // queued (not yet running) requests before 429
  double shutdown_grace_seconds = 30;  // in-flight requests get this long after SIGTERM
  ChatRenderer render_chat;            // required for /v1/chat/completions
  // Called once the port is bound (tests and the CLI print the address).
  std::function<void(const std::string& host, int port)> on_listening;
};

// Serves until SIGTERM or SIGINT; then stops accepting, lets in-flight
// requests finish (cancelling what is left after the grace period) and
// returns 0. Returns non-zero when it cannot bind or the engine fails.
int run_server(Engine& engine, const ServerOptions& options);

}  // namespace kvant::server
