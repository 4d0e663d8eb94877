// kvant router: one OpenAI-compatible endpoint in front of prefill servers
// and decode servers (kvant serve --role prefill|decode). For each
// completion it picks a prefill server and a decode server, forwards the
// request to the decode server with X-Kvant-Prefill naming the prefill
// server's KV transfer address, and relays the decode server's answer
// (whole or streamed) to the client byte for byte. /health and /metrics are
// its own; /v1/models and /tokenize go to a decode server.
//
// At start it reads every server's /health: roles must be as given and
// every KV layout the same (a difference refuses to start, naming both).
// Afterwards it polls /health every second and sends nothing to a server
// that is down. A decode server that cannot be reached is skipped for the
// next one; a transfer that failed on the prefill side (the decode server
// answers 502 kv_transfer_failed before any token) is retried once on
// another prefill server; a decode server that dies mid-answer ends the
// client's connection (the error, not a hang).
#pragma once

#include <string>
#include <vector>

namespace kvant::router {

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<std::string> prefill, decode;  // http://host:port
  std::string policy = "round-robin";         // or "least-loaded"
  double startup_wait_seconds = 60;           // for the servers to come up
  double health_interval_seconds = 1;
  double timeout_seconds = 600;  // a forwarded request's whole time
  int64_t max_body_bytes = 32 << 20;
};

// Serves until SIGTERM or SIGINT; non-zero when start-up fails.
int run_router(const RouterOptions& options);

}  // namespace kvant::router
