// `kvant eval`: accuracy of a model as kvant runs it (weights, KV dtype and
// scales from the engine flags), on the vendored data sets (data/eval):
//   arc_challenge  log-likelihood of each choice: acc and length-normalized acc_norm
//   mmlu           5-shot, the likelihood of " A".." D" after "Answer:"
//   gsm8k          8-shot chain of thought, greedy, exact match on the final number
//   wikitext       WikiText-2 perplexity over windows (--window, --stride, --score);
//                  --kl-save FILE also saves the reference's top-K log-probabilities
//   kl             KL divergence against such a baseline (--kl-baseline FILE)
// In-process (-m MODEL) or against a server (--url): generation through
// /v1/completions, log-likelihoods from its prompt log-probabilities (echo).
// Results: JSON (--out) with per-item values, a Markdown table (--md and
// stdout); an interrupted run resumes from <out>.partial.jsonl.
// `kvant eval compare A.json B.json`: the differences and their intervals.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/http_client.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "engine/logprobs.h"
#include "eval/data.h"
#include "eval/report.h"
#include "eval/scorer.h"
#include "eval/stats.h"
#include "eval/tasks.h"
#include "model/model.h"

namespace kvant::cli {
namespace {

using nlohmann::json;
using namespace kvant::eval;
using Clock = std::chrono::steady_clock;

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

struct Opts {
  EngineFlags ef;
  std::string tasks = "arc_challenge,mmlu,gsm8k,wikitext";
  std::string url, api_key, served_model;
  std::string data;
  std::string out, md, label;
  std::string limit = "0";  // "N" or "task=N,task=N"
  uint64_t seed = 1234;
  int concurrency = 8;
  bool no_resume = false;
  int arc_shots = 25, mmlu_shots = 5, gsm8k_shots = 8;
  int max_gen = 256;
  int window = 512, stride = 256, score = 0;
  std::string kl_save, kl_baseline;
  int kl_top_k = 64;
  int chunk = 128;
  int max_len = 4096;
  std::string dump_requests;
  bool quiet = false;
};

struct CompareOpts {
  std::string a, b, json_out;
};

// ---- progress -------------------------------------------------------------

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = long(s + 0.5);
  char b[32];
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%ld:%02ld", t / 60, t % 60);
  return b;
}

class Progress {
 public:
  Progress(std::string name, size_t total, size_t resumed, bool quiet)
      : name_(std::move(name)), total_(total), done_(resumed), resumed_(resumed), quiet_(quiet) {
    draw(true);
  }
  void tick(size_t n = 1) {
    done_ += n;
    draw(done_ == total_);
  }
  ~Progress() {
    if (!quiet_) std::fprintf(stderr, "\n");
  }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  void draw(bool force) {
    if (quiet_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double el = elapsed();
    const size_t fresh = done_ - resumed_;
    const double eta = fresh > 0 ? el / double(fresh) * double(total_ - done_) : NAN;
    const int width = 24;
    const int fill = total_ ? int(double(width) * double(done_) / double(total_)) : width;
    std::string bar(size_t(fill), '#');
    bar += std::string(size_t(width - fill), '.');
    std::fprintf(stderr, "\r%-14s [%s] %zu/%zu %5.1f%%  %s elapsed  ETA %s   ", name_.c_str(),
                 bar.c_str(), done_, total_, total_ ? 100.0 * double(done_) / double(total_) : 100.0,
                 hms(el).c_str(), hms(eta).c_str());
    std::fflush(stderr);
  }
  std::string name_;
  size_t total_, done_, resumed_;
  bool quiet_;
  Clock::time_point t0_ = Clock::now(), last_{};
};

using Target = HttpTarget;

// ---- the run --------------------------------------------------------------

struct Ctx {
  Ctx(const Opts& opts, DataDir d) : o(opts), data(std::move(d)) {}
  const Opts& o;
  DataDir data;
  ResumeLog* log = nullptr;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<LoglikScorer> scorer;
  std::unique_ptr<Engine> engine;
  Target target;
  std::string served_model;
  std::ofstream dump;
};

json metric(const Estimate& e, const std::string& unit, const std::string& item_key) {
  json m = estimate_json(e);
  if (!unit.empty()) m["unit"] = unit;
  if (!item_key.empty()) m["item_key"] = item_key;
  return m;
}

// ---- scoring over a server ------------------------------------------------
// Log-likelihoods come from /v1/completions with echo, max_tokens 0 and
// logprobs (the legacy API's way of scoring a prompt), the prompt sent as
// token ids that /tokenize made, so the tokens are exactly the in-process
// run's. Two extensions keep it exact and cheap: return_tokens_as_token_ids
// (vLLM's; ids instead of text, which can collide) and prompt_logprobs_from
// (kvant's; a server without it returns every position, which works too).

// Runs fn(0..n-1) on `threads` threads; the first error wins.
Result<void> parallel_for(size_t n, int threads, const std::function<Result<void>(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  Result<void> err;
  std::atomic<bool> failed{false};
  std::vector<std::thread> th;
  for (int w = 0; w < std::max(1, std::min<int>(threads, int(std::max<size_t>(n, 1)))); ++w)
    th.emplace_back([&] {
      for (size_t k; !failed && (k = next.fetch_add(1)) < n;) {
        auto r = fn(k);
        if (!r) {
          std::lock_guard<std::mutex> lk(mu);
          if (err.ok()) err = r;
          failed = true;
        }
      }
    });
  for (auto& t : th) t.join();
  return err;
}

Result<std::vector<int32_t>> server_tokenize(const Ctx& c, const std::string& text,
                                             bool add_special) {
  json body = {{"model", c.served_model},
               {"prompt", text},
               {"add_special_tokens", add_special},
               {"parse_special", false}};
  auto r = http_json(c.target, c.o.api_key, "/tokenize", &body);
  if (!r)
    return make_error(r.error().message +
                      " (scoring over --url needs the server's /tokenize, which kvant serve and "
                      "vLLM have)");
  try {
    return r->at("tokens").get<std::vector<int32_t>>();
  } catch (const std::exception& e) {
    return make_error(std::string("server: /tokenize gave no token list: ") + e.what());
  }
}

Result<int32_t> token_id_of(const std::string& s) {
  constexpr std::string_view kPre = "token_id:";
  if (s.rfind(kPre, 0) != 0)
    return make_error("server: expected tokens as \"token_id:N\" (return_tokens_as_token_ids), got '" +
                      s + "'");
  try {
    return int32_t(std::stol(s.substr(kPre.size())));
  } catch (...) {
    return make_error("server: bad token '" + s + "'");
  }
}

// One scored prompt position: the log-probability of the prompt's token
// there and the server's top alternatives (most likely first).
struct ServerPosition {
  double logprob = 0;
  std::vector<TokenLogprob> top;
};

// The positions [from, ids.size()) of the prompt `ids`.
Result<std::vector<ServerPosition>> server_prompt_logprobs(const Ctx& c,
                                                           const std::vector<int32_t>& ids,
                                                           int64_t from, int top_n) {
  json body = {{"model", c.served_model}, {"prompt", ids},
               {"max_tokens", 0},         {"echo", true},
               {"logprobs", top_n},       {"temperature", 0},
               {"prompt_logprobs_from", from}, {"return_tokens_as_token_ids", true}};
  auto r = http_json(c.target, c.o.api_key, "/v1/completions", &body);
  if (!r) {
    std::string m = r.error().message;
    if (top_n > kMaxTopLogprobs && m.find("logprobs") != std::string::npos)
      m += " (start kvant serve with --max-logprobs " + std::to_string(top_n) + ")";
    return make_error(m);
  }
  std::vector<ServerPosition> out;
  try {
    const json& lp = r->at("choices").at(0).at("logprobs");
    const json& toks = lp.at("tokens");
    const json& lps = lp.at("token_logprobs");
    const json& tops = lp.at("top_logprobs");
    if (toks.size() < ids.size() || lps.size() < ids.size())
      return make_error("server: echo returned " + std::to_string(toks.size()) +
                        " tokens for a prompt of " + std::to_string(ids.size()));
    for (size_t p = size_t(from); p < ids.size(); ++p) {
      auto id = token_id_of(toks[p].get<std::string>());
      if (!id) return id.error();
      if (*id != ids[p])
        return make_error("server: echoed token " + std::to_string(p) + " is " +
                          std::to_string(*id) + ", sent " + std::to_string(ids[p]));
      if (lps[p].is_null())
        return make_error("server: no logprob for prompt position " + std::to_string(p));
      ServerPosition sp;
      sp.logprob = lps[p].get<double>();
      if (p < tops.size() && tops[p].is_object())
        for (auto it = tops[p].begin(); it != tops[p].end(); ++it) {
          auto tid = token_id_of(it.key());
          if (!tid) return tid.error();
          sp.top.push_back({*tid, it.value().get<float>()});
        }
      std::sort(sp.top.begin(), sp.top.end(), [](const TokenLogprob& a, const TokenLogprob& b) {
        return a.logprob != b.logprob ? a.logprob > b.logprob : a.token < b.token;
      });
      out.push_back(std::move(sp));
    }
  } catch (const std::exception& e) {
    return make_error(std::string("server: unexpected completion with echo: ") + e.what());
  }
  return out;
}

// The harness's tokenization (scorer.h), through /tokenize.
Result<TokenizedRequests> server_tokenize_requests(const Ctx& c,
                                                   const std::vector<LoglikRequest>& reqs) {
  TokenizedRequests t;
  auto ctx = server_tokenize(c, reqs[0].context, true);
  if (!ctx) return ctx.error();
  t.ctx = std::move(*ctx);
  for (const auto& rq : reqs) {
    if (rq.context != reqs[0].context) return make_error("eval: choices with different contexts");
    auto whole = server_tokenize(c, rq.context + rq.continuation, true);
    if (!whole) return whole.error();
    std::vector<int32_t> cont;
    if (whole->size() > t.ctx.size()) cont.assign(whole->begin() + long(t.ctx.size()), whole->end());
    t.conts.push_back(std::move(cont));
  }
  return t;
}

// Each continuation's log-likelihood after the context, one request each.
Result<std::vector<ChoiceScore>> server_score(const Ctx& c, const TokenizedRequests& t) {
  std::vector<ChoiceScore> out;
  for (const auto& cont : t.conts) {
    if (cont.empty() || t.ctx.empty()) return make_error("eval: empty context or continuation");
    std::vector<int32_t> ids = t.ctx;
    ids.insert(ids.end(), cont.begin(), cont.end());
    auto pos = server_prompt_logprobs(c, ids, int64_t(t.ctx.size()), 1);
    if (!pos) return pos.error();
    ChoiceScore s;
    s.greedy = true;
    for (size_t k = 0; k < pos->size(); ++k) {
      s.logprob += (*pos)[k].logprob;
      s.greedy = s.greedy && !(*pos)[k].top.empty() && (*pos)[k].top[0].token == cont[k];
    }
    s.tokens = int64_t(cont.size());
    out.push_back(s);
  }
  return out;
}

Result<void> ensure_local_model(Ctx& c) {
  if (c.model) return {};
  if (c.o.ef.model.empty()) return make_error("eval: -m MODEL or --url URL is required");
  auto eo = engine_options(c.o.ef);
  if (!eo) return eo.error();
  WeightOptions wo;
  auto prec = [](const std::string& s) {
    return s == "bf16"   ? WeightPrecision::kBf16
           : s == "int4" ? WeightPrecision::kInt4
                         : WeightPrecision::kNative;
  };
  wo.prefill = prec(eo->prefill_weights);
  wo.decode = prec(eo->decode_weights);
  wo.int4_group = eo->int4_group;
  wo.int4_lm_head = eo->int4_lm_head;
  auto m = Model::load(eo->model_path, wo);
  if (!m) return m.error();
  c.model = std::move(*m);
  const ModelConfig& mc = c.model->config();
  SeqKvOptions kv;
  if (eo->kv_dtype != KvDType::kBf16) {
    kv.elem = eo->kv_dtype == KvDType::kFp8E4m3 ? KvDType::kFp8E4m3
                                                : KvDType::kFp8E5m2;
    if (eo->kv_scale_mode == KvScaleMode::kDynamic) {
      kv.dynamic_scales = true;
    } else {
      const std::string path = eo->kv_scales_path.empty() ? default_kv_scales_path(eo->model_path)
                                                          : eo->kv_scales_path;
      auto s = load_kv_scales(path);
      if (!s) return s.error();
      if (s->layers != mc.layers || s->kv_heads != mc.kv_heads)
        return make_error("eval: " + path + " does not match the model's layers x KV heads");
      const float mf = kv_dtype_max_finite(eo->kv_dtype);
      for (size_t i = 0; i < s->k_amax.size(); ++i) {
        kv.static_k.push_back(s->k_amax[i] > 0 ? s->k_amax[i] / mf : 1.f);
        kv.static_v.push_back(s->v_amax[i] > 0 ? s->v_amax[i] / mf : 1.f);
      }
    }
  }
  const int64_t cap = std::min<int64_t>(c.o.max_len, mc.max_positions);
  c.scorer = std::make_unique<LoglikScorer>(*c.model, kv, cap, c.o.chunk);
  return {};
}

Result<void> ensure_tokenizer(Ctx& c) {
  if (c.tok) return {};
  auto t = load_tokenizer_for(c.o.ef.model, nullptr);
  if (!t) return t.error();
  c.tok = std::move(*t);
  return {};
}

// --limit: "N" for every task, or "task=N,..." (tasks not named: all items).
Result<size_t> limit_for(const std::string& spec, const std::string& task) {
  try {
    if (spec.find('=') == std::string::npos) return size_t(std::stoul(spec));
    std::stringstream ss(spec);
    for (std::string kv; std::getline(ss, kv, ',');) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) return make_error("eval: --limit " + spec + ": expected task=N");
      if (kv.substr(0, eq) == task) return size_t(std::stoul(kv.substr(eq + 1)));
    }
    return size_t(0);
  } catch (...) {
    return make_error("eval: --limit " + spec + ": expected N or task=N,task=N");
  }
}

// Multiple choice: ARC-Challenge and MMLU. One item's record from its choices' scores.
json mc_record(const std::string& task, const McItem& it, const std::vector<ChoiceScore>& sc) {
  std::vector<double> ll, lln;
  json greedy = json::array();
  for (size_t j = 0; j < sc.size(); ++j) {
    ll.push_back(sc[j].logprob);
    lln.push_back(sc[j].logprob / double(std::max<int64_t>(1, utf8_length(it.choices[j]))));
    greedy.push_back(sc[j].greedy);
  }
  const size_t pred = argmax(ll), pred_n = argmax(lln);
  return {{"task", task},
          {"id", it.id},
          {"gold", it.answer},
          {"pred", pred},
          {"pred_norm", pred_n},
          {"acc", pred == size_t(it.answer) ? 1.0 : 0.0},
          {"acc_norm", pred_n == size_t(it.answer) ? 1.0 : 0.0},
          {"ll", ll},
          {"greedy", greedy}};
}

Result<json> run_mc(Ctx& c, const std::string& task) {
  const Opts& o = c.o;
  const bool remote = !o.url.empty();
  if (!remote) {
    KV_TRY(ensure_local_model(c));
    KV_TRY(ensure_tokenizer(c));
  }
  std::vector<McItem> items;
  std::map<std::string, std::string> prefix_of;  // per subject (MMLU) or "" (ARC)
  int shots = 0;
  if (task == "arc_challenge") {
    auto test = load_arc(c.data, "test");
    if (!test) return test.error();
    items = std::move(*test);
    shots = o.arc_shots;
    std::vector<McItem> sh;
    if (shots > 0) {
      auto train = load_arc(c.data, "train");
      if (!train) return train.error();
      for (size_t i : seeded_choice(train->size(), size_t(shots), o.seed)) sh.push_back((*train)[i]);
    }
    prefix_of[""] = arc_fewshot_prefix(sh);
  } else {
    auto test = load_mmlu(c.data, "test");
    if (!test) return test.error();
    items = std::move(*test);
    shots = o.mmlu_shots;
    auto dev = load_mmlu(c.data, "dev");
    if (!dev) return dev.error();
    std::map<std::string, std::vector<McItem>> dev_by;
    for (auto& d : *dev) dev_by[d.subject].push_back(d);
    for (auto& [subj, v] : dev_by) {
      if (int(v.size()) > shots) v.resize(size_t(shots));
      prefix_of[subj] = mmlu_prefix(subj, v);
    }
  }
  std::vector<std::string> ids, strata;
  for (const auto& it : items) ids.push_back(it.id), strata.push_back(it.stratum);
  auto lim = limit_for(o.limit, task);
  if (!lim) return lim.error();
  const Subset sub = stratified_subset(task, ids, strata, *lim, o.seed);
  size_t resumed = 0;
  for (size_t i : sub.indices) resumed += c.log->find(task, items[i].id) != nullptr;
  Progress prog(task, sub.indices.size(), resumed, o.quiet);
  if (remote) {
    // Through the server: --concurrency items at once, a request per choice.
    std::vector<size_t> todo;
    for (size_t i : sub.indices)
      if (!c.log->find(task, items[i].id)) todo.push_back(i);
    std::mutex mu;
    KV_TRY(parallel_for(todo.size(), o.concurrency, [&](size_t k) -> Result<void> {
      const McItem& it = items[todo[k]];
      const std::string& prefix = task == "arc_challenge" ? prefix_of.at("") : prefix_of.at(it.subject);
      const auto reqs = task == "arc_challenge" ? arc_requests(prefix, it) : mmlu_requests(prefix, it);
      auto t = server_tokenize_requests(c, reqs);
      if (!t) return make_error(task + " " + it.id + ": " + t.error().message);
      auto sc = server_score(c, *t);
      if (!sc) return make_error(task + " " + it.id + ": " + sc.error().message);
      std::lock_guard<std::mutex> lk(mu);
      KV_TRY(c.log->append(mc_record(task, it, *sc)));
      prog.tick();
      return {};
    }));
  }
  int64_t k_acc = 0, k_norm = 0;
  json item_out = json::array();
  for (size_t i : sub.indices) {
    const McItem& it = items[i];
    const json* done = c.log->find(task, it.id);
    json rec;
    if (!done && remote) return make_error(task + " " + it.id + ": no result from the server");
    if (done) {
      rec = *done;
    } else {
      const std::string& prefix = task == "arc_challenge" ? prefix_of[""] : prefix_of[it.subject];
      const auto reqs = task == "arc_challenge" ? arc_requests(prefix, it) : mmlu_requests(prefix, it);
      const TokenizedRequests t = tokenize_requests(*c.tok, reqs);
      auto sc = c.scorer->score(t.ctx, t.conts);
      if (!sc) return make_error(task + " " + it.id + ": " + sc.error().message);
      rec = mc_record(task, it, *sc);
      const auto& ll = rec["ll"];
      if (c.dump.is_open()) {
        json d = {{"task", task}, {"id", it.id}, {"context", reqs[0].context}, {"ctx_ids", t.ctx}};
        for (size_t j = 0; j < reqs.size(); ++j) {
          d["continuations"].push_back(reqs[j].continuation);
          d["cont_ids"].push_back(t.conts[j]);
        }
        d["ll"] = ll;
        c.dump << d.dump() << "\n";
      }
      KV_TRY(c.log->append(rec));
    }
    k_acc += rec["acc"].get<double>() > 0.5;
    k_norm += rec["acc_norm"].get<double>() > 0.5;
    rec.erase("task");
    item_out.push_back(rec);
    if (!done) prog.tick();
  }
  const int64_t n = int64_t(sub.indices.size());
  json r;
  r["subset"] = sub.name;
  r["shots"] = shots;
  r["seconds"] = prog.elapsed();
  r["metrics"]["acc"] = metric(proportion(k_acc, n), "%", "acc");
  r["metrics"]["acc_norm"] = metric(proportion(k_norm, n), "%", "acc_norm");
  if (task == "mmlu") r["metrics"].erase("acc_norm");  // one-token choices: the same as acc
  r["items"] = item_out;
  if (remote) r["server"] = {{"method", "prompt log-probabilities (echo, max_tokens 0)"}};
  return r;
}

// GSM8K: generation through the engine, or the server.
Result<json> run_gsm8k(Ctx& c) {
  const Opts& o = c.o;
  auto test = load_gsm8k_test(c.data);
  if (!test) return test.error();
  auto ex = load_gsm8k_exemplars(c.data);
  if (!ex) return ex.error();
  if (int(ex->size()) > o.gsm8k_shots) ex->resize(size_t(std::max(0, o.gsm8k_shots)));
  std::vector<std::string> ids, strata;
  for (const auto& it : *test) ids.push_back(it.id), strata.push_back(it.stratum);
  auto lim = limit_for(o.limit, "gsm8k");
  if (!lim) return lim.error();
  const Subset sub = stratified_subset("gsm8k", ids, strata, *lim, o.seed);
  std::vector<size_t> todo;
  for (size_t i : sub.indices)
    if (!c.log->find("gsm8k", (*test)[i].id)) todo.push_back(i);
  Progress prog("gsm8k", sub.indices.size(), sub.indices.size() - todo.size(), o.quiet);
  std::mutex mu;
  Result<void> err;
  auto finish = [&](size_t i, const std::string& gen, int64_t tokens) -> Result<void> {
    const GsmItem& it = (*test)[i];
    const std::string s = gsm8k_extract_strict(gen), f = gsm8k_extract_flexible(gen);
    const std::string tgt = gsm8k_normalize(it.target);
    json rec = {{"task", "gsm8k"},
                {"id", it.id},
                {"target", tgt},
                {"strict", gsm8k_normalize(s)},
                {"flexible", gsm8k_normalize(f)},
                {"em_strict", !s.empty() && gsm8k_normalize(s) == tgt ? 1.0 : 0.0},
                {"em_flex", !f.empty() && gsm8k_normalize(f) == tgt ? 1.0 : 0.0},
                {"gen_tokens", tokens},
                {"gen", gen}};
    KV_TRY(c.log->append(rec));
    prog.tick();
    return {};
  };
  if (!o.url.empty()) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> th;
    for (int w = 0; w < std::max(1, o.concurrency); ++w)
      th.emplace_back([&] {
        for (size_t k; (k = next.fetch_add(1)) < todo.size();) {
          {
            std::lock_guard<std::mutex> lk(mu);
            if (!err.ok()) return;
          }
          const size_t i = todo[k];
          json body = {{"model", c.served_model},
                       {"prompt", gsm8k_prompt(*ex, (*test)[i].question)},
                       {"max_tokens", o.max_gen},
                       {"temperature", 0},
                       {"stop", gsm8k_stop()}};
          auto r = http_json(c.target, o.api_key, "/v1/completions", &body);
          std::lock_guard<std::mutex> lk(mu);
          if (!r) {
            err = r.error();
            return;
          }
          std::string text;
          int64_t toks = 0;
          try {
            text = r->at("choices").at(0).at("text").get<std::string>();
            toks = r->value("usage", json::object()).value("completion_tokens", int64_t(0));
          } catch (const std::exception& e) {
            err = make_error(std::string("server: unexpected completion: ") + e.what());
            return;
          }
          if (auto f = finish(i, text, toks); !f) err = f;
        }
      });
    for (auto& t : th) t.join();
    KV_TRY(err);
  } else {
    if (!c.engine) {
      auto eo = engine_options(o.ef);
      if (!eo) return eo.error();
      if (eo->kv_memory_bytes == 0) eo->kv_memory_bytes = int64_t(512) << 20;
      eo->max_running = std::max<int64_t>(eo->max_running, o.concurrency);
      auto e = Engine::create(*eo);
      if (!e) return e.error();
      c.engine = std::move(*e);
    }
    Engine& E = *c.engine;
    struct Live {
      size_t item;
      std::string text;
      int64_t tokens = 0;
      bool done = false;
      std::string error;
    };
    std::vector<std::unique_ptr<Live>> live;
    size_t next = 0;
    while (next < todo.size() || !live.empty()) {
      while (next < todo.size() && int(live.size()) < std::max(1, o.concurrency)) {
        auto L = std::make_unique<Live>();
        L->item = todo[next++];
        Request rq;
        rq.prompt = E.tokenizer().encode(gsm8k_prompt(*ex, (*test)[L->item].question), true, false);
        rq.stop.stop = gsm8k_stop();
        rq.stop.max_tokens = o.max_gen;
        Live* lp = L.get();
        rq.on_event = [lp](const RequestEvent& ev) {
          lp->text.append(ev.text);
          lp->tokens = ev.completion_tokens;
          if (ev.finish != FinishReason::None) {
            lp->done = true;
            if (ev.finish == FinishReason::Error) lp->error = std::string(ev.error);
          }
        };
        auto id = E.submit(std::move(rq));
        if (!id) return make_error("gsm8k " + (*test)[L->item].id + ": " + id.error().message);
        live.push_back(std::move(L));
      }
      auto s = E.step();
      if (!s) return s.error();
      for (size_t k = 0; k < live.size();) {
        if (!live[k]->done) {
          ++k;
          continue;
        }
        if (!live[k]->error.empty())
          return make_error("gsm8k " + (*test)[live[k]->item].id + ": " + live[k]->error);
        KV_TRY(finish(live[k]->item, live[k]->text, live[k]->tokens));
        live.erase(live.begin() + long(k));
      }
    }
  }
  int64_t ks = 0, kf = 0;
  json items = json::array();
  for (size_t i : sub.indices) {
    json rec = *c.log->find("gsm8k", (*test)[i].id);
    ks += rec["em_strict"].get<double>() > 0.5;
    kf += rec["em_flex"].get<double>() > 0.5;
    rec.erase("task");
    items.push_back(rec);
  }
  const int64_t n = int64_t(sub.indices.size());
  json r;
  r["subset"] = sub.name;
  r["shots"] = ex->size();
  r["seconds"] = prog.elapsed();
  r["metrics"]["exact_match_strict"] = metric(proportion(ks, n), "%", "em_strict");
  r["metrics"]["exact_match_flexible"] = metric(proportion(kf, n), "%", "em_flex");
  r["items"] = items;
  return r;
}

// ---- perplexity and KL ----------------------------------------------------

// Baseline file: "KVKL1\n", one JSON header line, then per window a fixed-size
// record: int64 start; W int32 tokens; per scored position: float logprob of
// the actual next token, K int32 ids, K float log-probabilities (most likely first).
struct KlHeader {
  json j;
  int64_t window = 0, score = 0, k = 0, windows = 0;
  size_t header_bytes = 0;
  size_t record_bytes() const {
    return 8 + size_t(window) * 4 + size_t(score) * (4 + size_t(k) * 8);
  }
};

Result<KlHeader> read_kl_header(std::ifstream& f, const std::string& path) {
  KlHeader h;
  std::string magic, line;
  if (!std::getline(f, magic) || magic != "KVKL1" || !std::getline(f, line))
    return make_error("eval: " + path + " is not a kvant KL baseline");
  try {
    h.j = json::parse(line);
    h.window = h.j.at("window");
    h.score = h.j.at("score");
    h.k = h.j.at("top_k");
  } catch (const std::exception& e) {
    return make_error("eval: " + path + ": bad header: " + e.what());
  }
  h.header_bytes = magic.size() + line.size() + 2;
  f.seekg(0, std::ios::end);
  const size_t size = size_t(f.tellg());
  h.windows = int64_t((size - h.header_bytes) / h.record_bytes());
  return h;
}

struct WindowPlan {
  std::vector<int32_t> toks;  // the whole text
  std::vector<int64_t> starts;
  int64_t W = 0, S = 0, score = 0;
  int32_t bos = -1;
};

Result<WindowPlan> plan_windows(Ctx& c, int64_t W, int64_t S, int64_t score, size_t limit) {
  auto text = load_wikitext2_test(c.data);
  if (!text) return text.error();
  WindowPlan p;
  if (!c.o.url.empty()) {
    auto t = server_tokenize(c, *text, false);
    if (!t) return t.error();
    p.toks = std::move(*t);
    auto b = server_tokenize(c, "", true);  // [BOS] for a model that adds it
    if (!b) return b.error();
    p.bos = b->empty() ? -1 : (*b)[0];
  } else {
    KV_TRY(ensure_tokenizer(c));
    p.toks = c.tok->encode(*text, false, false);
    p.bos = c.tok->adds_bos() ? c.tok->bos_id() : -1;
  }
  p.W = W;
  p.S = S;
  p.score = score;
  if (int64_t(p.toks.size()) < W) return make_error("eval: WikiText-2 is shorter than one window");
  const size_t n = size_t((int64_t(p.toks.size()) - W) / S + 1);
  for (size_t i : spread_subset(n, limit)) p.starts.push_back(int64_t(i) * S);
  return p;
}

std::vector<int32_t> window_tokens(const WindowPlan& p, int64_t start) {
  std::vector<int32_t> w(p.toks.begin() + start, p.toks.begin() + start + p.W);
  if (p.bos >= 0) w[0] = p.bos;  // as llama-perplexity: BOS first for models that add it
  return w;
}

// Windows through the server, --concurrency at once: the scored positions
// [W - score, W) of each, with `top_n` alternatives.
class WindowFetcher {
 public:
  WindowFetcher(const Ctx& c, int64_t from, int top_n) : c_(c), from_(from), top_n_(top_n) {}
  // Window w's positions; fetches w and the next ones (window_of(k) gives their tokens).
  Result<std::vector<ServerPosition>> get(size_t w, size_t n,
                                          const std::function<std::vector<int32_t>(size_t)>& window_of) {
    if (!have_.count(w)) {
      have_.clear();
      const size_t m = std::min(n - w, size_t(std::max(1, c_.o.concurrency)));
      std::vector<std::vector<ServerPosition>> got(m);
      std::vector<std::vector<int32_t>> wins;
      for (size_t k = 0; k < m; ++k) wins.push_back(window_of(w + k));
      KV_TRY(parallel_for(m, c_.o.concurrency, [&](size_t k) -> Result<void> {
        auto r = server_prompt_logprobs(c_, wins[k], from_, top_n_);
        if (!r) return r.error();
        got[k] = std::move(*r);
        return {};
      }));
      for (size_t k = 0; k < m; ++k) have_[w + k] = std::move(got[k]);
    }
    return std::move(have_[w]);
  }

 private:
  const Ctx& c_;
  int64_t from_;
  int top_n_;
  std::map<size_t, std::vector<ServerPosition>> have_;
};

Result<json> run_wikitext(Ctx& c) {
  const Opts& o = c.o;
  const bool remote = !o.url.empty();
  if (!remote) KV_TRY(ensure_local_model(c));
  const int64_t W = remote ? o.window : std::min<int64_t>(o.window, c.scorer->capacity());
  const int64_t S = o.stride;
  const int64_t score = o.score > 0 ? o.score : S;
  if (score >= W) return make_error("eval: --score must be below --window");
  auto lim = limit_for(o.limit, "wikitext");
  if (!lim) return lim.error();
  auto plan = plan_windows(c, W, S, score, *lim);
  if (!plan) return plan.error();
  // The server does not say its vocabulary size: -1 in the baseline's header.
  const int64_t V = remote ? -1 : c.model->config().vocab;
  if (remote && !o.kl_save.empty() && o.kl_top_k <= 0)
    return make_error("eval: over --url, --kl-save needs --kl-top-k K > 0 (the server returns the top K)");
  const int64_t K = o.kl_top_k <= 0 ? V : remote ? o.kl_top_k : std::min<int64_t>(o.kl_top_k, V);
  // The baseline written so far is the resume point of the reference run.
  std::ofstream kl_out;
  KlHeader kh;
  size_t kl_have = 0;
  if (!o.kl_save.empty()) {
    json hj = {{"model", remote ? o.url : o.ef.model}, {"window", W},
               {"stride", S},               {"score", score},
               {"top_k", K},                {"vocab", V},
               {"bos", plan->bos},          {"windows", plan->starts.size()},
               {"data", "wikitext-2-raw/wiki.test.raw"},
               {"data_sha256", c.data.sum("wikitext-2-raw/wiki.test.raw")},
               {"reference", {{"prefill_weights", o.ef.prefill_weights},
                              {"decode_weights", o.ef.decode_weights},
                              {"kv_dtype", o.ef.kv_dtype},
                              {"kv_scale", o.ef.kv_scale}}}};
    kh.window = W, kh.score = score, kh.k = K;
    bool fresh = true;
    if (!o.no_resume && std::filesystem::exists(o.kl_save)) {
      std::ifstream f(o.kl_save, std::ios::binary);
      auto h = read_kl_header(f, o.kl_save);
      if (h && h->j == hj) {
        kl_have = size_t(h->windows);
        kh.header_bytes = h->header_bytes;
        fresh = false;
      }
    }
    if (fresh) {
      std::ofstream f(o.kl_save, std::ios::binary | std::ios::trunc);
      f << "KVKL1\n" << hj.dump() << "\n";
      if (!f) return make_error("eval: cannot write " + o.kl_save);
      kh.header_bytes = 7 + hj.dump().size();
    }
  }
  size_t resumed = 0;
  for (size_t w = 0; w < plan->starts.size(); ++w) {
    const bool in_log = c.log->find("wikitext", "w" + std::to_string(plan->starts[w]));
    if (in_log && (o.kl_save.empty() || w < kl_have)) ++resumed;
    else break;
  }
  if (!o.kl_save.empty()) {
    // Keep exactly the windows both files hold; the rest is recomputed.
    std::filesystem::resize_file(o.kl_save, kh.header_bytes + resumed * kh.record_bytes());
    kl_out.open(o.kl_save, std::ios::binary | std::ios::app);
  }
  Progress prog("wikitext", plan->starts.size(), resumed, o.quiet);
  std::vector<double> lp;
  std::vector<int32_t> order;
  std::vector<char> rec_buf;
  json items = json::array();
  std::vector<double> nll_w, tok_w;
  WindowFetcher fetch(c, W - score, o.kl_save.empty() ? 0 : int(K));
  auto window_of = [&](size_t k) { return window_tokens(*plan, plan->starts[k]); };
  for (size_t w = 0; w < plan->starts.size(); ++w) {
    const int64_t start = plan->starts[w];
    const std::string id = "w" + std::to_string(start);
    json rec;
    if (w < resumed) {
      rec = *c.log->find("wikitext", id);
    } else {
      const auto toks = window_tokens(*plan, start);
      double nll = 0;
      rec_buf.clear();
      auto put = [&](const void* p, size_t n) {
        rec_buf.insert(rec_buf.end(), (const char*)p, (const char*)p + n);
      };
      put(&start, 8);
      put(toks.data(), toks.size() * 4);
      Result<void> r;
      if (remote) {
        auto pos = fetch.get(w, plan->starts.size(), window_of);
        if (!pos) return pos.error();
        for (const ServerPosition& sp : *pos) {
          nll -= sp.logprob;
          if (o.kl_save.empty()) continue;
          if (int64_t(sp.top.size()) < K)
            return make_error("eval: the server returned " + std::to_string(sp.top.size()) +
                              " alternatives, not " + std::to_string(K));
          const float lnext = float(sp.logprob);
          put(&lnext, 4);
          for (int64_t i = 0; i < K; ++i) put(&sp.top[size_t(i)].token, 4);
          for (int64_t i = 0; i < K; ++i) put(&sp.top[size_t(i)].logprob, 4);
        }
      } else r = c.scorer->window(toks, W - score - 1, [&](int64_t pos, std::span<const float> row) {
        log_softmax(row, lp);
        const float lnext = float(lp[size_t(toks[size_t(pos + 1)])]);
        nll -= lp[size_t(toks[size_t(pos + 1)])];
        if (!o.kl_save.empty()) {
          order.resize(size_t(V));
          for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
          std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
            return lp[size_t(a)] != lp[size_t(b)] ? lp[size_t(a)] > lp[size_t(b)] : a < b;
          });
          put(&lnext, 4);
          put(order.data(), size_t(K) * 4);
          for (int64_t i = 0; i < K; ++i) {
            const float v = float(lp[size_t(order[size_t(i)])]);
            put(&v, 4);
          }
        }
      });
      if (!r) return r.error();
      if (!o.kl_save.empty()) {
        kl_out.write(rec_buf.data(), std::streamsize(rec_buf.size()));
        kl_out.flush();
        if (!kl_out) return make_error("eval: cannot write " + o.kl_save);
      }
      rec = {{"task", "wikitext"},
             {"id", id},
             {"nll", nll},
             {"tokens", score},
             {"nll_per_token", nll / double(score)}};
      KV_TRY(c.log->append(rec));
      prog.tick();
    }
    nll_w.push_back(rec["nll"].get<double>());
    tok_w.push_back(rec["tokens"].get<double>());
    rec.erase("task");
    items.push_back(rec);
  }
  json r;
  char desc[160];
  std::snprintf(desc, sizeof desc, "%zu windows of %lld tokens, stride %lld, last %lld scored%s",
                plan->starts.size(), (long long)W, (long long)S, (long long)score,
                plan->bos >= 0 ? ", BOS first" : "");
  r["subset"] = std::string(desc);
  r["window"] = W;
  r["stride"] = S;
  r["score"] = score;
  r["seconds"] = prog.elapsed();
  json m = metric(perplexity(nll_w, tok_w), "", "nll_per_token");
  m["transform"] = "exp";
  r["metrics"]["ppl"] = m;
  r["items"] = items;
  if (!o.kl_save.empty()) r["kl_baseline_written"] = o.kl_save;
  return r;
}

Result<json> run_kl(Ctx& c) {
  const Opts& o = c.o;
  if (o.kl_baseline.empty())
    return make_error("eval: task kl needs --kl-baseline FILE (written by --task wikitext --kl-save)");
  const bool remote = !o.url.empty();
  if (!remote) KV_TRY(ensure_local_model(c));
  std::ifstream f(o.kl_baseline, std::ios::binary);
  if (!f) return make_error("eval: cannot open " + o.kl_baseline);
  auto h = read_kl_header(f, o.kl_baseline);
  if (!h) return h.error();
  if (!remote) {
    const int64_t V = c.model->config().vocab, hv = h->j.value("vocab", int64_t(0));
    if (hv > 0 && hv != V)  // -1: written over a server, which does not say
      return make_error("eval: the baseline's vocabulary differs from the model's");
    if (h->window > c.scorer->capacity())
      return make_error("eval: the baseline's window exceeds --max-len");
  }
  const int64_t W = h->window, score = h->score, K = h->k;
  size_t windows = size_t(h->windows);
  auto lim = limit_for(o.limit, "kl");
  if (!lim) return lim.error();
  if (*lim > 0) windows = std::min(windows, *lim);
  const size_t rb = h->record_bytes();
  size_t resumed = 0;
  std::vector<char> buf(rb);
  std::vector<int64_t> starts(windows);
  for (size_t w = 0; w < windows; ++w) {
    f.seekg(std::streamoff(h->header_bytes + w * rb));
    f.read((char*)&starts[w], 8);
  }
  while (resumed < windows && c.log->find("kl", "w" + std::to_string(starts[resumed]))) ++resumed;
  Progress prog("kl", windows, resumed, o.quiet);
  std::vector<double> kl, dp, same, nll_w, tok_w, lp, cand;
  json items = json::array();
  // Over a server: the candidate's top K at each position. KL is then taken
  // over the tokens in both top-K lists plus one bucket for the rest: a
  // coarser partition than in-process (which sees the candidate's whole
  // distribution), so a slightly lower bound; equal when the lists agree.
  WindowFetcher fetch(c, W - score, int(K));
  auto window_of = [&](size_t k) {
    std::vector<int32_t> t(static_cast<size_t>(W));
    std::ifstream g(o.kl_baseline, std::ios::binary);
    g.seekg(std::streamoff(h->header_bytes + k * rb + 8));
    g.read((char*)t.data(), std::streamsize(W * 4));
    return t;
  };
  std::vector<float> ref_sub;
  for (size_t w = 0; w < windows; ++w) {
    const std::string id = "w" + std::to_string(starts[w]);
    json rec;
    if (w < resumed) {
      rec = *c.log->find("kl", id);
    } else {
      f.seekg(std::streamoff(h->header_bytes + w * rb));
      f.read(buf.data(), std::streamsize(rb));
      if (!f) return make_error("eval: " + o.kl_baseline + " is truncated");
      std::vector<int32_t> toks(static_cast<size_t>(W));
      std::memcpy(toks.data(), buf.data() + 8, size_t(W) * 4);
      const char* pos_base = buf.data() + 8 + size_t(W) * 4;
      std::vector<double> wkl, wdp, wsame;
      double nll = 0;
      std::vector<int32_t> ids(static_cast<size_t>(K));
      std::vector<float> ref(static_cast<size_t>(K));
      Result<void> r;
      if (remote) {
        auto got = fetch.get(w, windows, window_of);
        if (!got) return got.error();
        for (size_t q = 0; q < got->size(); ++q) {
          const ServerPosition& sp = (*got)[q];
          const char* p = pos_base + q * (4 + size_t(K) * 8);
          float lnext;
          std::memcpy(&lnext, p, 4);
          std::memcpy(ids.data(), p + 4, size_t(K) * 4);
          std::memcpy(ref.data(), p + 4 + size_t(K) * 4, size_t(K) * 4);
          ref_sub.clear();
          cand.clear();
          for (int64_t i = 0; i < K; ++i)
            for (const auto& t : sp.top)
              if (t.token == ids[size_t(i)]) {
                ref_sub.push_back(ref[size_t(i)]);
                cand.push_back(t.logprob);
                break;
              }
          wkl.push_back(kl_topk(ref_sub.data(), cand.data(), int64_t(cand.size())));
          wdp.push_back(std::exp(sp.logprob) - std::exp(double(lnext)));
          wsame.push_back(!sp.top.empty() && sp.top[0].token == ids[0] ? 1.0 : 0.0);
          nll -= sp.logprob;
        }
      } else r = c.scorer->window(toks, W - score - 1, [&](int64_t pos, std::span<const float> row) {
        const int64_t q = pos - (W - score - 1);
        const char* p = pos_base + size_t(q) * (4 + size_t(K) * 8);
        float lnext;
        std::memcpy(&lnext, p, 4);
        std::memcpy(ids.data(), p + 4, size_t(K) * 4);
        std::memcpy(ref.data(), p + 4 + size_t(K) * 4, size_t(K) * 4);
        log_softmax(row, lp);
        cand.resize(size_t(K));
        for (int64_t i = 0; i < K; ++i) cand[size_t(i)] = lp[size_t(ids[size_t(i)])];
        wkl.push_back(kl_topk(ref.data(), cand.data(), K));
        const int32_t next = toks[size_t(pos + 1)];
        wdp.push_back(std::exp(lp[size_t(next)]) - std::exp(double(lnext)));
        wsame.push_back(Sampler::argmax(row) == ids[0] ? 1.0 : 0.0);
        nll -= lp[size_t(next)];
      });
      if (!r) return r.error();
      double mk = 0;
      for (double x : wkl) mk += x;
      rec = {{"task", "kl"},    {"id", id},         {"kl", wkl},
             {"dp", wdp},       {"same", wsame},    {"nll", nll},
             {"tokens", score}, {"mean_kl", mk / double(wkl.size())},
             {"nll_per_token", nll / double(score)}};
      KV_TRY(c.log->append(rec));
      prog.tick();
    }
    for (double x : rec["kl"]) kl.push_back(x);
    for (double x : rec["dp"]) dp.push_back(x);
    for (double x : rec["same"]) same.push_back(x);
    nll_w.push_back(rec["nll"].get<double>());
    tok_w.push_back(rec["tokens"].get<double>());
    json slim = {{"id", id},
                 {"mean_kl", rec["mean_kl"]},
                 {"nll", rec["nll"]},
                 {"tokens", rec["tokens"]},
                 {"nll_per_token", rec["nll_per_token"]}};
    items.push_back(slim);
  }
  const KlSummary s = kl_summary(kl, dp, same);
  json r;
  char desc[200];
  std::snprintf(desc, sizeof desc, "%zu windows of %lld tokens, last %lld scored, top-%lld baseline",
                windows, (long long)W, (long long)score, (long long)K);
  r["subset"] = std::string(desc);
  r["baseline"] = o.kl_baseline;
  r["baseline_reference"] = h->j.value("reference", json::object());
  r["seconds"] = prog.elapsed();
  r["metrics"]["mean_kl"] = metric(s.mean_kl, "", "mean_kl");
  auto plain = [&](double v) { return json{{"value", v}, {"n", s.positions}}; };
  r["metrics"]["median_kl"] = plain(s.median_kl);
  r["metrics"]["p99_kl"] = plain(s.p99_kl);
  r["metrics"]["max_kl"] = plain(s.max_kl);
  r["metrics"]["same_top1"] = metric(s.same_top1, "%", "");
  r["metrics"]["rms_dp"] = metric(s.rms_dp, "%", "");
  json m = metric(perplexity(nll_w, tok_w), "", "nll_per_token");
  m["transform"] = "exp";
  r["metrics"]["ppl"] = m;
  r["items"] = items;
  return r;
}

json run_config(const Opts& o) {
  return {{"model", o.url.empty() ? o.ef.model : o.url},
          {"prefill_weights", o.ef.prefill_weights},
          {"decode_weights", o.ef.decode_weights},
          {"int4_group", o.ef.int4_group},
          {"int4_lm_head", o.ef.int4_lm_head},
          {"kv_dtype", o.ef.kv_dtype},
          {"kv_scale", o.ef.kv_dtype == "bf16" ? "" : o.ef.kv_scale},
          {"kv_scales", o.ef.kv_scales_path},
          {"chunk", o.chunk},
          {"seed", o.seed},
          {"limit", o.limit},
          {"shots", {{"arc_challenge", o.arc_shots}, {"mmlu", o.mmlu_shots}, {"gsm8k", o.gsm8k_shots}}},
          {"max_gen_tokens", o.max_gen},
          {"window", o.window},
          {"stride", o.stride},
          {"score", o.score},
          {"kl_baseline", o.kl_baseline},
          {"kl_save", o.kl_save},
          {"kl_top_k", o.kl_top_k}};
}

int run_eval(const Opts& o) {
  if (o.ef.threads > 0) set_num_threads(o.ef.threads);
  if (o.out.empty()) return fail("eval: --out FILE.json is required (the resume file sits beside it)");
  std::vector<std::string> tasks;
  {
    std::stringstream ss(o.tasks);
    for (std::string t; std::getline(ss, t, ',');)
      if (!t.empty()) tasks.push_back(t);
  }
  for (const auto& t : tasks)
    if (t != "arc_challenge" && t != "mmlu" && t != "gsm8k" && t != "wikitext" && t != "kl")
      return fail("eval: unknown task '" + t + "' (arc_challenge, mmlu, gsm8k, wikitext, kl)");
  if (o.url.empty() && o.ef.model.empty()) return fail("eval: give -m MODEL or --url URL");
  auto data = DataDir::open(o.data.empty() ? default_data_dir() : o.data);
  if (!data) return fail(data.error().message);
  Ctx c(o, std::move(*data));
  if (!o.url.empty()) {
    if (!parse_http_url(o.url, c.target)) return fail("eval: cannot parse --url " + o.url);
    c.served_model = o.served_model;
    if (c.served_model.empty()) {
      auto m = first_served_model(c.target, o.api_key);
      if (!m) return fail(m.error().message);
      c.served_model = *m;
    }
  }
  json fp = run_config(o);
  fp["tasks"] = tasks;
  const std::string partial = o.out + ".partial.jsonl";
  auto log = ResumeLog::open(partial, fp, o.no_resume);
  if (!log) return fail(log.error().message);
  if (log->size() > 0)
    std::fprintf(stderr, "kvant: resuming from %s (%zu items done)\n", partial.c_str(), log->size());
  c.log = &*log;
  if (!o.dump_requests.empty()) c.dump.open(o.dump_requests, std::ios::trunc);
  json result;
  result["kvant_eval"] = 1;
  result["label"] = o.label;
  result["config"] = run_config(o);
  if (!o.url.empty()) result["config"]["served_model"] = c.served_model;
  result["threads"] = o.ef.threads;
  const auto t0 = Clock::now();
  for (const auto& t : tasks) {
    Result<json> r = make_error("");
    if (t == "gsm8k") r = run_gsm8k(c);
    else if (t == "wikitext") r = run_wikitext(c);
    else if (t == "kl") r = run_kl(c);
    else r = run_mc(c, t);
    if (!r) return fail(r.error().message + " (finished items are kept in " + partial + ")");
    result["tasks"][t] = *r;
  }
  result["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
  {
    std::ofstream f(o.out);
    f << result.dump(1) << "\n";
    if (!f) return fail("eval: cannot write " + o.out);
  }
  const std::string table = markdown_table(result);
  if (!o.md.empty()) {
    std::ofstream f(o.md);
    f << table;
  }
  std::printf("%s", table.c_str());
  std::filesystem::remove(partial);
  return 0;
}

int run_compare(const CompareOpts& o) {
  json a, b;
  for (auto [path, dst] : {std::pair{&o.a, &a}, std::pair{&o.b, &b}}) {
    std::ifstream f(*path);
    if (!f) return fail("eval compare: cannot open " + *path);
    try {
      *dst = json::parse(f);
      (void)dst->at("tasks");
    } catch (const std::exception& e) {
      return fail("eval compare: " + *path + " is not a kvant eval result: " + e.what());
    }
  }
  const Comparison cmp = compare_results(a, b);
  std::printf("A: %s\nB: %s\n%s", o.a.c_str(), o.b.c_str(), cmp.text.c_str());
  if (!o.json_out.empty()) {
    std::ofstream f(o.json_out);
    f << cmp.json.dump(1) << "\n";
  }
  return 0;
}

}  // namespace

void register_eval(CLI::App& app) {
  static Opts o;
  auto* cmd = app.add_subcommand(
      "eval", "Accuracy: ARC-Challenge, MMLU, GSM8K, WikiText-2 perplexity, KL vs a baseline");
  add_engine_flags(cmd, o.ef, /*with_model=*/false);
  cmd->add_option("-m,--model", o.ef.model, "GGUF file or Hugging Face directory (in-process)");
  cmd->add_option("--tasks,--task", o.tasks,
                  "comma-separated: arc_challenge, mmlu, gsm8k, wikitext, kl");
  cmd->add_option("--url", o.url,
                  "a running server instead of -m (OpenAI completions with echo + logprobs, /tokenize)");
  cmd->add_option("--api-key", o.api_key, "bearer token for --url");
  cmd->add_option("--served-model", o.served_model, "model id for --url (default: the first listed)");
  cmd->add_option("--data", o.data, "evaluation data folder (default: the source tree's data/eval)");
  cmd->add_option("--out", o.out, "result JSON (required; <out>.partial.jsonl holds progress)");
  cmd->add_option("--md", o.md, "also write the Markdown table here");
  cmd->add_option("--label", o.label, "a name for this configuration, kept in the JSON");
  cmd->add_option("--limit", o.limit,
                  "items per task, N or task=N,task=N: a seeded subset stratified by MMLU subject, "
                  "ARC source or GSM8K solution length (wikitext windows: spread evenly; kl: the "
                  "baseline's first N); 0 = all");
  cmd->add_option("--seed", o.seed, "seed of the subset and of ARC's few-shot exemplars");
  cmd->add_option("--concurrency", o.concurrency,
                  "requests in flight: gsm8k (engine or server), every task over --url")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--no-resume", o.no_resume, "discard an earlier run's partial results");
  cmd->add_option("--arc-shots", o.arc_shots, "ARC-Challenge exemplars from its train split")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--mmlu-shots", o.mmlu_shots, "MMLU exemplars (the subject's dev split, in order)")
      ->check(CLI::Range(0, 5));
  cmd->add_option("--gsm8k-shots", o.gsm8k_shots, "GSM8K chain-of-thought exemplars")
      ->check(CLI::Range(0, 8));
  cmd->add_option("--max-gen-tokens", o.max_gen, "gsm8k generation limit")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--window", o.window, "wikitext: tokens per window")->check(CLI::Range(8, 1 << 20));
  cmd->add_option("--stride", o.stride, "wikitext: tokens between window starts")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--score", o.score, "wikitext: tokens scored at each window's end (default: stride)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kl-save", o.kl_save, "wikitext: also save top-K log-probabilities here");
  cmd->add_option("--kl-baseline", o.kl_baseline, "kl: the baseline written by --kl-save");
  cmd->add_option("--kl-top-k", o.kl_top_k, "log-probabilities kept per position (0 = the whole vocabulary)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--chunk", o.chunk, "tokens per forward chunk when scoring")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--max-len", o.max_len, "longest scored sequence (cache size)")
      ->check(CLI::Range(16, 1 << 24));
  cmd->add_option("--dump-requests", o.dump_requests,
                  "write each multiple-choice item's prompts, token ids and scores (JSONL)");
  cmd->add_flag("-q,--quiet", o.quiet, "no progress bar");
  cmd->callback([cmd] {
    if (cmd->got_subcommand("compare")) return;
    set_exit_code(run_eval(o));
  });

  static CompareOpts co;
  auto* cmp = cmd->add_subcommand("compare", "Differences between two kvant eval results (B - A)");
  cmp->add_option("a", co.a, "result A (baseline)")->required();
  cmp->add_option("b", co.b, "result B")->required();
  cmp->add_option("--json", co.json_out, "also write the differences as JSON");
  cmp->callback([] { set_exit_code(run_compare(co)); });
}

}  // namespace kvant::cli
