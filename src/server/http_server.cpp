// HTTP transport of the server (see server.h and http_internal.h):
// connections and their limits, header checks before a body is read,
// routing, one exception boundary per connection, and graceful shutdown.
// Completions are in generate.cpp.
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "disagg/kv_wire.h"
#include "server/http_internal.h"

namespace kvant::server {
namespace {

std::string_view sv(beast::string_view v) { return {v.data(), v.size()}; }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(int64_t(seconds * 1000));
}

bool loopback_address(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  auto a = asio::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

// The most prompt text (bytes) that could still fit `ctx` tokens: no token
// of the vocabulary spells more than its longest piece.
int64_t max_prompt_bytes(const Tokenizer& tok, int64_t ctx) {
  size_t longest = 1;
  for (int32_t i = 0; i < tok.vocab_size(); ++i)
    longest = std::max({longest, tok.token_piece(i).size(), tok.token_text(i).size()});
  return ctx * int64_t(longest);
}

// A file-descriptor limit as high as allowed: each connection holds one.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &r);
  }
}

}  // namespace

Server::Server(Engine& engine, const ServerOptions& options)
    : engine_(engine),
      opt_(options),
      loop_(engine, metrics_),
      budget_(options.max_request_bytes),
      limits_(options.max_connections, options.max_connections_per_address),
      workers_(size_t(std::max(1, options.workers))),
      acceptor_(io_),
      signals_(io_) {
  origins_.loopback_bind = loopback_address(opt_.host);
  origins_.allowed_hosts = opt_.allowed_hosts;
  origins_.allowed_origins = opt_.allowed_origins;
  if (opt_.max_queued_tokens <= 0) opt_.max_queued_tokens = 4 * engine_.capacity().tokens;
  max_prompt_bytes_ = max_prompt_bytes(engine_.tokenizer(), engine_.capacity().max_context);
}

Server::~Server() {
  workers_.stop();
  workers_.join();
}

ServerGauges Server::gauges() const {
  ServerGauges g;
  g.queued = queued_.load();
  g.in_flight = in_flight_.load();
  g.queued_tokens = queued_tokens_.load();
  g.held_bytes = budget_.used();
  g.held_bytes_limit = budget_.limit();
  g.connections = limits_.open();
  g.worker_jobs = worker_jobs_.load();
  g.role = opt_.role;
  g.kv_pulls = kv_pulls_.load();
  g.kv_pulls_failed = kv_pulls_failed_.load();
  g.kv_pulls_refused = kv_pulls_refused_.load();
  g.kv_pull_bytes = kv_pull_bytes_.load();
  g.kv_pages_reserved = reserved_pages_.load();
  g.kv_pulls_waiting = pulls_waiting_.load();
  if (kv_server_) g.kv_served = kv_server_->stats();
  return g;
}

bool Server::take_worker_slot() {
  if (worker_jobs_.fetch_add(1) >= opt_.max_worker_queue) {
    worker_jobs_.fetch_sub(1);
    return false;
  }
  return true;
}

awaitable<bool> Server::send(ConnPtr conn, const Request& req, http::status status,
                             std::string body, const char* content_type, bool keep_alive,
                             Headers headers) {
  http::response<http::string_body> res{status, req.version()};
  res.set(http::field::server, "kvant");
  res.set(http::field::content_type, content_type);
  cors_headers(req, headers);
  for (auto& [k, v] : headers) res.set(k, v);
  res.keep_alive(keep_alive && req.keep_alive() && !conn->peer_closed && !draining_);
  res.body() = std::move(body);
  res.prepare_payload();
  metrics_.count_http(int(status));
  beast::error_code ec;
  conn->stream.expires_after(std::chrono::seconds(60));
  if (req.method() == http::verb::head) {
    // The headers GET would send, Content-Length included, and no body.
    http::response<http::empty_body> head{std::move(res.base())};
    http::response_serializer<http::empty_body> sr(head);
    co_await http::async_write_header(conn->stream, sr, asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    co_return !ec && head.keep_alive();
  }
  co_await http::async_write(conn->stream, res, asio::redirect_error(use_awaitable, ec));
  conn->stream.expires_never();
  co_return !ec && res.keep_alive();
}

awaitable<bool> Server::send_error(ConnPtr conn, const Request& req, ApiError e, bool keep_alive,
                                   Headers headers) {
  co_return co_await send(conn, req, http::status(e.status), error_body(e), "application/json",
                          keep_alive, std::move(headers));
}

void Server::cors_headers(const Request& req, Headers& h) const {
  auto it = req.find(http::field::origin);
  if (it == req.end() || check_origin(origins_, sv(it->value()))) return;
  h.emplace_back("Access-Control-Allow-Origin", std::string(it->value()));
  h.emplace_back("Vary", "Origin");
}

void Server::start_session(tcp::socket socket) {
  beast::error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  if (ec) return;  // already gone
  std::string address = ep.address().to_string();
  const auto verdict = limits_.admit(address);
  if (verdict != ConnectionLimits::Verdict::kAccept) {
    // Over a limit: the longest-idle connection (of this address when its
    // own limit is what is over) makes room; with none idle, this one is
    // refused.
    Connection* victim = nullptr;
    for (Connection* c : conns_) {
      if (!c->idle || c->evicted) continue;
      if (verdict == ConnectionLimits::Verdict::kOverAddress && c->address != address) continue;
      if (victim == nullptr || c->idle_since < victim->idle_since) victim = c;
    }
    if (victim == nullptr) {
      limits_.release(address);
      asio::co_spawn(io_,
                     refuse(std::move(socket),
                            api_error(503, "too many open connections; retry later",
                                      "server_error", "too_many_connections")),
                     asio::detached);
      return;
    }
    victim->evicted = true;
    victim->stream.socket().close(ec);
  }
  auto conn = std::make_shared<Connection>(std::move(socket), std::move(address));
  asio::co_spawn(io_, session(conn), [this, conn](std::exception_ptr e) {
    // The last line of defence: session() catches what a request throws.
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        std::fprintf(stderr, "kvant serve: connection failed: %s\n", x.what());
      } catch (...) {
      }
    }
  });
}

// Answers a connection over the limits with one error and closes it.
awaitable<void> Server::refuse(tcp::socket socket, ApiError e) {
  auto conn = std::make_shared<Connection>(std::move(socket), "");
  Request dummy;
  dummy.version(11);
  dummy.keep_alive(false);
  co_await send_error(conn, dummy, std::move(e), false, header("Retry-After", "1"));
  co_await linger_close(conn);
}

// Closes after the answer without losing it: the sending side shuts first,
// then what the client still sends (a body the server did not read) is read
// and dropped for up to a second, so that the close does not reset the
// connection and discard the answer in the client's buffers.
awaitable<void> Server::linger_close(ConnPtr conn) {
  beast::error_code ec;
  conn->stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (!ec && !conn->evicted) {
    conn->stream.expires_after(std::chrono::seconds(1));
    std::vector<char> sink(16384);
    for (int64_t dropped = 0; dropped < (int64_t(8) << 20);) {
      const size_t n = co_await conn->stream.async_read_some(
          asio::buffer(sink), asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      dropped += int64_t(n);
    }
    conn->stream.expires_never();
  }
  conn->stream.socket().close(ec);
}

awaitable<void> Server::accept_loop() {
  asio::steady_timer backoff(io_);
  for (;;) {
    beast::error_code ec;
    tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec) {
      if (!acceptor_.is_open()) co_return;
      // Out of descriptors (or another transient failure): retrying at once
      // would spin; others finish and free theirs meanwhile.
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    if (draining_) continue;  // the socket closes as it goes out of scope
    start_session(std::move(s));
  }
}

awaitable<void> Server::session(ConnPtr conn) {
  conns_.insert(conn.get());
  for (bool first = true;; first = false) {
    Parser parser;
    parser.body_limit(uint64_t(opt_.max_body_bytes));
    parser.header_limit(64 * 1024);
    beast::error_code ec;
    conn->idle = true;
    conn->idle_since = Clock::now();
    // Headers (and, on a kept-alive connection, the wait for them) within
    // the header timeout: idle and slow-header connections are dropped.
    conn->stream.expires_after(millis(opt_.header_timeout_seconds));
    co_await http::async_read_header(conn->stream, conn->buf, parser,
                                     asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    conn->idle = false;
    if (conn->evicted || (draining_ && ec)) break;
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
      break;
    if (ec == beast::error::timeout) {
      // Only a request that had begun hears why.
      if (conn->buf.size() > 0 || first) {
        Request dummy;
        dummy.version(11);
        co_await send_error(conn, dummy,
                            api_error(408, "the request headers did not arrive in time",
                                      "invalid_request_error", "request_timeout"),
                            false);
      }
      break;
    }
    if (ec == http::error::body_limit) {
      // Content-Length over --max-body: refused before a byte of the body is read.
      Request dummy;
      dummy.version(11);
      co_await send_error(conn, dummy,
                          api_error(413,
                                    "the request body is larger than the limit of " +
                                        std::to_string(opt_.max_body_bytes) + " bytes",
                                    "invalid_request_error", "request_too_large"),
                          false);
      break;
    }
    if (ec) {
      Request dummy;
      dummy.version(11);
      // A named error, not a conditional temporary inside co_await (GCC 12
      // destroys such temporaries wrongly).
      ApiError e = api_error(400, "malformed HTTP request: " + ec.message(), "invalid_request_error");
      if (ec == http::error::header_limit)
        e = api_error(431, "the request headers are too large", "invalid_request_error");
      co_await send_error(conn, dummy, std::move(e), false);
      break;
    }
    ++responding_;
    bool keep = false;
    std::exception_ptr failure;
    try {
      keep = co_await serve_one(conn, parser);
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) {
      // One request's failure (bad_alloc, a bug) ends its connection with a
      // 500 when nothing was written yet; the server goes on.
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "kvant serve: request failed: %s\n", what.c_str());
      Request dummy;
      dummy.version(11);
      co_await send_error(conn, dummy,
                          api_error(500, "the server failed to handle this request",
                                    "server_error", "internal_error"),
                          false);
      keep = false;
    }
    --responding_;
    if (!keep || draining_) break;
  }
  conns_.erase(conn.get());
  limits_.release(conn->address);
  co_await linger_close(conn);
}

std::optional<ApiError> Server::check_headers(const Parser& parser, bool& is_preflight) {
  const auto& h = parser.get();
  is_preflight = false;
  if (auto bad = check_host(origins_, sv(h[http::field::host])))
    return api_error(403, *bad, "invalid_request_error", "host_not_allowed");
  if (auto it = h.find(http::field::origin); it != h.end())
    if (auto bad = check_origin(origins_, sv(it->value())))
      return api_error(403, *bad, "invalid_request_error", "origin_not_allowed");
  if (h.method() == http::verb::options) {
    is_preflight = true;
    return std::nullopt;
  }
  std::string target(h.target());
  if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
  const bool protected_route = target.rfind("/v1/", 0) == 0 || target == "/tokenize";
  if (protected_route && !opt_.api_key.empty()) {
    auto it = h.find(http::field::authorization);
    if (it == h.end() || !bearer_matches(sv(it->value()), opt_.api_key)) {
      ApiError e = api_error(401,
                             it == h.end() ? "missing API key: send 'Authorization: Bearer KEY'"
                                           : "incorrect API key",
                             "authentication_error", "invalid_api_key");
      return e;
    }
  }
  if (h.method() == http::verb::post) {
    if (parser.content_length() && *parser.content_length() > uint64_t(opt_.max_body_bytes))
      return api_error(413,
                       "the request body is larger than the limit of " +
                           std::to_string(opt_.max_body_bytes) + " bytes",
                       "invalid_request_error", "request_too_large");
    if (protected_route && !is_json_content_type(sv(h[http::field::content_type])))
      return api_error(415,
                       "the request body must be JSON, sent with 'Content-Type: application/json'",
                       "invalid_request_error", "unsupported_media_type");
  }
  return std::nullopt;
}

awaitable<bool> Server::serve_one(ConnPtr conn, Parser& parser) {
  bool preflight = false;
  Request head_only;
  head_only.version(parser.get().version());
  head_only.method(parser.get().method());
  head_only.keep_alive(false);
  if (auto it = parser.get().find(http::field::origin); it != parser.get().end())
    head_only.set(http::field::origin, it->value());
  if (auto bad = check_headers(parser, preflight)) {
    Headers extra;
    if (bad->status == 401) extra = header("WWW-Authenticate", "Bearer");
    // The body was not read: the connection closes after the answer.
    co_return co_await send_error(conn, head_only, *bad, false, std::move(extra));
  }
  if (preflight) {
    Headers h = header("Access-Control-Allow-Methods", "GET, POST, HEAD, OPTIONS");
    h.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type");
    h.emplace_back("Access-Control-Max-Age", "600");
    co_return co_await send(conn, head_only, http::status::no_content, "", "text/plain", false,
                            std::move(h));
  }
  // The body's bytes come out of the budget before it is read.
  Reservation body(&budget_);
  if (!parser.is_done()) {
    const int64_t want = parser.content_length() ? int64_t(*parser.content_length())
                                                 : opt_.max_body_bytes;  // chunked: its most
    if (!body.resize(want))
      co_return co_await send_error(
          conn, head_only,
          api_error(429,
                    "the server holds as many request bytes as it may (" +
                        std::to_string(budget_.limit()) + "); retry later",
                    "rate_limit_error", "memory_budget"),
          false, header("Retry-After", "1"));
    beast::error_code ec;
    conn->stream.expires_after(millis(opt_.body_timeout_seconds + double(want) / 65536.0));
    co_await http::async_read(conn->stream, conn->buf, parser,
                              asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    if (ec == http::error::body_limit)
      co_return co_await send_error(conn, head_only,
                                    api_error(413,
                                              "the request body is larger than the limit of " +
                                                  std::to_string(opt_.max_body_bytes) + " bytes",
                                              "invalid_request_error", "request_too_large"),
                                    false);
    if (ec == beast::error::timeout)
      co_return co_await send_error(conn, head_only,
                                    api_error(408, "the request body did not arrive in time",
                                              "invalid_request_error", "request_timeout"),
                                    false);
    if (ec) co_return false;  // the client went away or sent garbage mid-body
  }
  Request req = parser.release();
  body.resize(int64_t(req.body().size()));
  co_return co_await handle(conn, req, std::move(body));
}

std::string Server::health_body() const {
  nlohmann::json j;
  if (loop_.failed()) {
    j["status"] = "failed";
    j["error"] = loop_.failure();
  } else {
    j["status"] = draining_ ? "unavailable" : "ok";
  }
  if (!opt_.role.empty()) {
    j["role"] = opt_.role;
    char hash[24];
    std::snprintf(hash, sizeof hash, "%016llx", (unsigned long long)engine_.kv_layout_hash());
    j["kv_layout_hash"] = hash;
    j["kv_layout"] = disagg::describe_layout(engine_.kv_layout());
    if (kv_server_) j["kv_port"] = kv_server_->port();
    j["in_flight"] = in_flight_.load();
  }
  return dump_json(j);
}

awaitable<bool> Server::handle(ConnPtr conn, Request& req, Reservation body) {
  std::string target(req.target());
  if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
  const auto method = req.method();
  auto method_not_allowed = [&](const char* allow) {
    return send_error(conn, req,
                      api_error(405,
                                std::string("method ") + std::string(req.method_string()) +
                                    " is not allowed on " + target + "; use " + allow,
                                "invalid_request_error", "method_not_allowed"),
                      true, header("Allow", allow));
  };
  const bool is_get = method == http::verb::get || method == http::verb::head;

  if (target == "/health") {
    if (!is_get) co_return co_await method_not_allowed("GET, HEAD");
    const bool ok = !draining_ && !loop_.failed();
    const http::status status = ok ? http::status::ok : http::status::service_unavailable;
    std::string health = health_body();
    co_return co_await send(conn, req, status, std::move(health), "application/json", ok);
  }
  if (target == "/metrics") {
    if (!is_get) co_return co_await method_not_allowed("GET, HEAD");
    co_return co_await send(conn, req, http::status::ok, metrics_.render(gauges()),
                            "text/plain; version=0.0.4", true);
  }
  if (target == "/v1/models" || target.rfind("/v1/models/", 0) == 0) {
    if (!is_get) co_return co_await method_not_allowed("GET, HEAD");
    const nlohmann::json m = model_json(opt_.model_name, engine_.capacity().max_context);
    if (target == "/v1/models") {
      std::string list = dump_json(model_list_json(m));
      co_return co_await send(conn, req, http::status::ok, std::move(list), "application/json",
                              true);
    }
    const std::string id = target.substr(std::string("/v1/models/").size());
    if (id != opt_.model_name)
      co_return co_await send_error(conn, req,
                                    api_error(404, "the model '" + id + "' does not exist",
                                              "invalid_request_error", "model_not_found"));
    co_return co_await send(conn, req, http::status::ok, dump_json(m), "application/json", true);
  }
  if (target == "/v1/chat/completions" || target == "/v1/completions") {
    if (method != http::verb::post) co_return co_await method_not_allowed("POST");
    co_return co_await generate(
        conn, req, target == "/v1/chat/completions" ? Endpoint::Chat : Endpoint::Completion,
        std::move(body));
  }
  if (target == "/tokenize") {
    if (method != http::verb::post) co_return co_await method_not_allowed("POST");
    co_return co_await tokenize(conn, req, std::move(body));
  }
  co_return co_await send_error(
      conn, req, api_error(404, "no route for " + target, "invalid_request_error", "not_found"));
}

// POST /tokenize on the worker pool. Text of any length up to --max-body is
// tokenized (evaluation tokenizes whole documents and windows them); the
// tokenizer's cost stays bounded per word (kMaxBpeSymbols).
awaitable<bool> Server::tokenize(ConnPtr conn, Request& req, Reservation body) {
  // The token list and its JSON take up to about 16 bytes per byte of text.
  if (!body.resize(16 * int64_t(req.body().size()) + 4096))
    co_return co_await send_error(conn, req,
                                  api_error(429,
                                            "the server holds as many request bytes as it may (" +
                                                std::to_string(budget_.limit()) + "); retry later",
                                            "rate_limit_error", "memory_budget"),
                                  true, header("Retry-After", "1"));
  if (!take_worker_slot())
    co_return co_await send_error(conn, req,
                                  api_error(503, "the server is busy; retry later", "server_error",
                                            "server_busy"),
                                  true, header("Retry-After", "1"));
  std::string text = std::move(req.body());
  TokenizeOutcome t;
  std::exception_ptr failure;
  auto job = [this, text = std::move(text)]() {
    return tokenize_request(text, opt_.model_name, engine_.tokenizer(),
                            engine_.capacity().max_context);
  };
  try {
    t = co_await offload(std::move(job));
  } catch (...) {
    failure = std::current_exception();
  }
  give_worker_slot();
  body.reset();
  if (failure) std::rethrow_exception(failure);
  if (!t.error.message.empty()) co_return co_await send_error(conn, req, t.error);
  co_return co_await send(conn, req, http::status::ok, dump_json(t.response), "application/json",
                          true);
}

void Server::begin_shutdown() {
  if (draining_) return;
  draining_ = true;
  drain_start_ = Clock::now();
  std::fprintf(stderr, "kvant serve: shutting down, %zu requests in flight\n", active_.size());
  beast::error_code ec;
  acceptor_.close(ec);
  // Idle keep-alive connections hold nothing: they close now.
  for (Connection* c : conns_)
    if (c->idle) c->stream.socket().close(ec);
}

void Server::arm_signals() {
  signals_.async_wait([this](const beast::error_code& e, int) {
    if (e) return;
    if (draining_) {
      // A second signal: the operator wants out now.
      std::fprintf(stderr, "kvant serve: second signal, exiting now\n");
      std::fflush(stderr);
      std::_Exit(130);
    }
    begin_shutdown();
    arm_signals();
  });
}

awaitable<void> Server::supervise() {
  asio::steady_timer t(io_);
  for (;;) {
    t.expires_after(std::chrono::milliseconds(50));
    beast::error_code ec;
    co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
    if (!draining_) continue;
    // Every response is written before the I/O thread stops.
    if (active_.empty() && in_flight_.load() == 0 && responding_ == 0) {
      io_.stop();
      co_return;
    }
    if (!drain_cancelled_ && seconds_since(drain_start_) > opt_.shutdown_grace_seconds) {
      drain_cancelled_ = true;
      std::fprintf(stderr, "kvant serve: cancelling %zu requests after the grace period\n",
                   active_.size());
      for (const auto& g : active_) cancel(*g);
    }
    // Engine aborts within a step; this is a backstop against a stuck client.
    if (seconds_since(drain_start_) > opt_.shutdown_grace_seconds + 10) {
      io_.stop();
      co_return;
    }
  }
}

int Server::run() {
  beast::error_code ec;
  auto addr = asio::ip::make_address(opt_.host == "localhost" ? "127.0.0.1" : opt_.host, ec);
  if (ec) {
    std::fprintf(stderr, "kvant serve: bad --host '%s': %s\n", opt_.host.c_str(),
                 ec.message().c_str());
    return 2;
  }
  raise_fd_limit();
  tcp::endpoint ep(addr, uint16_t(opt_.port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "kvant serve: cannot listen on %s:%d: %s\n", opt_.host.c_str(), opt_.port,
                 ec.message().c_str());
    return 1;
  }
  const int port = acceptor_.local_endpoint().port();
  if (int rc = start_disagg(); rc != 0) return rc;
  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  arm_signals();
  loop_.start();
  asio::co_spawn(io_, accept_loop(), asio::detached);
  asio::co_spawn(io_, supervise(), asio::detached);
  if (opt_.on_listening) opt_.on_listening(opt_.host, port);
  io_.run();
  loop_.stop();
  std::fprintf(stderr, "kvant serve: stopped\n");
  return rc_;
}

int run_server(Engine& engine, const ServerOptions& options) {
  // SIGPIPE would kill the process on a write to a closed socket; Asio
  // reports EPIPE instead once it is ignored.
  std::signal(SIGPIPE, SIG_IGN);
  Server s(engine, options);
  return s.run();
}

}  // namespace kvant::server
