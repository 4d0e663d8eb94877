// Server metrics in the Prometheus text format: the engine's counters (from
// a snapshot the engine loop takes after each step, since Engine::stats() is
// not thread-safe), latency histograms measured here from event timestamps,
// and HTTP/request outcome counters. Owns no engine state; every method is
// thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "disagg/kv_transport.h"
#include "engine/engine.h"

namespace kvant::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines (the caller holds no lock).
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1], the last is +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct ServerGauges {
  int64_t queued = 0;     // submitted, no event yet
  int64_t in_flight = 0;  // submitted, not finished
  int64_t queued_tokens = 0;     // prompt tokens of the queued requests
  int64_t held_bytes = 0;        // the request byte budget in use
  int64_t held_bytes_limit = 0;
  int64_t connections = 0;
  int64_t worker_jobs = 0;  // parse/tokenize jobs queued or running
  // Disaggregation (role "prefill" or "decode"; not rendered otherwise).
  std::string role;
  int64_t kv_pulls = 0, kv_pulls_failed = 0, kv_pulls_refused = 0;  // decode side
  int64_t kv_pull_bytes = 0, kv_pages_reserved = 0, kv_pulls_waiting = 0;
  disagg::KvPullServerStats kv_served;  // prefill side
};

class Metrics {
 public:
  Metrics();
  Histogram ttft, itl, e2e;
  void set_engine(const EngineStats& s);
  EngineStats engine() const;
  void count_finish(const std::string& reason);
  void count_http(int status);
  std::string render(const ServerGauges& g) const;

 private:
  mutable std::mutex mu_;
  EngineStats stats_;
  std::map<std::string, uint64_t> finishes_;
  std::map<int, uint64_t> http_;
};

}  // namespace kvant::server
