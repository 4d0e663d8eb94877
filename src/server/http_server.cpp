// HTTP transport of the server (see server.h): Boost.Beast sessions as
// C++20 coroutines on one Asio I/O thread, routing, authentication,
// admission, SSE streaming, client disconnects and graceful shutdown.
//
// Threads: the I/O thread owns every socket and every Generation's
// connection-side fields; the engine loop thread runs the request callbacks,
// which copy each event into the Generation's queue under its mutex and post
// a wake-up to the I/O thread. A session waits for events on a steady_timer
// that the posted handler cancels; it always looks at the queue before
// waiting, so a wake-up that arrives while it is busy writing is not lost.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
// clang-format on
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <unordered_set>

#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/server.h"

namespace kvant::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One event from the engine, copied off the engine thread.
struct Event {
  std::string text;
  int32_t token = -1;
  bool has_logprobs = false;
  StepLogprobs logprobs;
  std::shared_ptr<const PromptLogprobs> prompt_logprobs;  // with the first event, when asked
  FinishReason finish = FinishReason::None;
  std::string error;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// A request between the engine thread and its connection.
struct Generation {
  explicit Generation(asio::io_context& io) : io(io), timer(io) {}
  asio::io_context& io;
  RequestId id = 0;
  // Shared with the engine thread.
  std::mutex mu;
  std::deque<Event> events;
  // I/O thread only.
  asio::steady_timer timer;
  bool finished = false;      // the final event was taken from the queue
  bool disconnected = false;  // the client went away
  bool cancelled = false;
  // Engine thread only (latency metrics).
  Clock::time_point arrival, last_token;
  bool any_event = false, any_token = false;
};

struct Connection {
  explicit Connection(tcp::socket s) : stream(std::move(s)) {}
  beast::tcp_stream stream;
  beast::flat_buffer buf;
};

using Request = http::request<http::string_body>;

class Server {
 public:
  Server(Engine& engine, const ServerOptions& options)
      : engine_(engine), opt_(options), loop_(engine, metrics_), acceptor_(io_), signals_(io_) {}

  int run();

 private:
  awaitable<void> accept_loop();
  awaitable<void> session(tcp::socket socket);
  // Returns false when the connection must close after this request.
  awaitable<bool> handle(std::shared_ptr<Connection> conn, Request& req);
  awaitable<bool> generate(std::shared_ptr<Connection> conn, Request& req, Endpoint endpoint);
  std::optional<ApiError> tokenize_prompt(Endpoint endpoint, ParsedRequest& pr,
                                          std::vector<int32_t>& ids);
  awaitable<bool> write_sse_head(std::shared_ptr<Connection> conn, const Request& req);
  awaitable<void> watch_disconnect(std::shared_ptr<Connection> conn,
                                   std::shared_ptr<Generation> gen);
  awaitable<bool> send(std::shared_ptr<Connection> conn, const Request& req, http::status status,
                       std::string body, const char* content_type, bool keep_alive,
                       std::vector<std::pair<std::string, std::string>> headers = {});
  awaitable<bool> send_error(std::shared_ptr<Connection> conn, const Request& req, ApiError e,
                             bool keep_alive = true,
                             std::vector<std::pair<std::string, std::string>> headers = {});
  void on_event(const std::shared_ptr<Generation>& gen, const RequestEvent& e);
  void cancel(Generation& gen);
  void begin_shutdown();
  awaitable<void> supervise();
  std::string new_id(Endpoint endpoint);
  ServerGauges gauges() const { return {queued_.load(), in_flight_.load()}; }

  Engine& engine_;
  ServerOptions opt_;
  Metrics metrics_;
  EngineLoop loop_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  std::atomic<int64_t> queued_{0}, in_flight_{0};
  std::unordered_set<std::shared_ptr<Generation>> active_;  // I/O thread
  bool draining_ = false;
  Clock::time_point drain_start_;
  bool drain_cancelled_ = false;
  int rc_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
};

std::string Server::new_id(Endpoint endpoint) {
  char b[40];
  std::snprintf(b, sizeof b, "%s-%016llx", endpoint == Endpoint::Chat ? "chatcmpl" : "cmpl",
                (unsigned long long)rng_());
  return b;
}

awaitable<bool> Server::send(std::shared_ptr<Connection> conn, const Request& req,
                             http::status status, std::string body, const char* content_type,
                             bool keep_alive,
                             std::vector<std::pair<std::string, std::string>> headers) {
  http::response<http::string_body> res{status, req.version()};
  res.set(http::field::server, "kvant");
  res.set(http::field::content_type, content_type);
  for (auto& [k, v] : headers) res.set(k, v);
  res.keep_alive(keep_alive && req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  metrics_.count_http(int(status));
  beast::error_code ec;
  conn->stream.expires_after(std::chrono::seconds(60));
  co_await http::async_write(conn->stream, res, asio::redirect_error(use_awaitable, ec));
  conn->stream.expires_never();
  co_return !ec && res.keep_alive();
}

awaitable<bool> Server::send_error(std::shared_ptr<Connection> conn, const Request& req, ApiError e,
                                   bool keep_alive,
                                   std::vector<std::pair<std::string, std::string>> headers) {
  co_return co_await send(conn, req, http::status(e.status), error_body(e), "application/json",
                          keep_alive, std::move(headers));
}

// Built outside coroutines: GCC 12 rejects brace-initialised arrays of
// string literals inside a coroutine body.
std::vector<std::pair<std::string, std::string>> header(std::string name, std::string value) {
  std::vector<std::pair<std::string, std::string>> h;
  h.emplace_back(std::move(name), std::move(value));
  return h;
}

nlohmann::json model_json(const std::string& name, int64_t max_context) {
  return {{"id", name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "kvant"},
          {"max_model_len", max_context}};
}

nlohmann::json model_list_json(const nlohmann::json& m) {
  return {{"object", "list"}, {"data", nlohmann::json::array({m})}};
}

ApiError api_error(int status, std::string message, std::string type, std::string code = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// A token as logprobs show it: its text, or "token_id:<id>" when the request asks for ids.
std::string token_text(const Tokenizer& tok, bool as_ids, int32_t id) {
  return as_ids ? "token_id:" + std::to_string(id) : tok.decode(std::span<const int32_t>(&id, 1));
}

// A generated token's logprob and its alternatives, as text.
TokenLogprobText token_logprob_text(const Tokenizer& tok, bool as_ids, const StepLogprobs& s) {
  TokenLogprobText t;
  t.token = token_text(tok, as_ids, s.chosen.token);
  t.logprob = s.chosen.logprob;
  for (const auto& a : s.top_tokens())
    t.top.emplace_back(token_text(tok, as_ids, a.token), a.logprob);
  return t;
}

// The echoed prompt's tokens with the logprobs that came in `batch`, null where none came.
std::vector<TokenLogprobText> echo_logprobs(const Tokenizer& tok, bool as_ids,
                                            const std::vector<int32_t>& echo_ids,
                                            const std::deque<Event>& batch) {
  std::vector<TokenLogprobText> lps;
  const PromptLogprobs* plp = nullptr;
  for (const Event& ev : batch)
    if (ev.prompt_logprobs) plp = ev.prompt_logprobs.get();
  for (size_t p = 0; p < echo_ids.size(); ++p) {
    TokenLogprobText t;
    t.token = token_text(tok, as_ids, echo_ids[p]);
    const int64_t i = plp ? int64_t(p) - plp->first : -1;
    if (i >= 0 && i < plp->size()) {
      t.logprob = plp->chosen[size_t(i)].logprob;
      for (const auto& a : plp->top_at(i))
        t.top.emplace_back(token_text(tok, as_ids, a.token), a.logprob);
    } else {
      t.has_logprob = false;
    }
    lps.push_back(std::move(t));
  }
  return lps;
}

// The engine's request for a parsed one, without its on_event callback.
kvant::Request engine_request(const ParsedRequest& pr, std::vector<int32_t> ids) {
  kvant::Request er;
  er.prompt = std::move(ids);
  er.sampling = pr.sampling;
  er.stop = pr.stop;
  er.logprobs = pr.logprobs && !pr.prompt_only;
  er.prompt_only = pr.prompt_only;
  if (pr.echo && pr.logprobs) {
    er.prompt_logprobs = pr.top_logprobs;
    er.prompt_logprobs_from = std::min<int64_t>(pr.prompt_logprobs_from, int64_t(er.prompt.size()));
  }
  return er;
}

// One batch's SSE events; advances `text_offset` past the delta.
std::string sse_events(Endpoint endpoint, const ResponseMeta& meta, const ParsedRequest& pr,
                       bool first_chunk, const std::string& delta,
                       const std::vector<TokenLogprobText>& delta_lps, int64_t& text_offset,
                       bool finished, const std::string& finish, const std::string& error,
                       const Usage& usage) {
  std::string out;
  // The finish goes in a chunk of its own after the last text, the way
  // OpenAI's stream ends.
  if (!delta.empty() || !delta_lps.empty() || first_chunk)
    out += "data: " +
           dump_json(stream_chunk(endpoint, meta, first_chunk, delta,
                                  pr.logprobs ? &delta_lps : nullptr, text_offset, "", "")) +
           "\n\n";
  text_offset += int64_t(delta.size());
  if (finished) {
    out += "data: " +
           dump_json(stream_chunk(endpoint, meta, false, "", nullptr, text_offset, finish, error)) +
           "\n\n";
    if (pr.include_usage) out += "data: " + dump_json(usage_chunk(endpoint, meta, usage)) + "\n\n";
    out += "data: [DONE]\n\n";
  }
  return out;
}

awaitable<void> Server::accept_loop() {
  for (;;) {
    beast::error_code ec;
    tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec) {
      if (!acceptor_.is_open()) co_return;
      continue;  // e.g. too many open files: keep serving the others
    }
    if (draining_) continue;  // the socket closes as it goes out of scope
    asio::co_spawn(io_, session(std::move(s)), asio::detached);
  }
}

awaitable<void> Server::session(tcp::socket socket) {
  auto conn = std::make_shared<Connection>(std::move(socket));
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(uint64_t(opt_.max_body_bytes));
    parser.header_limit(64 * 1024);
    beast::error_code ec;
    // Idle keep-alive connections and slow senders are dropped.
    conn->stream.expires_after(std::chrono::seconds(120));
    co_await http::async_read(conn->stream, conn->buf, parser,
                              asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
      break;
    if (ec) {
      Request dummy;
      dummy.version(11);
      if (ec == http::error::body_limit) {
        co_await send_error(conn, dummy,
                            api_error(413,
                                      "the request body is larger than the limit of " +
                                          std::to_string(opt_.max_body_bytes) + " bytes",
                                      "invalid_request_error", "request_too_large"),
                            false);
      } else if (ec == http::error::header_limit) {
        co_await send_error(
            conn, dummy,
            api_error(431, "the request headers are too large", "invalid_request_error"), false);
      } else {
        co_await send_error(
            conn, dummy,
            api_error(400, "malformed HTTP request: " + ec.message(), "invalid_request_error"),
            false);
      }
      break;
    }
    Request req = parser.release();
    const bool keep = co_await handle(conn, req);
    if (!keep) break;
  }
  beast::error_code ec;
  conn->stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  conn->stream.socket().close(ec);
}

awaitable<bool> Server::handle(std::shared_ptr<Connection> conn, Request& req) {
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
    if (!is_get) co_return co_await method_not_allowed("GET");
    if (draining_ || loop_.failed())
      co_return co_await send(conn, req, http::status::service_unavailable,
                              "{\"status\":\"unavailable\"}", "application/json", false);
    co_return co_await send(conn, req, http::status::ok, "{\"status\":\"ok\"}", "application/json",
                            true);
  }
  if (target == "/metrics") {
    if (!is_get) co_return co_await method_not_allowed("GET");
    co_return co_await send(conn, req, http::status::ok, metrics_.render(gauges()),
                            "text/plain; version=0.0.4", true);
  }
  const bool is_v1 = target.rfind("/v1/", 0) == 0 || target == "/tokenize";
  if (is_v1 && !opt_.api_key.empty()) {
    const std::string want = "Bearer " + opt_.api_key;
    auto it = req.find(http::field::authorization);
    if (it == req.end() || it->value() != want)
      co_return co_await send_error(
          conn, req,
          api_error(401,
                    it == req.end() ? "missing API key: send 'Authorization: Bearer KEY'"
                                    : "incorrect API key",
                    "authentication_error", "invalid_api_key"),
          true, header("WWW-Authenticate", "Bearer"));
  }
  if (target == "/v1/models" || target.rfind("/v1/models/", 0) == 0) {
    if (!is_get) co_return co_await method_not_allowed("GET");
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
        conn, req, target == "/v1/chat/completions" ? Endpoint::Chat : Endpoint::Completion);
  }
  if (target == "/tokenize") {
    if (method != http::verb::post) co_return co_await method_not_allowed("POST");
    auto t = tokenize_request(req.body(), opt_.model_name, engine_.tokenizer(),
                              engine_.capacity().max_context);
    if (!t.error.message.empty()) co_return co_await send_error(conn, req, t.error);
    co_return co_await send(conn, req, http::status::ok, dump_json(t.response), "application/json",
                            true);
  }
  co_return co_await send_error(
      conn, req, api_error(404, "no route for " + target, "invalid_request_error", "not_found"));
}

void Server::on_event(const std::shared_ptr<Generation>& gen, const RequestEvent& e) {
  // Engine thread.
  const auto now = Clock::now();
  if (!gen->any_event) {
    gen->any_event = true;
    queued_.fetch_sub(1);
  }
  if (e.token >= 0) {
    if (!gen->any_token)
      metrics_.ttft.observe(std::chrono::duration<double>(now - gen->arrival).count());
    else
      metrics_.itl.observe(std::chrono::duration<double>(now - gen->last_token).count());
    gen->any_token = true;
    gen->last_token = now;
  }
  Event ev;
  ev.text.assign(e.text);
  ev.token = e.token;
  if (e.logprobs) {
    ev.has_logprobs = true;
    ev.logprobs = *e.logprobs;
  }
  if (e.prompt_logprobs) ev.prompt_logprobs = std::make_shared<PromptLogprobs>(*e.prompt_logprobs);
  ev.finish = e.finish;
  ev.error.assign(e.error);
  ev.prompt_tokens = e.prompt_tokens;
  ev.completion_tokens = e.completion_tokens;
  ev.cached_tokens = e.cached_tokens;
  if (e.finish != FinishReason::None) {
    metrics_.e2e.observe(std::chrono::duration<double>(now - gen->arrival).count());
    metrics_.count_finish(std::string(finish_reason_name(e.finish)));
    in_flight_.fetch_sub(1);
  }
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(gen->mu);
    was_empty = gen->events.empty();
    gen->events.push_back(std::move(ev));
  }
  if (was_empty) asio::post(gen->io, [gen] { gen->timer.cancel(); });
}

void Server::cancel(Generation& gen) {
  if (gen.cancelled || gen.finished) return;
  gen.cancelled = true;
  engine_.cancel(gen.id);
  loop_.wake();
}

awaitable<void> Server::watch_disconnect(std::shared_ptr<Connection> conn,
                                         std::shared_ptr<Generation> gen) {
  // The request has been read; the client sends nothing more until the
  // response ends, so a completed read means it closed (or pipelined, which
  // this server answers by closing after the response).
  char byte;
  beast::error_code ec;
  co_await conn->stream.socket().async_read_some(asio::buffer(&byte, 1),
                                                 asio::redirect_error(use_awaitable, ec));
  if (gen->finished) co_return;
  if (ec && ec != asio::error::operation_aborted) {
    gen->disconnected = true;
    cancel(*gen);
    gen->timer.cancel();
  }
}

awaitable<bool> Server::generate(std::shared_ptr<Connection> conn, Request& req,
                                 Endpoint endpoint) {
  if (draining_)
    co_return co_await send_error(
        conn, req, api_error(503, "the server is shutting down", "server_error", "shutting_down"),
        false);
  auto parsed = parse_request(endpoint, req.body(), opt_.model_name, opt_.max_logprobs);
  if (!parsed.request) co_return co_await send_error(conn, req, parsed.error);
  ParsedRequest& pr = *parsed.request;
  const Tokenizer& tok = engine_.tokenizer();

  std::vector<int32_t> ids;
  const std::optional<ApiError> bad_prompt = tokenize_prompt(endpoint, pr, ids);
  if (bad_prompt) co_return co_await send_error(conn, req, *bad_prompt);
  if (queued_.load() >= opt_.max_waiting)
    co_return co_await send_error(conn, req,
                                  api_error(429,
                                            "the server has " + std::to_string(queued_.load()) +
                                                " requests waiting, its limit; retry later",
                                            "rate_limit_error", "queue_full"),
                                  true, header("Retry-After", "1"));

  auto gen = std::make_shared<Generation>(io_);
  gen->arrival = Clock::now();
  // What echo sends back: the prompt as given (its tokens' text for ids).
  std::vector<int32_t> echo_ids;
  std::string echo_text;
  if (pr.echo) {
    echo_ids = ids;
    echo_text = pr.prompt_is_ids ? tok.decode(echo_ids) : pr.prompt;
  }
  kvant::Request er = engine_request(pr, std::move(ids));
  er.on_event = [this, gen](const RequestEvent& e) { on_event(gen, e); };
  queued_.fetch_add(1);
  in_flight_.fetch_add(1);
  auto id = engine_.submit(std::move(er));
  if (!id) {
    queued_.fetch_sub(1);
    in_flight_.fetch_sub(1);
    co_return co_await send_error(conn, req,
                                  api_error(400, id.error().message, "invalid_request_error"));
  }
  gen->id = *id;
  active_.insert(gen);
  loop_.wake();
  asio::co_spawn(io_, watch_disconnect(conn, gen), asio::detached);

  ResponseMeta meta{new_id(endpoint),
                    std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count(),
                    opt_.model_name};
  std::string text;
  std::vector<TokenLogprobText> lps;
  Usage usage;
  std::string finish, error;
  bool first_chunk = true, write_failed = false;
  int64_t text_offset = 0;
  bool echoed = false;

  auto write_chunk = [&](std::string data) -> awaitable<void> {
    if (write_failed) co_return;
    beast::error_code ec;
    conn->stream.expires_after(std::chrono::seconds(60));
    co_await asio::async_write(conn->stream, http::make_chunk(asio::buffer(data)),
                               asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    if (ec) {
      write_failed = true;
      gen->disconnected = true;
      cancel(*gen);
    }
  };
  if (pr.stream) {
    const bool head_written = co_await write_sse_head(conn, req);
    if (!head_written) {
      write_failed = true;
      cancel(*gen);
    }
  }

  while (!gen->finished) {
    std::deque<Event> batch;
    {
      std::lock_guard<std::mutex> lk(gen->mu);
      batch.swap(gen->events);
    }
    if (batch.empty()) {
      gen->timer.expires_at(Clock::time_point::max());
      beast::error_code ec;
      co_await gen->timer.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    std::string delta;
    std::vector<TokenLogprobText> delta_lps;
    if (pr.echo && !echoed) {
      // The prompt first: its text, and its tokens' logprobs (none for the
      // first token and those before prompt_logprobs_from, or when the
      // request failed before its prompt was computed).
      echoed = true;
      delta = echo_text;
      if (pr.logprobs) delta_lps = echo_logprobs(tok, pr.tokens_as_ids, echo_ids, batch);
    }
    for (Event& ev : batch) {
      delta += ev.text;
      if (pr.logprobs && ev.has_logprobs)
        delta_lps.push_back(token_logprob_text(tok, pr.tokens_as_ids, ev.logprobs));
      usage.prompt_tokens = ev.prompt_tokens;
      usage.completion_tokens = ev.completion_tokens;
      usage.cached_tokens = ev.cached_tokens;
      if (ev.finish != FinishReason::None) {
        gen->finished = true;
        finish = std::string(finish_reason_name(ev.finish));
        error = ev.error;
      }
    }
    if (pr.stream && !write_failed) {
      if (!delta.empty() || !delta_lps.empty() || first_chunk || gen->finished) {
        std::string out = sse_events(endpoint, meta, pr, first_chunk, delta, delta_lps, text_offset,
                                     gen->finished, finish, error, usage);
        first_chunk = false;
        co_await write_chunk(std::move(out));
      }
    } else if (!pr.stream) {
      text += delta;
      for (auto& t : delta_lps) lps.push_back(std::move(t));
    }
  }
  active_.erase(gen);
  beast::error_code ec;
  conn->stream.socket().cancel(ec);  // ends the disconnect watcher
  if (gen->disconnected) co_return false;
  if (pr.stream) {
    if (!write_failed) {
      conn->stream.expires_after(std::chrono::seconds(60));
      co_await asio::async_write(conn->stream, http::make_chunk_last(),
                                 asio::redirect_error(use_awaitable, ec));
      conn->stream.expires_never();
    }
    co_return false;
  }
  auto body =
      full_response(endpoint, meta, text, pr.logprobs ? &lps : nullptr, finish, error, usage);
  co_await send(conn, req, http::status::ok, dump_json(body), "application/json", false);
  co_return false;
}

// The prompt's token ids, checked against the vocabulary and the context; the error otherwise.
std::optional<ApiError> Server::tokenize_prompt(Endpoint endpoint, ParsedRequest& pr,
                                                std::vector<int32_t>& ids) {
  const Tokenizer& tok = engine_.tokenizer();
  if (endpoint == Endpoint::Chat) {
    if (!opt_.render_chat)
      return api_error(400, "this model has no chat template", "invalid_request_error");
    auto r = opt_.render_chat(pr.messages);
    if (!r) return api_error(400, r.error().message, "invalid_request_error");
    ids = std::move(*r);
  } else if (pr.prompt_is_ids) {
    ids = std::move(pr.prompt_ids);
    for (int32_t t : ids)
      if (t >= tok.vocab_size()) {
        ApiError e =
            api_error(400,
                      "prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                          std::to_string(tok.vocab_size()) + ")",
                      "invalid_request_error");
        e.param = "prompt";
        return e;
      }
  } else {
    ids = tok.encode(pr.prompt, /*add_bos=*/true, /*parse_special=*/true);
  }
  const int64_t ctx = engine_.capacity().max_context;
  if (ids.empty()) {
    ApiError e = api_error(400, "the prompt is empty after tokenization", "invalid_request_error");
    e.param = endpoint == Endpoint::Chat ? "messages" : "prompt";
    return e;
  }
  if (int64_t(ids.size()) >= ctx) {
    ApiError e = api_error(400,
                           "this model's context holds " + std::to_string(ctx) +
                               " tokens, but the prompt has " + std::to_string(ids.size()) +
                               " tokens (the prompt plus at least one generated token must fit)",
                           "invalid_request_error", "context_length_exceeded");
    e.param = endpoint == Endpoint::Chat ? "messages" : "prompt";
    return e;
  }
  return std::nullopt;
}

// Starts a chunked text/event-stream response; false when its header cannot be written.
awaitable<bool> Server::write_sse_head(std::shared_ptr<Connection> conn, const Request& req) {
  http::response<http::empty_body> head{http::status::ok, req.version()};
  head.set(http::field::server, "kvant");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.keep_alive(false);
  head.chunked(true);
  http::response_serializer<http::empty_body> sr(head);
  beast::error_code ec;
  co_await http::async_write_header(conn->stream, sr, asio::redirect_error(use_awaitable, ec));
  metrics_.count_http(200);
  co_return !ec;
}

void Server::begin_shutdown() {
  if (draining_) return;
  draining_ = true;
  drain_start_ = Clock::now();
  std::fprintf(stderr, "kvant serve: shutting down, %zu requests in flight\n", active_.size());
  beast::error_code ec;
  acceptor_.close(ec);
}

awaitable<void> Server::supervise() {
  asio::steady_timer t(io_);
  for (;;) {
    t.expires_after(std::chrono::milliseconds(50));
    beast::error_code ec;
    co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
    if (loop_.failed()) {
      rc_ = 1;
      io_.stop();
      co_return;
    }
    if (!draining_) continue;
    if (active_.empty() && in_flight_.load() == 0) {
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
  auto addr = asio::ip::make_address(opt_.host, ec);
  if (ec) {
    std::fprintf(stderr, "kvant serve: bad --host '%s': %s\n", opt_.host.c_str(),
                 ec.message().c_str());
    return 2;
  }
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
  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.async_wait([this](const beast::error_code& e, int) {
    if (!e) begin_shutdown();
  });
  loop_.start();
  asio::co_spawn(io_, accept_loop(), asio::detached);
  asio::co_spawn(io_, supervise(), asio::detached);
  if (opt_.on_listening) opt_.on_listening(opt_.host, port);
  io_.run();
  loop_.stop();
  std::fprintf(stderr, "kvant serve: stopped\n");
  return rc_;
}

}  // namespace

int run_server(Engine& engine, const ServerOptions& options) {
  // SIGPIPE would kill the process on a write to a closed socket; Asio
  // reports EPIPE instead once it is ignored.
  std::signal(SIGPIPE, SIG_IGN);
  Server s(engine, options);
  return s.run();
}

}  // namespace kvant::server
