// Multiple-choice tasks (ARC-Challenge, MMLU): each choice's log-likelihood
// after the few-shot prompt, in-process (LoglikScorer) or through a server;
// acc and length-normalized acc_norm. Also the runners' shared helpers.
#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "eval/progress.h"
#include "eval/remote.h"
#include "eval/runner.h"

namespace kvant::eval {

json metric(const Estimate& e, const std::string& unit, const std::string& item_key) {
  json m = estimate_json(e);
  if (!unit.empty()) m["unit"] = unit;
  if (!item_key.empty()) m["item_key"] = item_key;
  return m;
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
  const RunOptions& o = c.o;
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
    KV_TRY(run_parallel(todo.size(), o.concurrency, [&](size_t k) -> Result<void> {
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

}  // namespace kvant::eval
