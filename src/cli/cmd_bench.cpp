// `kvant bench`: prefill and decode throughput on random tokens, measured the
// way llama.cpp's llama-bench measures pp/tg: prefill is one forward over
// `--prompt-tokens` tokens, decode is `--gen-tokens` single-token steps from
// an empty context; each repeated `--reps` times, mean reported. With
// `--batched NPL`, llama.cpp's llama-batched-bench measure instead: NPL
// sequences prefilled and then decoded together (run_batched).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "backend/backend.h"

namespace kvant::cli {
namespace {

struct BenchOpts {
  std::string model;
  // Batch mode (through the engine) when concurrency is given.
  std::string concurrency;         // e.g. 1,8,32,64
  std::string kv_dtypes = "bf16";  // e.g. bf16,fp8_e4m3
  std::string integrity = "on";    // on, off or on,off
  std::string kv_memory;
  std::string kv_scale = "dynamic";
  // Weight precisions to compare: "bf16", "int4", "native", or "P/D" (prefill
  // P, decode D, both resident), comma-separated.
  std::string weights = "native";
  int int4_group = 128;
  bool int4_lm_head = false;
  int requests_per_client = 2;
  int max_step_tokens = 512;
  int page_tokens = 16;
  std::string batched;  // e.g. 1,8,32,64: the batched (decode-only) measure
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int threads = 0;
  std::string device = "cpu";
  int reps = 3;
  bool json = false;
  // Under mpirun (README: Several processes).
  int tp = 1, ep = 1;
  double dist_timeout = 30;
  bool comm_split = false;
};

// [0.1234, 0.5678]: shares as a JSON list.
std::string json_list(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.4f", i ? ", " : "", v[i]);
    out += b;
  }
  return out + "]";
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

int run_batch_bench(const BenchOpts& o);
std::vector<std::string> split_list(const std::string& s);

// "P" or "P/D" -> (prefill, decode) precision names.
std::pair<std::string, std::string> phase_weights(const std::string& spec) {
  const size_t k = spec.find('/');
  if (k == std::string::npos) return {spec, spec};
  return {spec.substr(0, k), spec.substr(k + 1)};
}

// A phase's precision name, checked.
Result<std::string> precision(const std::string& s) {
  if (s == "native" || s == "bf16" || s == "fp8" || s == "int4") return s;
  return make_error("--weights: expected native, bf16, fp8, int4 or P/D, got '" + s + "'");
}

int run_single(const BenchOpts& o, const std::string& wspec);
int run_batched(const BenchOpts& o);
double percentile(std::vector<double> v, double q);

int run_bench(const BenchOpts& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  if (!o.concurrency.empty() && !o.batched.empty())
    return fail("--concurrency and --batched are two measures: give one");
  if (!o.batched.empty()) return run_batched(o);
  if (!o.concurrency.empty()) return run_batch_bench(o);
  for (const auto& w : split_list(o.weights))
    if (int rc = run_single(o, w); rc != 0) return rc;
  return 0;
}

RunnerOptions runner_options(const BenchOpts& o, const std::string& prefill,
                             const std::string& decode) {
  RunnerOptions ro;
  ro.model_path = o.model;
  ro.prefill_weights = prefill;
  ro.decode_weights = decode;
  ro.int4_group = o.int4_group;
  ro.int4_lm_head = o.int4_lm_head;
  ro.backend = o.device;
  return ro;
}

int run_single(const BenchOpts& o, const std::string& wspec) {
  const auto [pw, dw] = phase_weights(wspec);
  auto pp_prec = precision(pw), dd_prec = precision(dw);
  if (!pp_prec) return fail(pp_prec.error().message);
  if (!dd_prec) return fail(dd_prec.error().message);
  const double t_load = now_s();
  RunnerOptions ro = runner_options(o, *pp_prec, *dd_prec);
  // Under mpirun every rank runs this same loop over the same random
  // tokens: each forward is collective, and rank 0 reports.
  int rank = 0;
  if (dist::launched_by_mpirun() || o.tp > 1 || o.ep > 1) {
    if (!dist::launched_by_mpirun()) return fail("--tp / --ep run under mpirun -np N");
    auto comm = dist::make_communicator("mpi");
    if (!comm) return fail(comm.error().message);
    (*comm)->set_timeout(o.dist_timeout);
    rank = (*comm)->rank();
    ro.comm = std::shared_ptr<dist::Communicator>(std::move(*comm));
    ro.tp = o.tp;
    ro.ep = o.ep;
  }
  auto m = ModelRunner::load(ro);
  if (!m) {
    std::fprintf(stderr, "kvant: %s\n", m.error().message.c_str());
    return 1;
  }
  const double load_s = now_s() - t_load;
  ModelRunner& model = **m;
  const auto& c = model.config();
  const int64_t ctx = std::max(o.prompt_tokens, o.gen_tokens) + 1;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab - 1));
  std::vector<float> logits(size_t(c.vocab));
  double pp_sum = 0, tg_sum = 0, tg_comm = 0, tg_wait = 0;
  if (o.comm_split) model.set_comm_split(true);
  for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms up
    SeqKvOptions kvo;
    kvo.arena = model.kv_arena();  // on the backend's device
    SeqKv kv(c, ctx, kvo);
    double pp = 0, tg = 0;
    if (o.prompt_tokens > 0) {
      std::vector<int32_t> ids;
      for (int i = 0; i < o.prompt_tokens; ++i) ids.push_back(tok(rng));
      const RunChunk chunk{&kv, 0, ids, false};
      const double t0 = now_s();
      auto r = model.forward(chunk, logits);
      pp = now_s() - t0;
      if (!r.ok()) {
        std::fprintf(stderr, "kvant: %s\n", r.error().message.c_str());
        return 1;
      }
    }
    if (o.gen_tokens > 0) {
      SeqKv kv2(c, ctx, kvo);
      int32_t next = tok(rng);
      RunChunk chunk{&kv2, 0, std::span<const int32_t>(&next, 1), false};
      const double c0 = model.comm_seconds(), w0 = model.comm_wait_seconds();
      const double t0 = now_s();
      for (int i = 0; i < o.gen_tokens; ++i) {
        chunk.pos0 = i;
        auto r = model.forward(chunk, logits);
        if (!r.ok()) {
          std::fprintf(stderr, "kvant: %s\n", r.error().message.c_str());
          return 1;
        }
        next = Sampler::argmax(logits);
      }
      tg = now_s() - t0;
      if (rep > 0) {
        tg_comm += model.comm_seconds() - c0;
        tg_wait += model.comm_wait_seconds() - w0;
      }
    }
    if (rep > 0) {
      pp_sum += pp;
      tg_sum += tg;
    }
  }
  const double pp_s = o.prompt_tokens > 0 ? o.prompt_tokens * o.reps / pp_sum : 0;
  const double tg_s = o.gen_tokens > 0 ? o.gen_tokens * o.reps / tg_sum : 0;
  const std::string isa_s = model.device();
  const char* isa = isa_s.c_str();
  // Every rank's share: time in collectives is the peers' late arrival plus
  // the transfer, so the rank that was most often last (the smallest share)
  // bounds what the transfer itself costs.
  // With --comm-split, each share also splits into the wait for the last
  // rank (a timed barrier before each collective) and the transfer after it.
  const auto every_rank = [&](double mine) {
    std::vector<double> v(1, mine);
    if (ro.comm) {
      v.assign(size_t(ro.comm->size()), 0.0);
      auto g = ro.comm->all_gather(std::as_bytes(std::span<const double>(&mine, 1)),
                                   std::as_writable_bytes(std::span<double>(v)));
      if (!g) {
        std::fprintf(stderr, "kvant: %s\n", g.error().message.c_str());
        ro.comm->abort(1);
      }
    }
    return v;
  };
  const std::vector<double> shares = every_rank(tg_sum > 0 ? tg_comm / tg_sum : 0.0);
  const std::vector<double> waits = every_rank(tg_sum > 0 ? tg_wait / tg_sum : 0.0);
  const std::string shares_json = json_list(shares);
  std::string split_json;
  if (o.comm_split) {
    std::vector<double> transfers(shares.size());
    for (size_t i = 0; i < shares.size(); ++i) transfers[i] = shares[i] - waits[i];
    split_json = "\"decode_comm_wait_share_ranks\": " + json_list(waits) +
                 ", \"decode_comm_transfer_share_ranks\": " + json_list(transfers) + ", ";
  }
  const double share_min = *std::min_element(shares.begin(), shares.end());
  if (rank != 0) return 0;
  // Both sets stay resident when the phases differ.
  const size_t pre_bytes = model.set_bytes(model.prefill_set()),
               dec_bytes = model.set_bytes(model.decode_set());
  const size_t resident = model.prefill_set() == model.decode_set() ? dec_bytes : pre_bytes + dec_bytes;
  if (o.json) {
    std::printf(
        "{\"model\": \"%s\", \"arch\": \"%s\", \"threads\": %d, \"isa\": \"%s\", "
        "\"tp\": %d, \"ep\": %d, \"decode_comm_share\": %.4f, "
        "\"decode_comm_share_ranks\": %s, \"decode_comm_share_min\": %.4f, %s"
        "\"weights\": \"%s\", \"prefill_weights\": \"%s\", \"decode_weights\": \"%s\", "
        "\"int4_group\": %d, \"int4_lm_head\": %s, \"weight_bytes\": %zu, \"prefill_weight_bytes\": %zu, "
        "\"resident_weight_bytes\": %zu, \"prompt_tokens\": %d, \"gen_tokens\": %d, "
        "\"reps\": %d, \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"load_s\": %.3f}\n",
        o.model.c_str(), c.arch_name.c_str(), num_threads(), isa, o.tp, o.ep,
        tg_sum > 0 ? tg_comm / tg_sum : 0.0, shares_json.c_str(), share_min, split_json.c_str(), wspec.c_str(),
        model.set_precision(model.prefill_set()).c_str(),
        model.set_precision(model.decode_set()).c_str(), o.int4_group,
        o.int4_lm_head ? "true" : "false", dec_bytes, pre_bytes, resident, o.prompt_tokens,
        o.gen_tokens, o.reps, pp_s, tg_s,
        load_s);
  } else {
    std::printf("model %s (%s), %d threads, %s kernels, weights: prefill %s (%.1f MiB), decode "
                "%s (%.1f MiB), %.1f MiB resident, load %.2f s\n",
                o.model.c_str(), c.arch_name.c_str(), num_threads(), isa,
                model.set_precision(model.prefill_set()).c_str(), double(pre_bytes) / (1 << 20),
                model.set_precision(model.decode_set()).c_str(), double(dec_bytes) / (1 << 20),
                double(resident) / (1 << 20), load_s);
    std::printf("prefill pp%d: %.1f tok/s\ndecode tg%d: %.1f tok/s\n", o.prompt_tokens, pp_s,
                o.gen_tokens, tg_s);
    if (ro.comm)
      std::printf("tp %d ep %d: collectives %.1f%% of decode time (ranks %s; the smallest "
                  "bounds the transfer)\n",
                  o.tp, o.ep, tg_sum > 0 ? 100.0 * tg_comm / tg_sum : 0.0, shares_json.c_str());
  }
  return 0;
}

// The measure llama.cpp's llama-batched-bench makes, over the model alone
// (no scheduler or sampling): for each NPL, NPL sequences of --prompt-tokens
// random tokens are prefilled (whole prompts batched together, up to
// --max-step-tokens rows a forward), then --gen-tokens steps each decode
// one token in every sequence in one forward. decode_tok_s = NPL *
// gen-tokens / decode seconds is llama-batched-bench's S_TG, prefill_tok_s
// its S_PP, total_tok_s its S. Each NPL is measured --reps times after a
// short warm-up; medians reported.
int run_batched(const BenchOpts& o) {
  if (o.tp > 1 || o.ep > 1 || dist::launched_by_mpirun())
    return fail("--batched measures one process (no --tp/--ep, not under mpirun)");
  if (o.prompt_tokens < 1 || o.gen_tokens < 1)
    return fail("--batched needs --prompt-tokens and --gen-tokens of at least 1");
  std::vector<int> npls;
  for (auto& c : split_list(o.batched)) {
    try {
      npls.push_back(std::stoi(c));
    } catch (...) {
      return fail("--batched: not a number: '" + c + "'");
    }
    if (npls.back() < 1 || npls.back() > 4096) return fail("--batched values must be in 1..4096");
  }
  if (npls.empty()) return fail("--batched: give sequence counts, e.g. 1,8,32,64");
  const auto ws = split_list(o.weights);
  if (ws.size() != 1) return fail("--batched takes one --weights value");
  const auto [pw, dw] = phase_weights(ws[0]);
  auto pp_prec = precision(pw), dd_prec = precision(dw);
  if (!pp_prec) return fail(pp_prec.error().message);
  if (!dd_prec) return fail(dd_prec.error().message);
  std::vector<KvDType> dtypes;
  for (auto& d : split_list(o.kv_dtypes)) {
    auto k = parse_kv_dtype(d);
    if (!k) return fail(k.error().message);
    dtypes.push_back(*k);
  }
  auto m = ModelRunner::load(runner_options(o, *pp_prec, *dd_prec));
  if (!m) return fail(m.error().message);
  ModelRunner& model = **m;
  const auto& c = model.config();
  const int64_t ctx = int64_t(o.prompt_tokens) + o.gen_tokens;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab - 1));
  const auto median = [](std::vector<double> v) { return percentile(std::move(v), 0.5); };
  nlohmann::json configs = nlohmann::json::array();
  for (KvDType dt : dtypes) {
    SeqKvOptions kvo;
    kvo.arena = model.kv_arena();
    kvo.elem = dt;
    kvo.dynamic_scales = dt != KvDType::kBf16;
    kvo.page_tokens = o.page_tokens;
    for (int npl : npls) {
      std::vector<double> pps, tgs;
      for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0: a short warm-up
        const bool warm = rep == 0;
        const int n = warm ? std::min(npl, 2) : npl;
        const int p = warm ? std::min(o.prompt_tokens, 16) : o.prompt_tokens;
        const int g = warm ? std::min(o.gen_tokens, 2) : o.gen_tokens;
        std::vector<std::unique_ptr<SeqKv>> kv;
        std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          kv.push_back(std::make_unique<SeqKv>(c, ctx, kvo));
          for (int t = 0; t < p; ++t) ids[size_t(i)].push_back(tok(rng));
        }
        model.reserve(std::max<int64_t>(n, std::min<int64_t>(int64_t(n) * p, o.max_step_tokens)), ctx);
        std::vector<float> logits(size_t(n) * size_t(c.vocab));
        std::vector<RunChunk> chunks;
        const double t0 = now_s();
        for (int i = 0; i < n;) {  // whole prompts, up to max_step_tokens rows a forward
          chunks.clear();
          int64_t rows = 0;
          for (; i < n && (chunks.empty() || rows + p <= o.max_step_tokens); ++i) {
            chunks.push_back(RunChunk{kv[size_t(i)].get(), 0, ids[size_t(i)], false});
            rows += p;
          }
          if (auto r = model.forward(chunks, logits); !r) return fail(r.error().message);
        }
        const double t1 = now_s();
        std::vector<int32_t> next(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) next[size_t(i)] = tok(rng);
        for (int s = 0; s < g; ++s) {
          chunks.clear();
          for (int i = 0; i < n; ++i)
            chunks.push_back(RunChunk{kv[size_t(i)].get(), int64_t(p) + s,
                                      std::span<const int32_t>(&next[size_t(i)], 1), false});
          if (auto r = model.forward(chunks, logits); !r) return fail(r.error().message);
          for (int i = 0; i < n; ++i) {
            const float* row = logits.data() + size_t(i) * size_t(c.vocab);
            next[size_t(i)] = Sampler::argmax(std::span<const float>(row, size_t(c.vocab)));
          }
        }
        const double t2 = now_s();
        if (warm) continue;
        pps.push_back(t1 - t0);
        tgs.push_back(t2 - t1);
      }
      const double pp_s = median(pps), tg_s = median(tgs);
      const double prefill = double(npl) * o.prompt_tokens / pp_s;
      const double decode = double(npl) * o.gen_tokens / tg_s;
      const double total = double(npl) * (o.prompt_tokens + o.gen_tokens) / (pp_s + tg_s);
      nlohmann::json j;
      j["kv_dtype"] = kv_dtype_name(dt);
      j["npl"] = npl;
      j["prompt_tokens"] = o.prompt_tokens;
      j["gen_tokens"] = o.gen_tokens;
      j["prefill_s"] = pp_s;
      j["decode_s"] = tg_s;
      j["prefill_tok_s"] = prefill;
      j["decode_tok_s"] = decode;
      j["total_tok_s"] = total;
      j["decode_step_ms"] = tg_s * 1e3 / o.gen_tokens;
      configs.push_back(j);
      std::fprintf(stderr,
                   "%-9s npl %4d: prefill %8.1f tok/s (%6.2f s) | decode %8.1f tok/s (%7.2f ms a "
                   "step) | total %8.1f tok/s\n",
                   kv_dtype_name(dt), npl, prefill, pp_s, decode, tg_s * 1e3 / o.gen_tokens, total);
    }
  }
  nlohmann::json j;
  j["model"] = o.model;
  j["arch"] = c.arch_name;
  j["threads"] = num_threads();
  j["device"] = model.device();
  j["weights"] = ws[0];
  j["prefill_weights"] = model.set_precision(model.prefill_set());
  j["decode_weights"] = model.set_precision(model.decode_set());
  j["reps"] = o.reps;
  j["max_step_tokens"] = o.max_step_tokens;
  j["configs"] = configs;
  if (o.json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

struct ReqTiming {
  double submit = 0, first = 0, last = 0;
  int64_t tokens = 0;
  bool done = false;
  bool failed = false;
};

// One configuration: `conc` clients in a closed loop (a client submits its
// next request when the previous one finishes), each request a random
// prompt of P tokens generating exactly G tokens.
int run_batch_config(const BenchOpts& o, const std::string& wspec, const std::string& dtype,
                     int conc, bool integrity, nlohmann::json& out) {
  EngineFlags f;
  std::tie(f.prefill_weights, f.decode_weights) = phase_weights(wspec);
  f.int4_group = o.int4_group;
  f.int4_lm_head = o.int4_lm_head;
  f.model = o.model;
  f.threads = o.threads;
  f.device = o.device;
  f.kv_dtype = dtype;
  f.kv_scale = o.kv_scale;
  f.kv_memory = o.kv_memory;
  f.page_tokens = o.page_tokens;
  f.max_step_tokens = o.max_step_tokens;
  f.max_running = conc;
  f.no_prefix_cache = true;
  f.no_integrity = !integrity;
  f.tp = o.tp;
  f.ep = o.ep;
  f.dist_timeout = o.dist_timeout;
  auto eo = engine_options(f);
  if (!eo) return fail(eo.error().message);
  eo->log_capacity = false;
  auto created = Engine::create(*eo);
  if (!created) return fail(created.error().message);
  Engine& eng = **created;
  if (eng.rank() != 0) {  // every rank goes through the same configurations
    auto r = eng.follow();
    return r ? 0 : fail(r.error().message);
  }
  const int64_t vocab = eng.model_config().vocab;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab - 1));
  auto make = [&](ReqTiming* t) {
    Request r;
    for (int i = 0; i < o.prompt_tokens; ++i) r.prompt.push_back(tok(rng));
    r.stop.max_tokens = o.gen_tokens;
    r.stop.ignore_eos = true;
    r.on_event = [t](const RequestEvent& e) {
      const double now = now_s();
      if (e.token >= 0) {
        if (t->tokens == 0) t->first = now;
        t->last = now;
        ++t->tokens;
      }
      if (e.finish != FinishReason::None) {
        t->done = true;
        t->failed = e.finish == FinishReason::Error;
      }
    };
    return r;
  };
  {  // warm-up: one short request
    ReqTiming w;
    Request r = make(&w);
    r.prompt.resize(std::min<size_t>(r.prompt.size(), 32));
    r.stop.max_tokens = 4;
    if (auto id = eng.submit(std::move(r)); !id) return fail(id.error().message);
    if (auto d = eng.run_until_idle(); !d) return fail(d.error().message);
  }
  const EngineStats s0 = eng.stats();
  const int total = conc * o.requests_per_client;
  std::vector<ReqTiming> tim(static_cast<size_t>(total));

  int submitted = 0, finished = 0;
  std::vector<int> active(size_t(conc), -1);
  const double t0 = now_s();
  auto submit_next = [&](int client) -> bool {
    if (submitted >= total) return true;
    ReqTiming* t = &tim[size_t(submitted)];
    t->submit = now_s();
    auto id = eng.submit(make(t));
    if (!id) {
      fail(id.error().message);
      return false;
    }
    active[size_t(client)] = submitted++;
    return true;
  };
  for (int c = 0; c < conc; ++c)
    if (!submit_next(c)) return 1;
  while (finished < total) {
    auto st = eng.step();
    if (!st) return fail(st.error().message);
    for (int c = 0; c < conc; ++c) {
      const int a = active[size_t(c)];
      if (a >= 0 && tim[size_t(a)].done) {
        ++finished;
        active[size_t(c)] = -1;
        if (!submit_next(c)) return 1;
      }
    }
  }
  const double wall = now_s() - t0;
  const EngineStats s1 = eng.stats();
  std::vector<double> ttft, tpot;
  int64_t gen = 0, failed = 0;
  for (auto& t : tim) {
    gen += t.tokens;
    failed += t.failed;
    ttft.push_back((t.first - t.submit) * 1e3);
    if (t.tokens > 1) tpot.push_back((t.last - t.first) * 1e3 / double(t.tokens - 1));
  }
  nlohmann::json j;
  j["weights"] = wspec;
  j["kv_dtype"] = dtype;
  j["kv_scale"] = dtype == "bf16" ? "none" : o.kv_scale;
  j["concurrency"] = conc;
  j["integrity"] = integrity;
  j["requests"] = total;
  j["failed"] = failed;
  j["prompt_tokens"] = o.prompt_tokens;
  j["gen_tokens"] = o.gen_tokens;
  j["wall_s"] = wall;
  j["output_tok_s"] = double(gen) / wall;
  j["total_tok_s"] = double(gen + int64_t(total) * o.prompt_tokens) / wall;
  j["ttft_ms_p50"] = percentile(ttft, 0.5);
  j["ttft_ms_p95"] = percentile(ttft, 0.95);
  j["tpot_ms_p50"] = percentile(tpot, 0.5);
  j["tpot_ms_p95"] = percentile(tpot, 0.95);
  j["preemptions"] = s1.preemptions - s0.preemptions;
  j["peak_pages"] = s1.kv_pages_peak;
  j["kv_pages"] = s1.kv_pages_total;
  j["kv_capacity_tokens"] = eng.capacity().tokens;
  j["kv_bytes_per_token"] = eng.capacity().bytes_per_token;
  j["integrity_checks"] = s1.integrity_checks - s0.integrity_checks;
  j["verify_s"] = s1.verify_seconds - s0.verify_seconds;
  j["tp"] = o.tp;
  j["ep"] = o.ep;
  const double fwd = s1.forward_seconds - s0.forward_seconds;
  j["comm_share"] = fwd > 0 ? (s1.comm_seconds - s0.comm_seconds) / fwd : 0.0;
  std::fprintf(stderr,
               "%-9s %-9s conc %3d integrity %-3s: %8.1f out tok/s | TTFT p50 %8.1f p95 %8.1f ms | TPOT "
               "p50 %7.2f p95 "
               "%7.2f ms | preempt %lld | peak pages %lld/%lld\n",
               wspec.c_str(), dtype.c_str(), conc, integrity ? "on" : "off", double(gen) / wall,
               percentile(ttft, 0.5), percentile(ttft, 0.95), percentile(tpot, 0.5),
               percentile(tpot, 0.95), (long long)(s1.preemptions - s0.preemptions),
               (long long)s1.kv_pages_peak, (long long)s1.kv_pages_total);
  out.push_back(j);
  return 0;
}

int run_batch_bench(const BenchOpts& o) {
  nlohmann::json configs = nlohmann::json::array();
  std::vector<int> concs;
  for (auto& c : split_list(o.concurrency)) {
    try {
      concs.push_back(std::stoi(c));
    } catch (...) {
      return fail("--concurrency: not a number: '" + c + "'");
    }
    if (concs.back() < 1) return fail("--concurrency values must be >= 1");
  }
  std::vector<bool> integ;
  for (auto& s : split_list(o.integrity)) {
    if (s == "on")
      integ.push_back(true);
    else if (s == "off")
      integ.push_back(false);
    else
      return fail("--integrity takes on, off or on,off");
  }
  for (auto& w : split_list(o.weights))
    for (auto& d : split_list(o.kv_dtypes))
      for (int c : concs)
        for (bool in : integ)
          if (int rc = run_batch_config(o, w, d, c, in, configs); rc != 0) return rc;
  nlohmann::json j;
  j["model"] = o.model;
  j["threads"] = num_threads();
  j["isa"] = backend::backend_device("cpu");
  j["device"] = o.device == "cpu" ? backend::backend_device("cpu") : backend::backend_device(o.device);
  j["kv_memory"] = o.kv_memory;
  j["configs"] = configs;
  if (o.json && !configs.empty()) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  static BenchOpts o;
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode throughput");
  cmd->add_option("-m,--model", o.model, "GGUF file or Hugging Face directory (required)");
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "tokens in the prefill batch")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--gen-tokens", o.gen_tokens, "decode steps")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-t,--threads", o.threads, "worker threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--device", o.device, "cpu, or cuda (a CUDA build with a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--reps", o.reps, "repetitions after one warm-up")->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", o.json, "print one JSON object");
  cmd->add_option("--concurrency", o.concurrency,
                  "batch mode through the engine: clients in a closed loop, e.g. 1,8,32,64");
  cmd->add_option("--batched", o.batched,
                  "llama-batched-bench's measure: this many sequences prefilled, then decoded "
                  "together, e.g. 1,8,32,64 (reports decode_tok_s, its S_TG)");
  cmd->add_option("--weights", o.weights,
                  "weight precisions to compare: native, bf16, fp8, int4, or P/D (prefill P, "
                  "decode D), comma-separated, e.g. bf16,fp8,int4,fp8/int4");
  cmd->add_option("--int4-group", o.int4_group,
                  "group size when int4 weights are quantized at load from a BF16/GGUF checkpoint")
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_flag("--int4-lm-head", o.int4_lm_head,
                "quantizing at load: the output projection too");
  cmd->add_option("--kv-dtype", o.kv_dtypes, "batch and batched modes: KV dtypes, e.g. bf16,fp8_e4m3");
  cmd->add_option("--kv-scale", o.kv_scale, "batch mode: FP8 scales, dynamic or static");
  cmd->add_option("--kv-memory", o.kv_memory, "batch mode: KV budget, e.g. 64MiB");
  cmd->add_option("--integrity", o.integrity, "batch mode: on, off or on,off");
  cmd->add_option("--requests-per-client", o.requests_per_client,
                  "batch mode: requests each client sends")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-step-tokens", o.max_step_tokens, "batch and batched modes: tokens per step")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--tp", o.tp, "tensor-parallel ranks (under mpirun -np N)")->check(CLI::Range(1, 1024));
  cmd->add_option("--ep", o.ep, "expert-parallel ranks (under mpirun -np N)")->check(CLI::Range(1, 1024));
  cmd->add_flag("--comm-split", o.comm_split,
                "under mpirun: a timed barrier before each collective splits the communication "
                "share into waiting for the last rank and the transfer (slows each step)");
  cmd->add_option("--dist-timeout", o.dist_timeout, "seconds a collective waits for a peer rank")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--page-tokens", o.page_tokens, "batch and batched modes: tokens per KV page")
      ->check(CLI::Range(1, 4096));
  register_bench_serve(*cmd);
  cmd->callback([cmd] {
    if (cmd->got_subcommand("serve")) return;  // `kvant bench serve` ran on its own
    if (o.model.empty()) {
      std::fprintf(stderr, "kvant bench: -m/--model is required (or use `kvant bench serve`)\n");
      set_exit_code(2);
      return;
    }
    set_exit_code(run_bench(o));
  });
}

}  // namespace kvant::cli
