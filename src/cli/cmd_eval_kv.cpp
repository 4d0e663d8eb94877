// `kvant calibrate-kv`: static FP8 KV scales (per layer and KV head) from a
// calibration text, written next to the model.
// `kvant eval-kv`: what FP8 KV costs in accuracy. Windows of a text are fed
// token by token (every token attends through the paged decode path, so all
// earlier K/V is read back from FP8 pages), with a BF16 cache as the
// reference and FP8 caches (e4m3/e5m2, static/dynamic scales) beside it. Per
// mode: mean and 99th-percentile KL(BF16 || FP8) of the next-token
// distributions, the rate at which the top-1 token agrees, and perplexity.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "engine/logprobs.h"
#include "engine/model_runner.h"

namespace kvant::cli {
namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

Result<std::vector<int32_t>> tokenize_file(const std::string& model, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto tok = load_tokenizer_for(model, nullptr);
  if (!tok) return tok.error();
  return (*tok)->encode(ss.str(), /*add_bos=*/false, /*parse_special=*/false);
}

struct CalibOpts {
  std::string model, text, out;
  int tokens = 16384;
  int chunk = 512;
  int threads = 0;
  bool from_end = true;
};

// The model with the checkpoint's own weights.
Result<std::unique_ptr<ModelRunner>> load_native(const std::string& path) {
  RunnerOptions r;
  r.model_path = path;
  return ModelRunner::load(r);
}

int run_calibrate(const CalibOpts& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  auto m = load_native(o.model);
  if (!m) return fail(m.error().message);
  auto toks = tokenize_file(o.model, o.text);
  if (!toks) return fail(toks.error().message);
  const size_t n = std::min(toks->size(), size_t(o.tokens));
  if (n == 0) return fail(o.text + " has no tokens");
  std::span<const int32_t> use(*toks);
  use = o.from_end ? use.last(n) : use.first(n);
  auto s = calibrate_kv_scales(**m, use, std::min<int64_t>(o.chunk, (*m)->config().max_positions));
  if (!s) return fail(s.error().message);
  s->source = o.text + (o.from_end ? " (last " : " (first ") + std::to_string(n) + " tokens)";
  const std::string out = o.out.empty() ? default_kv_scales_path(o.model) : o.out;
  auto w = save_kv_scales(*s, out);
  if (!w) return fail(w.error().message);
  const auto [kmin, kmax] = std::minmax_element(s->k_amax.begin(), s->k_amax.end());
  const auto [vmin, vmax] = std::minmax_element(s->v_amax.begin(), s->v_amax.end());
  std::printf(
      "wrote %s: %lld layers x %lld KV heads from %lld tokens; |K| max %.3g..%.3g, |V| max "
      "%.3g..%.3g\n",
      out.c_str(), (long long)s->layers, (long long)s->kv_heads, (long long)s->tokens, *kmin, *kmax,
      *vmin, *vmax);
  return 0;
}

struct EvalOpts {
  std::string model, text, json_out;
  int windows = 16;
  int ctx = 512;
  int calib_tokens = 16384;
  int threads = 0;
};

struct Mode {
  std::string name;
  SeqKvOptions kv;
  std::vector<double> kl;
  int64_t top1_same = 0, n = 0;
  double nll = 0;
};


int run_eval(const EvalOpts& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  auto m = load_native(o.model);
  if (!m) return fail(m.error().message);
  ModelRunner& model = **m;
  const ModelConfig& c = model.config();
  auto toks = tokenize_file(o.model, o.text);
  if (!toks) return fail(toks.error().message);
  const int64_t W = o.windows, L = o.ctx;
  if (int64_t(toks->size()) < W * L + o.calib_tokens)
    return fail(o.text + " has " + std::to_string(toks->size()) + " tokens; need " +
                std::to_string(W * L + o.calib_tokens) + " (windows x ctx + calibration)");
  // Static scales from the end of the text, disjoint from the windows.
  auto scales =
      calibrate_kv_scales(model, std::span<const int32_t>(*toks).last(size_t(o.calib_tokens)),
                          std::min<int64_t>(512, c.max_positions));
  if (!scales) return fail(scales.error().message);

  std::vector<Mode> modes;
  for (auto [name, elem, mf] : {std::tuple{"fp8_e4m3", KvDType::kFp8E4m3, 448.f},
                                std::tuple{"fp8_e5m2", KvDType::kFp8E5m2, 57344.f}}) {
    Mode st;
    st.name = std::string(name) + "/static";
    st.kv.elem = elem;
    for (size_t i = 0; i < scales->k_amax.size(); ++i) {
      st.kv.static_k.push_back(scales->k_amax[i] > 0 ? scales->k_amax[i] / mf : 1.f);
      st.kv.static_v.push_back(scales->v_amax[i] > 0 ? scales->v_amax[i] / mf : 1.f);
    }
    modes.push_back(st);
    Mode dy;
    dy.name = std::string(name) + "/dynamic";
    dy.kv.elem = elem;
    dy.kv.dynamic_scales = true;
    modes.push_back(dy);
  }

  // One cache per (mode, window); the reference is BF16.
  std::vector<std::unique_ptr<SeqKv>> ref_kv;
  std::vector<std::vector<std::unique_ptr<SeqKv>>> kv(modes.size());
  for (int64_t w = 0; w < W; ++w) {
    ref_kv.push_back(std::make_unique<SeqKv>(c, L));
    for (size_t mi = 0; mi < modes.size(); ++mi)
      kv[mi].push_back(std::make_unique<SeqKv>(c, L, modes[mi].kv));
  }
  const int64_t V = c.vocab;
  std::vector<float> ref_logits(size_t(W * V)), logits(size_t(W * V));
  std::vector<double> lp_ref, lp;
  double ref_nll = 0;
  int64_t ref_n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RunChunk> batch(static_cast<size_t>(W));
  for (int64_t pos = 0; pos + 1 < L; ++pos) {
    // Window w's token at `pos`, one chunk per window, over `caches`.
    auto make_batch = [&](std::vector<std::unique_ptr<SeqKv>>& caches) {
      for (int64_t w = 0; w < W; ++w)
        batch[size_t(w)] = {caches[size_t(w)].get(), pos,
                            std::span<const int32_t>(*toks).subspan(size_t(w * L + pos), 1), false};
      return std::span<const RunChunk>(batch);
    };
    if (auto r = model.forward(make_batch(ref_kv), ref_logits); !r) return fail(r.error().message);
    for (int64_t w = 0; w < W; ++w) {
      log_softmax({ref_logits.data() + w * V, size_t(V)}, lp_ref);
      ref_nll -= lp_ref[size_t((*toks)[size_t(w * L + pos + 1)])];
      ++ref_n;
    }
    for (size_t mi = 0; mi < modes.size(); ++mi) {
      if (auto r = model.forward(make_batch(kv[mi]), logits); !r) return fail(r.error().message);
      Mode& md = modes[mi];
      for (int64_t w = 0; w < W; ++w) {
        const float* rr = ref_logits.data() + w * V;
        const float* cr = logits.data() + w * V;
        log_softmax({rr, size_t(V)}, lp_ref);
        log_softmax({cr, size_t(V)}, lp);
        double kl = 0;
        for (int64_t i = 0; i < V; ++i)
          kl += std::exp(lp_ref[size_t(i)]) * (lp_ref[size_t(i)] - lp[size_t(i)]);
        md.kl.push_back(std::max(0.0, kl));
        md.top1_same += Sampler::argmax({rr, size_t(V)}) == Sampler::argmax({cr, size_t(V)});
        md.nll -= lp[size_t((*toks)[size_t(w * L + pos + 1)])];
        ++md.n;
      }
    }
    if (pos % 64 == 63) {
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "\rposition %lld/%lld (%.0f s)", (long long)pos + 1, (long long)L - 1,
                   el);
    }
  }
  std::fprintf(stderr, "\n");
  nlohmann::json out;
  out["model"] = o.model;
  out["text"] = o.text;
  out["windows"] = W;
  out["ctx"] = L;
  out["positions_scored"] = ref_n;
  out["calibration_tokens"] = o.calib_tokens;
  out["bf16_ppl"] = std::exp(ref_nll / double(ref_n));
  std::printf("%-20s %12s %12s %10s %10s\n", "kv mode", "mean KL", "p99 KL", "same top1", "ppl");
  std::printf("%-20s %12s %12s %10s %10.4f\n", "bf16 (reference)", "-", "-", "-",
              std::exp(ref_nll / double(ref_n)));
  for (auto& md : modes) {
    std::vector<double> k = md.kl;
    double mean = 0;
    for (double x : k) mean += x;
    mean /= double(k.size());
    std::sort(k.begin(), k.end());
    const double p99 = k[std::min(k.size() - 1, size_t(double(k.size()) * 0.99))];
    const double top1 = double(md.top1_same) / double(md.n);
    const double ppl = std::exp(md.nll / double(md.n));
    std::printf("%-20s %12.6f %12.6f %9.2f%% %10.4f\n", md.name.c_str(), mean, p99, 100 * top1,
                ppl);
    out["modes"][md.name] = {{"mean_kl", mean}, {"p99_kl", p99}, {"same_top1", top1}, {"ppl", ppl}};
  }
  if (!o.json_out.empty()) {
    std::ofstream f(o.json_out);
    f << out.dump(2) << "\n";
    if (!f) return fail("cannot write " + o.json_out);
  }
  return 0;
}

}  // namespace

void register_eval_kv(CLI::App& app) {
  static CalibOpts co;
  auto* cal = app.add_subcommand("calibrate-kv",
                                 "Static FP8 KV scales (per layer and KV head) from a text");
  cal->add_option("-m,--model", co.model, "GGUF file or Hugging Face directory")->required();
  cal->add_option("--text", co.text, "calibration text file")->required();
  cal->add_option("-o,--out", co.out, "output (default: <model>.kv_scales.json)");
  cal->add_option("--tokens", co.tokens, "calibration tokens")->check(CLI::Range(1, 1 << 26));
  cal->add_option("--chunk", co.chunk, "tokens per calibration sequence")
      ->check(CLI::Range(1, 1 << 20));
  cal->add_flag("!--from-start", co.from_end,
                "take the tokens from the start of the text (default: the end)");
  cal->add_option("-t,--threads", co.threads, "worker threads")->check(CLI::Range(0, 1024));
  cal->callback([] { set_exit_code(run_calibrate(co)); });

  static EvalOpts eo;
  auto* ev = app.add_subcommand("eval-kv",
                                "FP8 vs BF16 KV cache: KL divergence, top-1 agreement, perplexity");
  ev->add_option("-m,--model", eo.model, "GGUF file or Hugging Face directory")->required();
  ev->add_option("--text", eo.text,
                 "evaluation text (windows from its start, calibration from its end)")
      ->required();
  ev->add_option("--windows", eo.windows, "windows, fed as one batch")->check(CLI::Range(1, 4096));
  ev->add_option("--ctx", eo.ctx, "tokens per window")->check(CLI::Range(2, 1 << 20));
  ev->add_option("--calib-tokens", eo.calib_tokens, "static-scale calibration tokens")
      ->check(CLI::Range(1, 1 << 26));
  ev->add_option("--json", eo.json_out, "also write the results as JSON to this file");
  ev->add_option("-t,--threads", eo.threads, "worker threads")->check(CLI::Range(0, 1024));
  ev->callback([] { set_exit_code(run_eval(eo)); });
}

}  // namespace kvant::cli
