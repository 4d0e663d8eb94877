// KV transfer throughput (src/disagg/kv_transport.h) against a plain TCP
// copy of the same bytes between the same endpoints, and the checksum's
// cost per page.
//
// For each prompt length: a handoff of that many tokens' pages (random
// bytes, each page's XXH3 taken as the prefill engine does) is pulled over
// loopback through the TCP transport, whole: connect, Hello both ways, the
// pull, the handoff message (framed, hashed, sent, read, parsed), then the
// decode side's check of every page's checksum (as Engine::submit_handoff
// does) and the ack. The plain copy sends the handoff message's byte count
// over one connected socket and reads it on the other side, nothing else.
// Not timed: the prefill engine's computing the prompt and copying its
// pages out, and the decode engine's copying them into its pool.
//
//   kvant_bench_kv_transfer [--tokens 1024,4096,16384] [--bytes-per-token 23040]
//                           [--page-tokens 16] [--reps 5] [--json]
// The default bytes per token are SmolLM2-135M's with a BF16 cache (30
// layers x 3 KV heads x 64 x K and V x 2 bytes).
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
// clang-format on
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <random>
#include <thread>

#include "disagg/kv_transport.h"
#include "disagg/kv_wire.h"

using namespace kvant;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One plain copy of `n` bytes over a fresh loopback connection: seconds
// from connect to the last byte read.
double tcp_copy(size_t n, const std::vector<uint8_t>& src) {
  namespace asio = boost::asio;
  using tcp = asio::ip::tcp;
  asio::io_context io;
  tcp::acceptor acc(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = acc.local_endpoint().port();
  std::vector<uint8_t> dst(n);
  std::thread reader([&] {
    tcp::socket s = acc.accept();
    asio::read(s, asio::buffer(dst));
  });
  const auto t0 = Clock::now();
  tcp::socket c(io);
  c.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  c.set_option(tcp::no_delay(true));
  for (size_t at = 0; at < n; at += src.size())
    asio::write(c, asio::buffer(src.data(), std::min(src.size(), n - at)));
  reader.join();
  return since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KV transfer throughput against a plain TCP copy"};
  std::vector<int64_t> tokens{1024, 4096, 16384};
  int64_t bytes_per_token = 23040, page_tokens = 16;
  int reps = 5;
  bool json = false;
  app.add_option("--tokens", tokens, "prompt lengths")->delimiter(',');
  app.add_option("--bytes-per-token", bytes_per_token, "KV bytes per token");
  app.add_option("--page-tokens", page_tokens, "tokens per page");
  app.add_option("--reps", reps, "repetitions (the median is reported)")->check(CLI::Range(1, 1000));
  app.add_flag("--json", json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);

  const int64_t page_bytes = bytes_per_token * page_tokens;
  disagg::KvPeerInfo self{"bench", 1234, "bench layout"};
  std::shared_ptr<const KvHandoff> current;
  disagg::PullHandler handler = [&current](uint64_t, Request, disagg::PullReply reply) {
    reply(current);
    return std::function<void()>();
  };
  auto server = disagg::make_tcp_pull_server("127.0.0.1", 0, self, handler, {});
  if (!server) {
    std::fprintf(stderr, "%s\n", server.error().message.c_str());
    return 1;
  }
  auto puller = disagg::make_tcp_puller(self, {});
  const std::string peer = "127.0.0.1:" + std::to_string((*server)->port());
  std::mt19937_64 rng(7);
  std::string rows;
  for (int64_t n : tokens) {
    const int64_t pages = (n + page_tokens - 1) / page_tokens;
    auto kv = std::make_shared<KvHandoff>();
    kv->layout_hash = 1234;
    kv->page_bytes = page_bytes;
    kv->page_tokens = page_tokens;
    kv->prompt.assign(size_t(n), 1);
    kv->first_token = 2;
    kv->data.resize(size_t(pages * page_bytes));
    for (size_t i = 0; i + 8 <= kv->data.size(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(kv->data.data() + i, &r, 8);
    }
    kv->pages.resize(size_t(pages));
    const auto tc = Clock::now();
    for (int64_t p = 0; p < pages; ++p) {
      kv->pages[size_t(p)].src_page = uint32_t(p);
      kv->pages[size_t(p)].checksum =
          kv_page_checksum(kv->data.data() + p * page_bytes, page_bytes);
    }
    const double checksum_s = since(tc);
    current = kv;
    const size_t message_bytes = disagg::encode(disagg::WireHandoff{1, *kv}).size();
    Request req;
    req.prompt = kv->prompt;
    std::vector<double> pull_s, verify_s, tcp_s;
    for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
      std::promise<Result<std::shared_ptr<KvHandoff>>> got;
      const auto t0 = Clock::now();
      auto op = puller->pull(peer, uint64_t(r + 1), req,
                             [&got](Result<std::shared_ptr<KvHandoff>> x) { got.set_value(std::move(x)); });
      auto res = got.get_future().get();
      if (!res) {
        std::fprintf(stderr, "pull: %s\n", res.error().message.c_str());
        return 1;
      }
      const auto tv = Clock::now();
      const KvHandoff& h = **res;
      for (size_t p = 0; p < h.pages.size(); ++p)
        if (kv_page_checksum(h.data.data() + int64_t(p) * page_bytes, page_bytes) !=
            h.pages[p].checksum) {
          std::fprintf(stderr, "page %zu differs\n", p);
          return 1;
        }
      op->ack(0, "");
      const double v = since(tv), total = since(t0);
      const double copy = tcp_copy(message_bytes, kv->data);
      if (r == 0) continue;
      pull_s.push_back(total);
      verify_s.push_back(v);
      tcp_s.push_back(copy);
    }
    const double pull = median(pull_s), tcp = median(tcp_s), verify = median(verify_s);
    const double gb = double(message_bytes) / 1e9;
    char b[768];
    std::snprintf(b, sizeof b,
                  "%s{\"tokens\": %lld, \"pages\": %lld, \"message_bytes\": %zu, "
                  "\"pull_ms\": %.2f, \"pull_gbps\": %.2f, \"tcp_copy_ms\": %.2f, "
                  "\"tcp_copy_gbps\": %.2f, \"verify_ms\": %.2f, \"checksum_us_per_page\": %.2f, "
                  "\"checksum_gbps\": %.2f}",
                  rows.empty() ? "" : ", ", (long long)n, (long long)pages, message_bytes,
                  pull * 1e3, gb / pull, tcp * 1e3, gb / tcp, verify * 1e3,
                  checksum_s / double(pages) * 1e6,
                  double(pages * page_bytes) / 1e9 / checksum_s);
    rows += b;
    if (!json)
      std::printf("%6lld tokens, %5lld pages, %8.1f MB: pull %8.2f ms (%5.2f GB/s), plain TCP %8.2f ms "
                  "(%5.2f GB/s); checksums %.2f us/page\n",
                  (long long)n, (long long)pages, double(message_bytes) / 1e6, pull * 1e3, gb / pull,
                  tcp * 1e3, gb / tcp, checksum_s / double(pages) * 1e6);
  }
  if (json)
    std::printf("{\"page_bytes\": %lld, \"reps\": %d, \"results\": [%s]}\n", (long long)page_bytes,
                reps, rows.c_str());
  (*server)->stop();
  return 0;
}
