// The KV transfer over TCP (kv_transport.h): Boost.Asio coroutines on one
// I/O thread per side. Each pull is one connection: Hello both ways, Pull,
// then Handoff (or a failure Ack) from the prefill side and the Ack back.
// Every read and write runs under a deadline that closes the socket when it
// passes, so a peer that stops answering ends in an error, not a wait.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
// clang-format on
#include <array>
#include <atomic>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "disagg/kv_transport.h"
#include "disagg/kv_wire.h"

namespace kvant::disagg {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

// Message payload limits before a byte of it is read: Hello and Ack are
// small, a pull's prompt is at most kWireMaxPrompt tokens; a handoff's page
// bytes are sized from its checked metadata (read_handoff).
constexpr uint64_t kSmallPayload = uint64_t(1) << 20;
constexpr uint64_t kPullPayload = uint64_t(kWireMaxPrompt) * 4 + (uint64_t(1) << 20);

auto seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Closes `sock` when the deadline passes (arm again to move it).
class Deadline {
 public:
  Deadline(asio::any_io_executor ex, tcp::socket& sock) : timer_(ex), sock_(sock) {}
  void arm(double s) {
    timer_.expires_after(seconds(s));
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      expired_ = true;
      boost::system::error_code ignored;
      sock_.close(ignored);
    });
  }
  void disarm() { timer_.cancel(); }
  bool expired() const { return expired_; }

 private:
  asio::steady_timer timer_;
  tcp::socket& sock_;
  bool expired_ = false;
};

// A message's payload lives in an uninitialised buffer: a vector would
// zero every byte before the socket overwrites it.
struct Message {
  WireHeader header;
  std::unique_ptr<uint8_t[]> bytes;
  std::span<const uint8_t> payload;
  void release() {
    bytes.reset();
    payload = {};
  }
};

std::string io_error(const char* doing, const boost::system::error_code& ec, bool expired) {
  if (expired) return std::string("KV transfer: timed out ") + doing;
  if (ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::broken_pipe)
    return std::string("KV transfer: the peer closed the connection ") + doing;
  return std::string("KV transfer: ") + doing + ": " + ec.message();
}

// A message's header, checked (magic, version, type, length limit).
awaitable<Result<WireHeader>> read_header(tcp::socket& s, const Deadline& dl, const char* doing) {
  std::array<uint8_t, kWireHeaderBytes> hb{};
  boost::system::error_code ec;
  co_await asio::async_read(s, asio::buffer(hb), asio::redirect_error(use_awaitable, ec));
  if (ec) co_return make_error(io_error(doing, ec, dl.expired()));
  co_return decode_header(hb);
}

// Hello, Pull or Ack, whole (a handoff is read by read_handoff).
awaitable<Result<Message>> read_message(tcp::socket& s, const Deadline& dl, const char* doing,
                                        uint64_t limit) {
  auto h = co_await read_header(s, dl, doing);
  if (!h) co_return make_error(h.error().message);
  const uint64_t lim = h->type == WireType::kPull ? kPullPayload : kSmallPayload;
  if (h->type == WireType::kHandoff || h->payload_bytes > std::min(lim, limit))
    co_return make_error("KV transfer: a message of type " + std::to_string(int(h->type)) +
                         " with " + std::to_string(h->payload_bytes) +
                         " payload bytes is not expected here or over its limit");
  Message m{*h, {}, {}};
  const size_t n = size_t(h->payload_bytes);
  // Allocated whole, but not touched: a peer that claims more than it sends
  // holds address space, not memory, until the deadline ends it.
  m.bytes.reset(new (std::nothrow) uint8_t[std::max<size_t>(n, 1)]);
  if (!m.bytes)
    co_return make_error("KV transfer: cannot hold a message of " + std::to_string(n) + " bytes");
  boost::system::error_code ec;
  co_await asio::async_read(s, asio::buffer(m.bytes.get(), n), asio::redirect_error(use_awaitable, ec));
  if (ec) co_return make_error(io_error(doing, ec, dl.expired()));
  m.payload = std::span<const uint8_t>(m.bytes.get(), n);
  co_return m;
}

// The reply to a pull: a handoff, read in parts so that the page bytes go
// straight into the KvHandoff (the metadata first, bounded, then the pages
// the metadata says), hashed as they arrive; or a failure Ack.
awaitable<Result<WireHandoff>> read_handoff(tcp::socket& s, const Deadline& dl) {
  const char* doing = "waiting for the handoff";
  boost::system::error_code ec;
  auto h = co_await read_header(s, dl, doing);
  if (!h) co_return make_error(h.error().message);
  if (h->type == WireType::kAck) {
    if (h->payload_bytes > kSmallPayload)
      co_return make_error("KV transfer: an ack over its limit");
    std::vector<uint8_t> p(size_t(h->payload_bytes));
    co_await asio::async_read(s, asio::buffer(p), asio::redirect_error(use_awaitable, ec));
    if (ec) co_return make_error(io_error(doing, ec, dl.expired()));
    auto a = decode_ack(*h, p);
    if (!a) co_return make_error(a.error().message);
    co_return make_error("the prefill server could not run the prompt: " + a->message);
  }
  if (h->type != WireType::kHandoff)
    co_return make_error("KV transfer: expected a handoff, got message type " +
                         std::to_string(int(h->type)));
  uint64_t meta_len = 0;
  co_await asio::async_read(s, asio::buffer(&meta_len, 8), asio::redirect_error(use_awaitable, ec));
  if (ec) co_return make_error(io_error(doing, ec, dl.expired()));
  if (h->payload_bytes < 8 || meta_len > h->payload_bytes - 8 || meta_len > kPullPayload)
    co_return make_error("KV transfer: handoff message: metadata of " + std::to_string(meta_len) +
                         " bytes in a payload of " + std::to_string(h->payload_bytes));
  std::vector<uint8_t> meta(static_cast<size_t>(meta_len));
  co_await asio::async_read(s, asio::buffer(meta), asio::redirect_error(use_awaitable, ec));
  if (ec) co_return make_error(io_error(doing, ec, dl.expired()));
  auto m = decode_handoff_meta(*h, meta);
  if (!m) co_return make_error(m.error().message);
  WireHasher hash;
  hash.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&meta_len), 8));
  hash.update(meta);
  std::vector<uint8_t>& data = m->kv.data;
  try {
    data.resize(m->kv.pages.size() * size_t(m->kv.page_bytes));
  } catch (const std::bad_alloc&) {
    co_return make_error("KV transfer: cannot hold a handoff of " + std::to_string(h->payload_bytes) +
                         " bytes");
  }
  // In 1 MiB steps, each hashed while it is still in cache.
  for (size_t at = 0; at < data.size();) {
    const size_t step = std::min<size_t>(size_t(1) << 20, data.size() - at);
    co_await asio::async_read(s, asio::buffer(data.data() + at, step),
                              asio::redirect_error(use_awaitable, ec));
    if (ec) co_return make_error(io_error(doing, ec, dl.expired()));
    hash.update(std::span<const uint8_t>(data.data() + at, step));
    at += step;
  }
  if (hash.digest() != h->payload_hash)
    co_return make_error(
        "KV transfer: handoff message: the payload does not match its checksum (corrupted in "
        "transit)");
  co_return std::move(*m);
}

awaitable<Result<void>> write_bytes(tcp::socket& s, const Deadline& dl, const char* doing,
                                    std::span<const uint8_t> bytes, double pause = 0) {
  boost::system::error_code ec;
  size_t first = bytes.size();
  if (pause > 0) first = bytes.size() / 2;
  co_await asio::async_write(s, asio::buffer(bytes.data(), first),
                             asio::redirect_error(use_awaitable, ec));
  if (!ec && first < bytes.size()) {
    asio::steady_timer t(s.get_executor());
    t.expires_after(seconds(pause));
    co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
    ec = {};
    co_await asio::async_write(s, asio::buffer(bytes.data() + first, bytes.size() - first),
                               asio::redirect_error(use_awaitable, ec));
  }
  if (ec) co_return make_error(io_error(doing, ec, dl.expired()));
  co_return Result<void>{};
}

// Both sides: send our Hello, read theirs, refuse a different layout.
awaitable<Result<KvPeerInfo>> exchange_hello(tcp::socket& s, const Deadline& dl,
                                             const KvPeerInfo& self, WireRole role) {
  WireHello mine{role, self.model, self.layout_hash, self.layout};
  if (auto w = co_await write_bytes(s, dl, "sending hello", encode(mine)); !w)
    co_return make_error(w.error().message);
  auto m = co_await read_message(s, dl, "waiting for the peer's hello", kSmallPayload);
  if (!m) co_return make_error(m.error().message);
  auto h = decode_hello(m->header, m->payload);
  if (!h) co_return make_error(h.error().message);
  const WireRole want = role == WireRole::kPrefill ? WireRole::kDecode : WireRole::kPrefill;
  if (h->role != want)
    co_return make_error(std::string("KV transfer: the peer is a ") +
                         (h->role == WireRole::kPrefill ? "prefill" : "decode") +
                         " server too (a prefill server transfers to a decode server)");
  if (h->layout_hash != self.layout_hash)
    co_return make_error("KV transfer: the peer's KV layout differs from this server's: peer (" +
                         h->model + ") " + h->layout + "; this server (" + self.model + ") " +
                         self.layout);
  co_return KvPeerInfo{h->model, h->layout_hash, h->layout};
}

Result<std::pair<std::string, std::string>> split_peer(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == peer.size())
    return make_error("KV transfer: peer '" + peer + "' is not host:port");
  std::string host = peer.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return std::make_pair(host, peer.substr(colon + 1));
}

awaitable<Result<void>> connect(tcp::socket& s, const Deadline& dl, const std::string& peer) {
  auto hp = split_peer(peer);
  if (!hp) co_return make_error(hp.error().message);
  tcp::resolver resolver(s.get_executor());
  boost::system::error_code ec;
  auto eps = co_await resolver.async_resolve(hp->first, hp->second,
                                             asio::redirect_error(use_awaitable, ec));
  if (ec) co_return make_error("KV transfer: cannot resolve " + peer + ": " + ec.message());
  co_await asio::async_connect(s, eps, asio::redirect_error(use_awaitable, ec));
  if (ec)
    co_return make_error("KV transfer: cannot connect to the prefill server at " + peer + ": " +
                         (dl.expired() ? std::string("timed out") : ec.message()));
  s.set_option(tcp::no_delay(true), ec);
  co_return Result<void>{};
}

// One I/O thread running an io_context until the owner goes.
class IoThread {
 public:
  IoThread() : guard_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  ~IoThread() { stop(); }
  void stop() {
    guard_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  asio::io_context& io() { return io_; }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::thread thread_;
};

// ---- decode side ----

class TcpPull : public KvPull, public std::enable_shared_from_this<TcpPull> {
 public:
  TcpPull(asio::io_context& io) : sock(io), dl(io.get_executor(), sock), ack_timer(io) {
    ack_timer.expires_at(Clock::time_point::max());
  }
  void ack(uint32_t status, const std::string& message) override {
    auto self = shared_from_this();
    asio::post(sock.get_executor(), [self, status, message] {
      self->ack_status = status;
      self->ack_message = message;
      self->acked = true;
      self->ack_timer.cancel();
    });
  }
  void cancel() override {
    auto self = shared_from_this();
    asio::post(sock.get_executor(), [self] {
      self->cancelled = true;
      boost::system::error_code ec;
      self->sock.close(ec);
      self->ack_timer.cancel();
    });
  }
  tcp::socket sock;
  Deadline dl;
  asio::steady_timer ack_timer;
  bool acked = false, cancelled = false;
  uint32_t ack_status = 0;
  std::string ack_message;
};

class TcpPuller : public KvPuller {
 public:
  TcpPuller(KvPeerInfo self, TcpTransportOptions o) : self_(std::move(self)), o_(o) {}
  ~TcpPuller() override { io_.stop(); }

  std::shared_ptr<KvPull> pull(const std::string& peer, uint64_t request_id,
                               const Request& request, PullDone done) override {
    auto op = std::make_shared<TcpPull>(io_.io());
    WirePull msg{request_id, request};
    msg.request.on_event = nullptr;
    asio::co_spawn(io_.io(), run(op, peer, std::move(msg), std::move(done)), asio::detached);
    return op;
  }

  Result<KvPeerInfo> probe(const std::string& peer) override {
    std::promise<Result<KvPeerInfo>> p;
    auto f = p.get_future();
    asio::co_spawn(
        io_.io(),
        [this, peer, &p]() -> awaitable<void> {
          tcp::socket s(io_.io());
          Deadline dl(io_.io().get_executor(), s);
          dl.arm(o_.connect_timeout_seconds);
          auto c = co_await connect(s, dl, peer);
          if (!c) {
            p.set_value(make_error(c.error().message));
            co_return;
          }
          auto h = co_await exchange_hello(s, dl, self_, WireRole::kDecode);
          dl.disarm();
          p.set_value(std::move(h));
        },
        asio::detached);
    return f.get();
  }

 private:
  awaitable<void> run(std::shared_ptr<TcpPull> op, std::string peer, WirePull msg, PullDone done) {
    bool delivered = false;
    auto fail = [&](const std::string& why) {
      if (!delivered) done(make_error(op->cancelled ? "KV transfer: cancelled" : why));
      delivered = true;
    };
    op->dl.arm(o_.connect_timeout_seconds);
    if (auto c = co_await connect(op->sock, op->dl, peer); !c) co_return fail(c.error().message);
    if (auto h = co_await exchange_hello(op->sock, op->dl, self_, WireRole::kDecode); !h)
      co_return fail(h.error().message);
    op->dl.arm(o_.transfer_timeout_seconds);
    if (auto w = co_await write_bytes(op->sock, op->dl, "sending the pull", encode(msg)); !w)
      co_return fail(w.error().message);
    auto h = co_await read_handoff(op->sock, op->dl);
    if (!h) co_return fail(h.error().message);
    if (h->request_id != msg.request_id) co_return fail("KV transfer: a handoff for another request");
    op->dl.disarm();
    delivered = true;
    done(std::make_shared<KvHandoff>(std::move(h->kv)));
    // Wait for the caller's verdict, then tell the prefill side.
    boost::system::error_code ec;
    op->dl.arm(o_.transfer_timeout_seconds);
    while (!op->acked && !op->cancelled && !op->dl.expired())
      co_await op->ack_timer.async_wait(asio::redirect_error(use_awaitable, ec));
    if (op->acked) {
      WireAck a{msg.request_id, op->ack_status, op->ack_message};
      (void)co_await write_bytes(op->sock, op->dl, "sending the ack", encode(a));
    }
    op->dl.disarm();
    op->sock.close(ec);
  }

  KvPeerInfo self_;
  TcpTransportOptions o_;
  IoThread io_;
};

// ---- prefill side ----

class TcpPullServer : public KvPullServer {
 public:
  TcpPullServer(KvPeerInfo self, PullHandler handler, TcpTransportOptions o)
      : self_(std::move(self)), handler_(std::move(handler)), o_(o), acceptor_(io_.io()) {}
  ~TcpPullServer() override { stop(); }

  Result<void> listen(const std::string& host, int port) {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(host, ec);
    if (ec) return make_error("KV transfer: listen address '" + host + "': " + ec.message());
    tcp::endpoint ep(addr, uint16_t(port));
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return make_error("KV transfer: cannot listen on " + host + ":" + std::to_string(port) +
                        ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_.io(), accept_loop(), asio::detached);
    return {};
  }
  int port() const override { return port_; }
  KvPullServerStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  void stop() override {
    asio::post(io_.io(), [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
    });
    io_.stop();
  }

 private:
  template <class F>
  void count(F&& f) {
    std::lock_guard<std::mutex> lk(mu_);
    f(stats_);
  }

  awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      if (ec) continue;
      s.set_option(tcp::no_delay(true), ec);
      count([](auto& st) { ++st.connections; });
      asio::co_spawn(io_.io(), serve(std::move(s)), asio::detached);
    }
  }

  struct Pending {
    explicit Pending(asio::io_context& io) : timer(io) {
      timer.expires_at(Clock::time_point::max());
    }
    asio::steady_timer timer;
    std::optional<Result<std::shared_ptr<const KvHandoff>>> result;
    bool settled = false;  // the wait is over: the watcher below touches nothing
    bool gone = false;     // the peer went away while the prompt ran
  };

  awaitable<void> serve(tcp::socket s) {
    boost::system::error_code ec;
    std::string who = "a decode server";
    if (auto ep = s.remote_endpoint(ec); !ec)
      who += " at " + ep.address().to_string() + ":" + std::to_string(ep.port());
    Deadline dl(io_.io().get_executor(), s);
    dl.arm(o_.connect_timeout_seconds);
    auto hello = co_await exchange_hello(s, dl, self_, WireRole::kPrefill);
    if (!hello) {
      std::fprintf(stderr, "kvant serve: refused %s: %s\n", who.c_str(),
                   hello.error().message.c_str());
      count([](auto& st) { ++st.refused_peers; });
      s.close(ec);
      co_return;
    }
    // Pulls, one at a time, until the peer closes.
    for (;;) {
      dl.arm(o_.transfer_timeout_seconds);
      auto m = co_await read_message(s, dl, "waiting for a pull", kPullPayload);
      if (!m) break;  // the peer is done (or gone)
      auto pull = decode_pull(m->header, m->payload);
      if (!pull) {
        std::fprintf(stderr, "kvant serve: %s: %s\n", who.c_str(), pull.error().message.c_str());
        break;
      }
      count([](auto& st) { ++st.pulls; });
      const uint64_t id = pull->request_id;
      auto pending = std::make_shared<Pending>(io_.io());
      auto* io = &io_.io();
      PullReply reply = [pending, io](Result<std::shared_ptr<const KvHandoff>> r) {
        asio::post(*io, [pending, r = std::move(r)]() mutable {
          pending->result = std::move(r);
          pending->timer.cancel();
        });
      };
      std::function<void()> cancel = handler_(id, std::move(pull->request), std::move(reply));
      // While the prompt runs: a peer that goes away cancels it.
      dl.disarm();
      tcp::socket* sp = &s;
      s.async_wait(tcp::socket::wait_read, [pending, sp](const boost::system::error_code& e) {
        if (pending->settled || pending->result) return;
        boost::system::error_code ec2;
        if (e || sp->available(ec2) == 0 || ec2) {
          pending->gone = true;
          pending->timer.cancel();
        }
      });
      while (!pending->result && !pending->gone)
        co_await pending->timer.async_wait(asio::redirect_error(use_awaitable, ec));
      pending->settled = true;
      if (!pending->result) {
        if (cancel) cancel();
        count([](auto& st) { ++st.failed; });
        break;
      }
      dl.arm(o_.transfer_timeout_seconds);
      if (!*pending->result) {
        count([](auto& st) { ++st.failed; });
        WireAck a{id, 1, pending->result->error().message};
        if (!co_await write_bytes(s, dl, "sending a failure", encode(a))) break;
        continue;
      }
      std::shared_ptr<const KvHandoff> kv = std::move(**pending->result);
      const int64_t nth = sent_total_.fetch_add(1) + 1;
      if (o_.debug_flip_handoff == nth && !kv->data.empty()) {
        auto bad = std::make_shared<KvHandoff>(*kv);
        bad->data[bad->data.size() / 2] ^= 0x40;
        kv = std::move(bad);
        std::fprintf(stderr, "kvant serve: debug: flipped a byte of handoff %lld\n",
                     (long long)nth);
      }
      // The metadata, then the page bytes from the copy itself.
      const std::vector<uint8_t> head = encode_handoff_head(id, *kv);
      count([&](auto& st) {
        ++st.held;
        st.bytes_sent += int64_t(head.size() + kv->data.size());
      });
      auto w = co_await write_bytes(s, dl, "sending a handoff", head);
      if (w) w = co_await write_bytes(s, dl, "sending a handoff", kv->data, o_.debug_send_pause_seconds);
      if (!w) {
        count([](auto& st) {
          --st.held;
          ++st.failed;
        });
        break;
      }
      count([](auto& st) { ++st.sent; });
      // The copy is held until the Ack, or the lease ends.
      dl.arm(o_.lease_seconds);
      auto a = co_await read_message(s, dl, "waiting for the ack", kSmallPayload);
      const bool expired = dl.expired();
      kv.reset();
      std::optional<WireAck> ack;
      if (a)
        if (auto d = decode_ack(a->header, a->payload)) ack = std::move(*d);
      count([&](auto& st) {
        --st.held;
        if (ack && ack->status == 0)
          ++st.acked;
        else if (ack)
          ++st.rejected;
        else if (expired)
          ++st.leases_expired;
        else
          ++st.failed;
      });
      if (ack && ack->status != 0)
        std::fprintf(stderr, "kvant serve: %s refused the handoff of request %llu: %s\n",
                     who.c_str(), (unsigned long long)id, ack->message.c_str());
      if (!ack) break;
    }
    dl.disarm();
    s.close(ec);
  }

  KvPeerInfo self_;
  PullHandler handler_;
  TcpTransportOptions o_;
  IoThread io_;
  tcp::acceptor acceptor_;
  int port_ = 0;
  mutable std::mutex mu_;
  KvPullServerStats stats_;
  std::atomic<int64_t> sent_total_{0};
};

}  // namespace

std::unique_ptr<KvPuller> make_tcp_puller(KvPeerInfo self, TcpTransportOptions options) {
  return std::make_unique<TcpPuller>(std::move(self), options);
}

Result<std::unique_ptr<KvPullServer>> make_tcp_pull_server(const std::string& host, int port,
                                                           KvPeerInfo self, PullHandler handler,
                                                           TcpTransportOptions options) {
  auto s = std::make_unique<TcpPullServer>(std::move(self), std::move(handler), options);
  KV_TRY(s->listen(host, port));
  return std::unique_ptr<KvPullServer>(std::move(s));
}

}  // namespace kvant::disagg
