// `kvant bench serve`: a closed-loop load generator against a running
// OpenAI-compatible server (kvant serve or any other). For each concurrency,
// that many client threads each send --requests-per-client streamed
// /v1/completions requests of exactly --prompt-tokens prompt tokens (random
// ids) and --gen-tokens generated tokens (ignore_eos), and it reports request
// throughput, output tokens/s, and TTFT, TPOT and inter-token latency
// percentiles as JSON; --plot renders them with bench/plot_serve.py.
// Latencies are measured at the client, from the request's first byte sent.
#include <algorithm>
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
// clang-format on
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "eval/http_client.h"

namespace kvant::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ServeBenchOpts {
  std::string url = "http://127.0.0.1:8080";
  std::string model;  // default: the first of /v1/models
  std::string api_key;
  std::string concurrency = "1,8,32,64";
  int prompt_tokens = 128;
  int gen_tokens = 64;
  int requests_per_client = 4;
  int vocab_lo = 1000, vocab_hi = 30000;  // prompt ids drawn from [lo, hi)
  std::string out;                        // JSON file; stdout when empty
  std::string plot;                       // PNG, through bench/plot_serve.py
};

using eval::first_served_model;
using eval::HttpTarget;
using eval::parse_http_url;
using Target = HttpTarget;

struct Sample {
  bool ok = false;
  std::string error;
  double e2e = 0, ttft = 0;
  int64_t tokens = 0;  // from the final usage object
  int64_t events = 0;  // streamed chunks with text
  std::vector<double> itl;
};

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Sample one_request(const Target& t, const ServeBenchOpts& o, const std::string& model,
                   std::mt19937& rng) {
  Sample s;
  json body = {{"model", model},     {"max_tokens", o.gen_tokens},
               {"ignore_eos", true}, {"stream", true},
               {"temperature", 0},   {"stream_options", {{"include_usage", true}}}};
  std::uniform_int_distribution<int> id(o.vocab_lo, o.vocab_hi - 1);
  json prompt = json::array();
  for (int i = 0; i < o.prompt_tokens; ++i) prompt.push_back(id(rng));
  body["prompt"] = prompt;
  try {
    asio::io_context ioc;
    tcp::resolver res(ioc);
    tcp::socket sock(ioc);
    asio::connect(sock, res.resolve(t.host, t.port));
    http::request<http::string_body> req{http::verb::post, t.prefix + "/v1/completions", 11};
    req.set(http::field::host, t.host);
    req.set(http::field::content_type, "application/json");
    if (!o.api_key.empty()) req.set(http::field::authorization, "Bearer " + o.api_key);
    req.body() = body.dump();
    req.prepare_payload();
    const auto t0 = Clock::now();
    http::write(sock, req);
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    http::read_header(sock, buf, p);
    if (p.get().result() != http::status::ok) {
      s.error = "HTTP " + std::to_string(p.get().result_int());
      return s;
    }
    std::string pending;
    char tmp[16384];
    bool done = false, first = true;
    Clock::time_point last;
    while (!p.is_done()) {
      p.get().body().data = tmp;
      p.get().body().size = sizeof tmp;
      beast::error_code ec;
      http::read_some(sock, buf, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec && ec != http::error::end_of_stream) throw beast::system_error(ec);
      const auto now = Clock::now();
      pending.append(tmp, sizeof tmp - p.get().body().size);
      size_t pos;
      while ((pos = pending.find("\n\n")) != std::string::npos) {
        std::string ev = pending.substr(0, pos);
        pending.erase(0, pos + 2);
        if (ev.rfind("data: ", 0) != 0) continue;
        ev.erase(0, 6);
        if (ev == "[DONE]") {
          done = true;
          continue;
        }
        json j = json::parse(ev);
        if (j.contains("usage") && j["usage"].is_object())
          s.tokens = j["usage"].value("completion_tokens", int64_t(0));
        if (!j["choices"].empty() && !j["choices"][0].value("text", std::string()).empty()) {
          if (first)
            s.ttft = secs(t0, now);
          else
            s.itl.push_back(secs(last, now));
          first = false;
          last = now;
          ++s.events;
        }
      }
      if (ec) break;
    }
    s.e2e = secs(t0, Clock::now());
    // A server that sends no usage object (stream_options not read): one
    // token per streamed chunk, as llama-server and kvant stream them.
    if (s.tokens == 0) s.tokens = s.events;
    s.ok = done;
    if (!done) s.error = "the stream ended without [DONE]";
  } catch (const std::exception& e) {
    s.error = e.what();
  }
  return s;
}

json percentiles_ms(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  auto q = [&](double p) {
    const double pos = p * double(v.size() - 1);
    const size_t i = size_t(pos);
    const double f = pos - double(i);
    return 1e3 * (i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i]);
  };
  double sum = 0;
  for (double x : v) sum += x;
  return {
      {"mean", 1e3 * sum / double(v.size())}, {"p50", q(0.5)}, {"p95", q(0.95)}, {"p99", q(0.99)}};
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

int run_bench_serve(const ServeBenchOpts& o) {
  Target t;
  if (!parse_http_url(o.url, t)) return fail("--url must look like http://HOST:PORT, got " + o.url);
  std::vector<int> concs;
  for (size_t a = 0; a <= o.concurrency.size();) {
    size_t b = o.concurrency.find(',', a);
    if (b == std::string::npos) b = o.concurrency.size();
    try {
      concs.push_back(std::stoi(o.concurrency.substr(a, b - a)));
    } catch (...) {
      return fail("--concurrency: not a list of numbers: " + o.concurrency);
    }
    if (concs.back() < 1) return fail("--concurrency values must be >= 1");
    a = b + 1;
  }
  std::string model = o.model;
  if (model.empty()) {
    auto m = first_served_model(t, o.api_key);
    if (!m) return fail("cannot list models at " + o.url + ": " + m.error().message);
    model = *m;
  }
  json runs = json::array();
  int failures = 0;
  for (int c : concs) {
    std::vector<Sample> samples;
    std::mutex mu;
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < c; ++i)
      threads.emplace_back([&, i] {
        std::mt19937 rng(uint32_t(1000003 * c + i));
        for (int k = 0; k < o.requests_per_client; ++k) {
          Sample s = one_request(t, o, model, rng);
          std::lock_guard<std::mutex> lk(mu);
          samples.push_back(std::move(s));
        }
      });
    for (auto& th : threads) th.join();
    const double dur = secs(t0, Clock::now());
    std::vector<double> ttft, tpot, itl, e2e;
    int64_t tokens = 0, ok = 0;
    std::string first_error;
    for (const auto& s : samples) {
      if (!s.ok) {
        if (first_error.empty()) first_error = s.error;
        continue;
      }
      ++ok;
      tokens += s.tokens;
      ttft.push_back(s.ttft);
      e2e.push_back(s.e2e);
      if (s.tokens > 1) tpot.push_back((s.e2e - s.ttft) / double(s.tokens - 1));
      itl.insert(itl.end(), s.itl.begin(), s.itl.end());
    }
    failures += int(samples.size()) - int(ok);
    json r = {{"concurrency", c},
              {"requests", samples.size()},
              {"failed", int64_t(samples.size()) - ok},
              {"duration_s", dur},
              {"request_throughput", double(ok) / dur},
              {"output_tok_s", double(tokens) / dur},
              {"ttft_ms", percentiles_ms(ttft)},
              {"tpot_ms", percentiles_ms(tpot)},
              {"itl_ms", percentiles_ms(itl)},
              {"e2e_ms", percentiles_ms(e2e)}};
    if (!first_error.empty()) r["first_error"] = first_error;
    std::fprintf(stderr,
                 "concurrency %3d: %5.2f req/s, %7.1f output tok/s, TTFT p50 %.0f ms, TPOT p50 "
                 "%.1f ms%s\n",
                 c, double(ok) / dur, double(tokens) / dur,
                 ttft.empty() ? 0.0 : r["ttft_ms"]["p50"].get<double>(),
                 tpot.empty() ? 0.0 : r["tpot_ms"]["p50"].get<double>(),
                 first_error.empty() ? "" : (", errors: " + first_error).c_str());
    runs.push_back(r);
  }
  json j = {{"url", o.url},
            {"model", model},
            {"prompt_tokens", o.prompt_tokens},
            {"gen_tokens", o.gen_tokens},
            {"requests_per_client", o.requests_per_client},
            {"runs", runs}};
  std::string out = o.out;
  if (out.empty() && !o.plot.empty()) {
    out = o.plot;
    if (out.size() > 4 && out.ends_with(".png")) out.resize(out.size() - 4);
    out += ".json";
  }
  if (out.empty()) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::ofstream f(out);
    f << j.dump(2) << "\n";
    if (!f) return fail("cannot write " + out);
  }
  if (!o.plot.empty()) {
    const char* py = std::getenv("KVANT_PYTHON");
    const std::string cmd = std::string(py ? py : ".venv/bin/python") + " bench/plot_serve.py '" +
                            out + "' '" + o.plot + "'";
    if (std::system(cmd.c_str()) != 0)
      return fail("plotting failed: " + cmd +
                  " (run from the repository root, or set KVANT_PYTHON)");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

void register_bench_serve(CLI::App& bench) {
  static ServeBenchOpts o;
  auto* cmd = bench.add_subcommand("serve", "Benchmark a running OpenAI-compatible server");
  cmd->add_option("--url", o.url, "server address, e.g. http://127.0.0.1:8080");
  cmd->add_option("--model", o.model, "model id (default: the server's first)");
  cmd->add_option("--api-key", o.api_key, "bearer token");
  cmd->add_option("--concurrency", o.concurrency, "client counts, e.g. 1,8,32,64");
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "prompt tokens per request")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen-tokens", o.gen_tokens, "generated tokens per request")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--requests-per-client", o.requests_per_client, "requests each client sends")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--out", o.out, "write the JSON here (default: stdout)");
  cmd->add_option("--plot", o.plot, "also draw a PNG with bench/plot_serve.py (matplotlib)");
  cmd->callback([] { set_exit_code(run_bench_serve(o)); });
}

}  // namespace kvant::cli
