// kvant router (router.h): Boost.Beast on one I/O thread, coroutines.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
// clang-format on
#include "router/router.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <array>
#include <chrono>
#include <map>
#include <csignal>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

namespace kvant::router {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

auto secs(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

struct Backend {
  std::string url, host, port;
  bool prefill = false;
  bool up = false;
  std::string kv_addr;  // prefill: host:kv_port
  std::string layout;
  std::string layout_hash;
  int64_t in_flight = 0, requests = 0, failures = 0;
};

bool parse_url(const std::string& url, Backend& b) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) rest.resize(rest.find('/'));
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) return false;
  b.host = rest.substr(0, colon);
  b.port = rest.substr(colon + 1);
  b.url = url;
  return true;
}

// One GET with a deadline: the status and body, or nothing.
awaitable<std::optional<std::pair<int, std::string>>> http_get(const Backend& b,
                                                               const std::string& target,
                                                               double timeout) {
  auto ex = co_await asio::this_coro::executor;
  beast::tcp_stream s(ex);
  s.expires_after(secs(timeout));
  beast::error_code ec;
  tcp::resolver r(ex);
  auto eps = co_await r.async_resolve(b.host, b.port, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return std::nullopt;
  co_await s.async_connect(eps, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return std::nullopt;
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, b.host);
  co_await http::async_write(s, req, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return std::nullopt;
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  co_await http::async_read(s, buf, res, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return std::nullopt;
  co_return std::make_pair(int(res.result_int()), std::move(res.body()));
}

class Router {
 public:
  explicit Router(RouterOptions o) : o_(std::move(o)), acceptor_(io_), signals_(io_) {}

  int run() {
    for (const auto& u : o_.prefill) add(u, true);
    for (const auto& u : o_.decode) add(u, false);
    if (bad_) return 2;
    if (prefill_count() == 0 || decode_count() == 0) {
      std::fprintf(stderr, "kvant router: needs at least one --prefill and one --decode server\n");
      return 2;
    }
    if (o_.policy != "round-robin" && o_.policy != "least-loaded") {
      std::fprintf(stderr, "kvant router: unknown --policy '%s'\n", o_.policy.c_str());
      return 2;
    }
    int rc = 0;
    asio::co_spawn(io_, startup(rc), asio::detached);
    io_.run();
    io_.restart();
    if (rc != 0) return rc;
    beast::error_code ec;
    auto addr = asio::ip::make_address(o_.host == "localhost" ? "127.0.0.1" : o_.host, ec);
    if (ec) {
      std::fprintf(stderr, "kvant router: bad --host '%s'\n", o_.host.c_str());
      return 2;
    }
    tcp::endpoint ep(addr, uint16_t(o_.port));
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      std::fprintf(stderr, "kvant router: cannot listen on %s:%d: %s\n", o_.host.c_str(), o_.port,
                   ec.message().c_str());
      return 1;
    }
    signals_.add(SIGTERM);
    signals_.add(SIGINT);
    signals_.async_wait([this](const beast::error_code& e, int) {
      if (!e) io_.stop();
    });
    asio::co_spawn(io_, accept_loop(), asio::detached);
    asio::co_spawn(io_, health_loop(), asio::detached);
    std::fprintf(stderr, "kvant router: %zu prefill, %zu decode servers (%s) on http://%s:%d/v1\n",
                 prefill_count(), decode_count(), o_.policy.c_str(), o_.host.c_str(),
                 int(acceptor_.local_endpoint().port()));
    io_.run();
    std::fprintf(stderr, "kvant router: stopped\n");
    return 0;
  }

 private:
  void add(const std::string& url, bool prefill) {
    auto b = std::make_unique<Backend>();
    if (!parse_url(url, *b)) {
      std::fprintf(stderr, "kvant router: '%s' is not http://host:port\n", url.c_str());
      bad_ = true;
      return;
    }
    b->prefill = prefill;
    backends_.push_back(std::move(b));
  }
  size_t prefill_count() const {
    size_t n = 0;
    for (auto& b : backends_) n += b->prefill;
    return n;
  }
  size_t decode_count() const { return backends_.size() - prefill_count(); }

  // Reads /health; false when the server is not (yet) what it must be.
  awaitable<bool> check(Backend& b, std::string& why) {
    auto r = co_await http_get(b, "/health", 5);
    if (!r) {
      why = b.url + " does not answer";
      b.up = false;
      co_return false;
    }
    nlohmann::json j = nlohmann::json::parse(r->second, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      why = b.url + "/health is not JSON";
      b.up = false;
      co_return false;
    }
    const std::string role = j.value("role", "");
    const std::string want = b.prefill ? "prefill" : "decode";
    if (role != want) {
      why = b.url + " is not a " + want + " server (kvant serve --role " + want + "; it says '" +
            (role.empty() ? "colocated" : role) + "')";
      b.up = false;
      wrong_role_ = true;
      co_return false;
    }
    b.layout = j.value("kv_layout", "");
    b.layout_hash = j.value("kv_layout_hash", "");
    if (b.prefill) b.kv_addr = b.host + ":" + std::to_string(j.value("kv_port", 0));
    b.up = r->first == 200;
    if (!b.up) why = b.url + " is " + j.value("status", "unavailable");
    co_return b.up;
  }

  awaitable<void> startup(int& rc) {
    const auto deadline = Clock::now() + secs(o_.startup_wait_seconds);
    asio::steady_timer t(io_);
    for (;;) {
      std::string why;
      bool all = true;
      for (auto& b : backends_) {
        std::string w;
        if (!co_await check(*b, w)) {
          all = false;
          why = w;
        }
      }
      if (wrong_role_) {
        std::fprintf(stderr, "kvant router: %s\n", why.c_str());
        rc = 1;
        co_return;
      }
      if (all) break;
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "kvant router: %s after %.0f s\n", why.c_str(),
                     o_.startup_wait_seconds);
        rc = 1;
        co_return;
      }
      t.expires_after(std::chrono::milliseconds(200));
      beast::error_code ec;
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
    }
    for (auto& b : backends_)
      if (b->layout_hash != backends_[0]->layout_hash) {
        std::fprintf(stderr,
                     "kvant router: KV layouts differ: %s has %s; %s has %s (every prefill and "
                     "decode server must use the same KV dtype, page size and model)\n",
                     backends_[0]->url.c_str(), backends_[0]->layout.c_str(), b->url.c_str(),
                     b->layout.c_str());
        rc = 1;
        co_return;
      }
  }

  awaitable<void> health_loop() {
    asio::steady_timer t(io_);
    for (;;) {
      t.expires_after(secs(o_.health_interval_seconds));
      beast::error_code ec;
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
      if (ec) co_return;
      for (auto& b : backends_) {
        std::string why;
        const bool was = b->up;
        co_await check(*b, why);
        if (was && !b->up) std::fprintf(stderr, "kvant router: %s is down: %s\n", b->url.c_str(), why.c_str());
        if (!was && b->up) std::fprintf(stderr, "kvant router: %s is up\n", b->url.c_str());
      }
    }
  }

  // A server of the role, up, by policy; `avoid` is skipped when another exists.
  Backend* pick(bool prefill, const Backend* avoid = nullptr) {
    std::vector<Backend*> c;
    for (auto& b : backends_)
      if (b->prefill == prefill && b->up && b.get() != avoid) c.push_back(b.get());
    if (c.empty() && avoid && avoid->up) c.push_back(const_cast<Backend*>(avoid));
    if (c.empty()) return nullptr;
    if (o_.policy == "least-loaded") {
      Backend* best = c[0];
      for (Backend* b : c)
        if (b->in_flight < best->in_flight) best = b;
      return best;
    }
    size_t& next = prefill ? next_prefill_ : next_decode_;
    return c[next++ % c.size()];
  }

  awaitable<void> accept_loop() {
    for (;;) {
      beast::error_code ec;
      tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(use_awaitable, ec));
      if (ec == asio::error::operation_aborted) co_return;
      if (ec) continue;
      asio::co_spawn(io_, session(beast::tcp_stream(std::move(s))), asio::detached);
    }
  }

  static std::string error_json(const std::string& message, const char* code) {
    nlohmann::json j;
    j["error"] = {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", code}};
    return j.dump();
  }

  awaitable<bool> reply(beast::tcp_stream& c, unsigned version, int status, std::string body,
                        const char* type, bool keep_alive) {
    http::response<http::string_body> res{http::status(status), version};
    res.set(http::field::server, "kvant-router");
    res.set(http::field::content_type, type);
    res.body() = std::move(body);
    res.keep_alive(keep_alive);
    res.prepare_payload();
    beast::error_code ec;
    c.expires_after(std::chrono::seconds(60));
    co_await http::async_write(c, res, asio::redirect_error(use_awaitable, ec));
    c.expires_never();
    count_status(status);
    co_return !ec && keep_alive;
  }

  void count_status(int status) { ++statuses_[status]; }

  awaitable<void> session(beast::tcp_stream c) {
    beast::flat_buffer buf;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(uint64_t(o_.max_body_bytes));
      beast::error_code ec;
      c.expires_after(std::chrono::seconds(60));
      co_await http::async_read(c, buf, parser, asio::redirect_error(use_awaitable, ec));
      c.expires_never();
      if (ec == http::error::body_limit) {
        co_await reply(c, 11, 413, error_json("request body too large", "request_too_large"),
                       "application/json", false);
        break;
      }
      if (ec) break;
      auto req = parser.release();
      if (!co_await handle(c, req)) break;
    }
    beast::error_code ec;
    c.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  std::string health_body(bool& ok) const {
    nlohmann::json j, list = nlohmann::json::array();
    bool p = false, d = false;
    for (auto& b : backends_) {
      list.push_back({{"url", b->url},
                      {"role", b->prefill ? "prefill" : "decode"},
                      {"up", b->up},
                      {"in_flight", b->in_flight}});
      (b->prefill ? p : d) |= b->up;
    }
    ok = p && d;
    j["status"] = ok ? "ok" : "unavailable";
    j["role"] = "router";
    j["policy"] = o_.policy;
    j["servers"] = list;
    return j.dump();
  }

  std::string metrics_body() const {
    std::string o;
    auto line = [&](const std::string& name, const char* type, const char* help) {
      o += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    };
    line("kvant_router_requests_total", "counter", "Completions forwarded, by server.");
    for (auto& b : backends_)
      o += "kvant_router_requests_total{server=\"" + b->url + "\",role=\"" +
           (b->prefill ? "prefill" : "decode") + "\"} " + std::to_string(b->requests) + "\n";
    line("kvant_router_in_flight", "gauge", "Completions in flight, by server.");
    for (auto& b : backends_)
      o += "kvant_router_in_flight{server=\"" + b->url + "\"} " + std::to_string(b->in_flight) + "\n";
    line("kvant_router_server_up", "gauge", "Whether a server answered its last /health with 200.");
    for (auto& b : backends_)
      o += "kvant_router_server_up{server=\"" + b->url + "\"} " + (b->up ? "1" : "0") + "\n";
    line("kvant_router_failures_total", "counter",
         "Forwarding failures (server unreachable, or gone mid-answer), by server.");
    for (auto& b : backends_)
      o += "kvant_router_failures_total{server=\"" + b->url + "\"} " + std::to_string(b->failures) + "\n";
    line("kvant_router_retries_total", "counter",
         "Completions retried on another prefill server after a failed transfer.");
    o += "kvant_router_retries_total " + std::to_string(retries_) + "\n";
    line("kvant_router_http_responses_total", "counter", "Responses by status (the router's own and relayed).");
    for (auto& [s, n] : statuses_)
      o += "kvant_router_http_responses_total{code=\"" + std::to_string(s) + "\"} " + std::to_string(n) + "\n";
    return o;
  }

  awaitable<bool> handle(beast::tcp_stream& c, http::request<http::string_body>& req) {
    std::string target(req.target());
    std::string path = target.substr(0, target.find('?'));
    const unsigned v = req.version();
    const bool keep = req.keep_alive();  // the client's Connection header, honoured
    if (path == "/health") {
      bool ok = false;
      std::string body = health_body(ok);
      co_return co_await reply(c, v, ok ? 200 : 503, std::move(body), "application/json", keep);
    }
    if (path == "/metrics")
      co_return co_await reply(c, v, 200, metrics_body(), "text/plain; version=0.0.4", keep);
    const bool completion = path == "/v1/completions" || path == "/v1/chat/completions";
    Backend* d = pick(false);
    Backend* p = completion ? pick(true) : nullptr;
    if (!d || (completion && !p))
      co_return co_await reply(c, v, 503,
                               error_json("no prefill or decode server is up; retry later",
                                          "no_server"),
                               "application/json", false);
    // Tries: another decode server when one cannot be reached, another
    // prefill server once when the transfer failed on the prefill side.
    Backend* tried_p = nullptr;
    for (int attempt = 0; attempt < 4; ++attempt) {
      auto r = co_await forward(c, req, *d, p, p && !tried_p && retries_left_for(p));
      if (r == Outcome::kDone) co_return false;
      if (r == Outcome::kClientGone) co_return false;
      if (r == Outcome::kDecodeUnreachable) {
        ++d->failures;
        d->up = false;
        d = pick(false, d);
        if (!d || !d->up) break;
        continue;
      }
      if (r == Outcome::kPrefillFailed) {
        ++p->failures;
        tried_p = p;
        p = pick(true, p);
        ++retries_;
        continue;
      }
    }
    co_return co_await reply(c, v, 502,
                             error_json("no decode server could be reached", "no_server"),
                             "application/json", false);
  }

  enum class Outcome { kDone, kClientGone, kDecodeUnreachable, kPrefillFailed };

  // Sends the request to `d` (naming `p` for a completion) and relays the
  // answer. kPrefillFailed: a 502 kv_transfer_failed that was not relayed,
  // to be tried again (relayed when this is the last try).
  awaitable<Outcome> forward(beast::tcp_stream& c, http::request<http::string_body>& req,
                             Backend& d, Backend* p, bool may_retry) {
    auto ex = co_await asio::this_coro::executor;
    beast::tcp_stream up(ex);
    beast::error_code ec;
    tcp::resolver r(ex);
    up.expires_after(std::chrono::seconds(5));
    auto eps = co_await r.async_resolve(d.host, d.port, asio::redirect_error(use_awaitable, ec));
    if (!ec) co_await up.async_connect(eps, asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Outcome::kDecodeUnreachable;
    up.socket().set_option(tcp::no_delay(true), ec);
    http::request<http::string_body> out = req;
    out.set(http::field::host, d.host + ":" + d.port);
    out.erase("X-Kvant-Prefill");
    if (p) out.set("X-Kvant-Prefill", p->kv_addr);
    out.keep_alive(false);
    out.prepare_payload();
    up.expires_after(secs(o_.timeout_seconds));
    co_await http::async_write(up, out, asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Outcome::kDecodeUnreachable;
    ++d.requests;
    ++d.in_flight;
    if (p) {
      ++p->requests;
      ++p->in_flight;
    }
    struct Done {
      Backend& d;
      Backend* p;
      ~Done() {
        --d.in_flight;
        if (p) --p->in_flight;
      }
    } done{d, p};
    // The head first: a retryable failure is read whole and not relayed.
    std::string head;
    std::array<char, 16384> chunk{};
    size_t head_end = std::string::npos;
    while (head_end == std::string::npos) {
      const size_t n = co_await up.async_read_some(asio::buffer(chunk), asio::redirect_error(use_awaitable, ec));
      head.append(chunk.data(), n);
      head_end = head.find("\r\n\r\n");
      if (ec) break;
    }
    if (head_end == std::string::npos) {
      ++d.failures;
      if (head.empty()) co_return Outcome::kDecodeUnreachable;
      co_return Outcome::kClientGone;
    }
    int status = 0;
    if (head.size() > 12) status = std::atoi(head.c_str() + 9);
    if (status == 502 && p) {
      while (!ec) {
        const size_t n = co_await up.async_read_some(asio::buffer(chunk), asio::redirect_error(use_awaitable, ec));
        head.append(chunk.data(), n);
        if (head.size() > (1u << 20)) break;
      }
      const bool retry = head.find("kv_transfer_failed") != std::string::npos;
      if (retry && may_retry) co_return Outcome::kPrefillFailed;
    }
    count_status(status);
    const bool upstream_done = ec == asio::error::eof;  // nothing more to read
    if (ec && !upstream_done) ++d.failures;
    c.expires_after(std::chrono::seconds(60));
    co_await asio::async_write(c, asio::buffer(head), asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Outcome::kClientGone;
    if (upstream_done) co_return Outcome::kDone;
    // Then everything else as it comes, until the decode server closes.
    // The client's side is watched too: a client that goes away closes the
    // decode server's connection, which cancels the request there.
    for (;;) {
      beast::error_code rec;
      const size_t n = co_await up.async_read_some(asio::buffer(chunk), asio::redirect_error(use_awaitable, rec));
      if (n > 0) {
        c.expires_after(std::chrono::seconds(60));
        co_await asio::async_write(c, asio::buffer(chunk.data(), n), asio::redirect_error(use_awaitable, ec));
        if (ec) co_return Outcome::kClientGone;
      }
      if (rec == asio::error::eof) break;
      if (rec) {
        ++d.failures;  // gone mid-answer: the client's connection ends with it
        break;
      }
    }
    co_return Outcome::kDone;
  }

  // Whether a failed transfer may be tried on another prefill server: only
  // when there is another (and only once: the caller's part).
  bool retries_left_for(const Backend* p) {
    for (auto& b : backends_)
      if (b->prefill && b->up && b.get() != p) return true;
    return false;
  }

  RouterOptions o_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  std::vector<std::unique_ptr<Backend>> backends_;
  bool bad_ = false, wrong_role_ = false;
  size_t next_prefill_ = 0, next_decode_ = 0;
  int64_t retries_ = 0;
  std::map<int, int64_t> statuses_;
};

}  // namespace

int run_router(const RouterOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);
  Router r(options);
  return r.run();
}

}  // namespace kvant::router
