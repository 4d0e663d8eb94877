// Prometheus rendering of the server's metrics (see metrics.h).
#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace kvant::server {
namespace {

void line(std::string& out, const std::string& name, const char* type, const std::string& help,
          double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + b +
         "\n";
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lk(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + num(sum_) + "\n";
  out += name + "_count " + std::to_string(n_) + "\n";
}

Metrics::Metrics()
    : ttft({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}),
      e2e({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

void Metrics::set_engine(const EngineStats& s) {
  std::lock_guard<std::mutex> lk(mu_);
  stats_ = s;
}

EngineStats Metrics::engine() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void Metrics::count_finish(const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  ++finishes_[reason];
}

void Metrics::count_http(int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++http_[status];
}

std::string Metrics::render(const ServerGauges& g) const {
  EngineStats s;
  std::map<std::string, uint64_t> fin;
  std::map<int, uint64_t> http;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s = stats_;
    fin = finishes_;
    http = http_;
  }
  std::string o;
  line(o, "kvant_requests_running", "gauge", "Requests holding KV pages in the engine.",
       double(s.running));
  line(o, "kvant_requests_waiting", "gauge", "Requests queued in the engine's scheduler.",
       double(s.waiting));
  line(o, "kvant_requests_queued", "gauge",
       "Requests accepted by the server that have not produced a token yet.", double(g.queued));
  line(o, "kvant_requests_in_flight", "gauge", "Requests accepted by the server, not finished.",
       double(g.in_flight));
  line(o, "kvant_requests_queued_tokens", "gauge", "Prompt tokens of the queued requests.",
       double(g.queued_tokens));
  line(o, "kvant_request_bytes_held", "gauge",
       "Bytes the server holds for requests (bodies being read, prompts, answers).",
       double(g.held_bytes));
  line(o, "kvant_request_bytes_limit", "gauge", "The request byte budget (--max-request-memory).",
       double(g.held_bytes_limit));
  line(o, "kvant_http_connections", "gauge", "Open client connections.", double(g.connections));
  line(o, "kvant_http_worker_jobs", "gauge", "Parse and tokenize jobs queued or running.",
       double(g.worker_jobs));
  if (g.role == "decode") {
    line(o, "kvant_kv_pulls_total", "counter", "Prompts whose K/V was pulled from a prefill server.",
         double(g.kv_pulls));
    line(o, "kvant_kv_pulls_failed_total", "counter",
         "Pulls that ended without K/V (peer unreachable, refused, gone or timed out).",
         double(g.kv_pulls_failed));
    line(o, "kvant_kv_transfer_refused_total", "counter",
         "Handoffs that arrived and were refused (checksum, layout or shape): never decoded from.",
         double(g.kv_pulls_refused));
    line(o, "kvant_kv_pull_bytes_total", "counter", "KV page bytes pulled.",
         double(g.kv_pull_bytes));
    line(o, "kvant_kv_pages_reserved", "gauge",
         "Pages reserved for pulls in flight (taken before the prefill server is asked).",
         double(g.kv_pages_reserved));
    line(o, "kvant_kv_pulls_waiting", "gauge", "Pulls waiting for free pages (back-pressure).",
         double(g.kv_pulls_waiting));
  }
  if (g.role == "prefill") {
    const auto& k = g.kv_served;
    line(o, "kvant_kv_peer_connections_total", "counter", "KV transfer connections accepted.",
         double(k.connections));
    line(o, "kvant_kv_peers_refused_total", "counter",
         "KV transfer peers refused at connection (layout differs, bad hello).",
         double(k.refused_peers));
    line(o, "kvant_kv_handoffs_sent_total", "counter", "Handoffs sent to decode servers.",
         double(k.sent));
    line(o, "kvant_kv_handoffs_acked_total", "counter", "Handoffs a decode server took.",
         double(k.acked));
    line(o, "kvant_kv_handoffs_rejected_total", "counter",
         "Handoffs a decode server refused (checksum, layout or shape).", double(k.rejected));
    line(o, "kvant_kv_handoffs_failed_total", "counter",
         "Pulls that failed on this side (prompt failed, peer gone mid-transfer).",
         double(k.failed));
    line(o, "kvant_kv_leases_expired_total", "counter",
         "Handoff copies dropped because no ack came within the lease.",
         double(k.leases_expired));
    line(o, "kvant_kv_handoffs_held", "gauge", "Handoff copies waiting for their ack.",
         double(k.held));
    line(o, "kvant_kv_handoff_bytes_total", "counter", "Bytes of handoff messages sent.",
         double(k.bytes_sent));
  }
  line(o, "kvant_engine_step_failures_total", "counter",
       "Engine steps whose work failed (their requests got an error).", double(s.step_failures));
  line(o, "kvant_kv_pages_total", "gauge", "KV cache pages in the pool.", double(s.kv_pages_total));
  line(o, "kvant_kv_pages_used", "gauge",
       "KV cache pages allocated (held by requests or the prefix cache).", double(s.kv_pages_used));
  line(o, "kvant_kv_pages_cached", "gauge", "KV cache pages held by the prefix cache.",
       double(s.kv_pages_cached));
  line(o, "kvant_kv_pages_active", "gauge",
       "KV cache pages in use beyond the prefix cache (0 when no request runs).",
       double(std::max<int64_t>(0, s.kv_pages_used - s.kv_pages_cached)));
  line(o, "kvant_kv_usage_ratio", "gauge", "Fraction of KV cache pages allocated.",
       s.kv_pages_total ? double(s.kv_pages_used) / double(s.kv_pages_total) : 0.0);
  line(o, "kvant_kv_pages_peak", "gauge", "Most KV pages allocated at once.",
       double(s.kv_pages_peak));
  line(o, "kvant_prompt_tokens_total", "counter", "Prompt tokens computed (prefill).",
       double(s.prompt_tokens));
  line(o, "kvant_generation_tokens_total", "counter", "Tokens generated.",
       double(s.generated_tokens));
  line(o, "kvant_spec_decode_steps_total", "counter",
       "Decode steps of a request that carried draft tokens (speculative decoding).",
       double(s.spec_steps));
  line(o, "kvant_spec_decode_draft_tokens_total", "counter", "Draft tokens fed.",
       double(s.spec_draft_tokens));
  line(o, "kvant_spec_decode_accepted_tokens_total", "counter",
       "Draft tokens accepted (each a token generated without a step of its own).",
       double(s.spec_accepted_tokens));
  line(o, "kvant_mtp_seconds_total", "counter",
       "Seconds in the multi-token-prediction pass (servers started with --mtp).",
       s.mtp_seconds);
  line(o, "kvant_preemptions_total", "counter", "Requests preempted for KV pages.",
       double(s.preemptions));
  line(o, "kvant_prefix_cache_hit_tokens_total", "counter",
       "Prompt tokens served from the prefix cache.", double(s.prefix_hit_tokens));
  line(o, "kvant_prefix_cache_lookup_tokens_total", "counter",
       "Prompt tokens looked up in the prefix cache.", double(s.prefix_lookup_tokens));
  line(o, "kvant_integrity_passes_total", "counter", "KV integrity passes (one per step).",
       double(s.integrity_passes));
  line(o, "kvant_integrity_checks_total", "counter", "(request, page, generation) checks made.",
       double(s.integrity_checks));
  line(o, "kvant_integrity_violations_total", "counter",
       "Pages found changed under a request (that request is aborted).",
       double(s.integrity_violations));
  line(o, "kvant_engine_steps_total", "counter", "Engine steps run.", double(s.steps));
  o += "# HELP kvant_requests_finished_total Requests finished, by finish reason.\n"
       "# TYPE kvant_requests_finished_total counter\n";
  for (const char* r : {"stop", "length", "abort", "error"})
    o += std::string("kvant_requests_finished_total{reason=\"") + r + "\"} " +
         std::to_string(fin.count(r) ? fin.at(r) : 0) + "\n";
  o += "# HELP kvant_http_responses_total HTTP responses, by status code.\n"
       "# TYPE kvant_http_responses_total counter\n";
  for (const auto& [code, n] : http)
    o += "kvant_http_responses_total{code=\"" + std::to_string(code) + "\"} " + std::to_string(n) +
         "\n";
  ttft.render(o, "kvant_time_to_first_token_seconds", "Time from arrival to the first token.");
  itl.render(o, "kvant_inter_token_latency_seconds", "Time between a request's tokens.");
  e2e.render(o, "kvant_request_latency_seconds", "Time from arrival to the last token.");
  return o;
}

}  // namespace kvant::server
