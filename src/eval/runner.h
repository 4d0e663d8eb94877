// `kvant eval`'s task runners: ARC-Challenge and MMLU (log-likelihood per
// choice), GSM8K (generation, exact match), WikiText-2 perplexity and KL
// against a saved baseline; each in-process or through a server (--url),
// resumable item by item (report.h's ResumeLog). The command (cli/cmd_eval)
// parses flags and loads what runs in-process through the callbacks in Ctx;
// this library does the rest.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "eval/data.h"
#include "eval/http_client.h"
#include "eval/report.h"
#include "eval/scorer.h"
#include "eval/stats.h"
#include "tokenizer/tokenizer.h"

namespace kvant::eval {

using nlohmann::json;

struct RunOptions {
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
  // The in-process configuration, as a KL baseline's header records it.
  struct Reference {
    std::string model, prefill_weights, decode_weights, kv_dtype, kv_scale;
  } ref;
};

// One run's state. What runs in-process is made on first use through the
// callbacks, which the command sets (it knows the engine flags).
struct Ctx {
  Ctx(const RunOptions& opts, DataDir d) : o(opts), data(std::move(d)) {}
  const RunOptions& o;
  DataDir data;
  ResumeLog* log = nullptr;
  std::unique_ptr<ModelRunner> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<LoglikScorer> scorer;
  std::unique_ptr<Engine> engine;
  HttpTarget target;
  std::string served_model;
  std::ofstream dump;
  std::function<Result<void>(Ctx&)> load_model;      // sets model and scorer
  std::function<Result<void>(Ctx&)> load_tokenizer;  // sets tok
  std::function<Result<std::unique_ptr<Engine>>()> make_engine;
};

inline Result<void> ensure_local_model(Ctx& c) {
  if (c.model) return {};
  if (!c.load_model) return make_error("eval: no in-process model to load");
  return c.load_model(c);
}
inline Result<void> ensure_tokenizer(Ctx& c) {
  if (c.tok) return {};
  if (!c.load_tokenizer) return make_error("eval: no tokenizer to load");
  return c.load_tokenizer(c);
}

// A metric's JSON (estimate_json with its unit and per-item key).
json metric(const Estimate& e, const std::string& unit, const std::string& item_key);
// --limit: "N" for every task, or "task=N,..." (tasks not named: all items).
Result<size_t> limit_for(const std::string& spec, const std::string& task);

Result<json> run_mc(Ctx& c, const std::string& task);  // arc_challenge or mmlu
Result<json> run_gsm8k(Ctx& c);
Result<json> run_wikitext(Ctx& c);
Result<json> run_kl(Ctx& c);

}  // namespace kvant::eval
