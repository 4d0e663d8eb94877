// Scoring over a server (remote.h).
#include "eval/remote.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace kvant::eval {

// Runs fn(0..n-1) on `threads` threads; the first error wins.
Result<void> run_parallel(size_t n, int threads, const std::function<Result<void>(size_t)>& fn) {
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

}  // namespace kvant::eval
