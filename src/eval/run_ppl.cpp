// WikiText-2 perplexity over windows (--window, --stride, --score), which can
// save the reference's top-K log-probabilities (--kl-save), and the KL
// divergence against such a baseline (--kl-baseline): in-process or through
// a server.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "eval/kl_baseline.h"
#include "eval/progress.h"
#include "eval/remote.h"
#include "eval/runner.h"
#include "eval/windows.h"

namespace kvant::eval {

Result<json> run_wikitext(Ctx& c) {
  const RunOptions& o = c.o;
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
    json hj = {{"model", remote ? o.url : o.ref.model}, {"window", W},
               {"stride", S},               {"score", score},
               {"top_k", K},                {"vocab", V},
               {"bos", plan->bos},          {"windows", plan->starts.size()},
               {"data", "wikitext-2-raw/wiki.test.raw"},
               {"data_sha256", c.data.sum("wikitext-2-raw/wiki.test.raw")},
               {"reference", {{"prefill_weights", o.ref.prefill_weights},
                              {"decode_weights", o.ref.decode_weights},
                              {"kv_dtype", o.ref.kv_dtype},
                              {"kv_scale", o.ref.kv_scale}}}};
    auto h = open_kl_save(o.kl_save, hj, !o.no_resume, &kl_have);
    if (!h) return h.error();
    kh = *h;
    kh.window = W, kh.score = score, kh.k = K;
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
  const RunOptions& o = c.o;
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

}  // namespace kvant::eval
