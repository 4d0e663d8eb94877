// GSM8K: 8-shot chain of thought, greedy generation through the engine (or
// a server's /v1/completions), exact match on the final number (strict and
// flexible extraction).
#include <algorithm>
#include <mutex>
#include <thread>

#include "eval/progress.h"
#include "eval/remote.h"
#include "eval/runner.h"

namespace kvant::eval {

// GSM8K: generation through the engine, or the server.
Result<json> run_gsm8k(Ctx& c) {
  const RunOptions& o = c.o;
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
      if (!c.make_engine) return make_error("eval: no engine to run generation in-process");
      auto e = c.make_engine();
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

}  // namespace kvant::eval
