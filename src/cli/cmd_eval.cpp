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
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "dist/communicator.h"
#include "engine/model_runner.h"
#include "eval/eval_link.h"
#include "eval/report.h"
#include "eval/runner.h"

namespace kvant::cli {
namespace {

using nlohmann::json;
using namespace kvant::eval;
using Clock = std::chrono::steady_clock;

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

// The library's options (eval/runner.h) and the engine flags of the
// in-process run.
struct Opts : RunOptions {
  EngineFlags ef;
};

struct CompareOpts {
  std::string a, b, json_out;
};

// The in-process run's engine options, made once (under mpirun that makes
// the communicator), and over several ranks the link rank 0 leads the
// others with (eval/eval_link.h).
struct Local {
  EngineOptions eo;
  std::unique_ptr<EvalLink> link;
  bool leader() const { return link && link->rank() == 0; }
};

// The in-process model and its scorer (Ctx::load_model).
Result<void> load_model(const Opts& o, const Local& l, Ctx& c) {
  const EngineOptions& eo = l.eo;
  if (l.leader()) KV_TRY(l.link->send(EvalOp::kLoad));
  RunnerOptions ro;
  ro.model_path = eo.model_path;
  ro.prefill_weights = eo.prefill_weights;
  ro.decode_weights = eo.decode_weights;
  ro.int4_group = eo.int4_group;
  ro.int4_lm_head = eo.int4_lm_head;
  ro.comm = eo.comm;
  ro.tp = eo.tp;
  ro.ep = eo.ep;
  auto m = ModelRunner::load(ro);
  if (!m) return m.error();
  c.model = std::move(*m);
  const ModelConfig& full = c.model->full_config();
  SeqKvOptions kv;
  if (eo.kv_dtype != KvDType::kBf16) {
    kv.elem = eo.kv_dtype == KvDType::kFp8E4m3 ? KvDType::kFp8E4m3 : KvDType::kFp8E5m2;
    if (eo.kv_scale_mode == KvScaleMode::kDynamic) {
      kv.dynamic_scales = true;
    } else {
      const std::string path = eo.kv_scales_path.empty() ? default_kv_scales_path(eo.model_path)
                                                         : eo.kv_scales_path;
      auto s = load_kv_scales(path);
      if (!s) return s.error();
      // This rank's heads (all of them in one process).
      const auto [h0, h1] = c.model->kv_heads_held();
      auto sc = static_kv_scales(*s, path, full.layers, full.cache_heads(), h0, h1, eo.kv_dtype);
      if (!sc) return make_error("eval: " + sc.error().message);
      kv.static_k = std::move(sc->k);
      kv.static_v = std::move(sc->v);
    }
  }
  const int64_t cap = std::min<int64_t>(o.max_len, full.max_positions);
  c.scorer = std::make_unique<LoglikScorer>(*c.model, kv, cap, o.chunk);
  if (l.leader()) c.scorer->set_link(l.link.get());
  return {};
}

// The model's tokenizer (Ctx::load_tokenizer).
Result<void> load_tokenizer(const Opts& o, Ctx& c) {
  auto t = load_tokenizer_for(o.ef.tokenizer.empty() ? o.ef.model : o.ef.tokenizer, nullptr);
  if (!t) return t.error();
  c.tok = std::move(*t);
  return {};
}

// The engine GSM8K generates with (Ctx::make_engine): 512 MiB of KV unless
// the flags say, and room for --concurrency requests at once.
Result<std::unique_ptr<Engine>> make_engine(const Opts& o, const Local& l) {
  if (l.leader()) KV_TRY(l.link->send(EvalOp::kEngine));
  EngineOptions eo = l.eo;
  if (eo.kv_memory_bytes == 0) eo.kv_memory_bytes = int64_t(512) << 20;
  eo.max_running = std::max<int64_t>(eo.max_running, o.concurrency);
  return Engine::create(eo);
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

// Rank 0's run (or the only one's): every task, the result files and the table.
int run_tasks(Opts& o, const std::vector<std::string>& tasks, Local& l) {
  auto data = DataDir::open(o.data.empty() ? default_data_dir() : o.data);
  if (!data) return fail(data.error().message);
  Ctx c(o, std::move(*data));
  c.load_model = [&o, &l](Ctx& x) { return load_model(o, l, x); };
  c.load_tokenizer = [&o](Ctx& x) { return load_tokenizer(o, x); };
  c.make_engine = [&o, &l] { return make_engine(o, l); };
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
  if (l.link) result["config"]["ranks"] = {{"tp", o.ef.tp}, {"ep", o.ef.ep}};
  result["threads"] = o.ef.threads;
  const auto t0 = Clock::now();
  for (const auto& t : tasks) {
    Result<json> r = make_error("");
    if (t == "gsm8k") r = run_gsm8k(c);
    else if (t == "wikitext") r = run_wikitext(c);
    else if (t == "kl") r = run_kl(c);
    else r = run_mc(c, t);
    // The other ranks follow an engine until this one's goes away.
    if (l.link) c.engine.reset();
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

int run_eval(Opts& o) {
  o.ref = {o.ef.model, o.ef.prefill_weights, o.ef.decode_weights, o.ef.kv_dtype, o.ef.kv_scale};
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
  Local l;
  if (o.url.empty()) {
    auto eo = engine_options(o.ef);  // under mpirun: the communicator
    if (!eo) return fail(eo.error().message);
    l.eo = std::move(*eo);
    if (l.eo.comm && l.eo.comm->size() > 1) l.link = std::make_unique<EvalLink>(*l.eo.comm);
  } else if (dist::launched_by_mpirun()) {
    return fail("eval: --url scores through a server from one process; run it without mpirun");
  }
  if (l.link && !l.leader()) {
    // A follower: its share of the model, driven by rank 0.
    Ctx c(o, DataDir{});
    c.load_model = [&o, &l](Ctx& x) { return load_model(o, l, x); };
    c.make_engine = [&o, &l] { return make_engine(o, l); };
    auto r = follow_eval(c, *l.link);
    if (!r) {
      std::fprintf(stderr, "kvant eval (rank %d): %s\n", l.link->rank(), r.error().message.c_str());
      l.eo.comm->abort(1);
    }
    return *r;
  }
  const int rc = run_tasks(o, tasks, l);
  if (l.link) {
    const int32_t status = rc;
    if (auto s = l.link->send(EvalOp::kStop, std::span<const int32_t>(&status, 1)); !s) {
      std::fprintf(stderr, "kvant eval: %s\n", s.error().message.c_str());
      l.eo.comm->abort(1);
    }
  }
  return rc;
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
