// `kvant eval-weights`: what quantized weights cost in accuracy. A text is cut
// into chunks of --ctx tokens; each chunk runs as one prefill on the
// reference (BF16 weights of -m) and on every candidate (an INT4 checkpoint,
// or -m quantized at load: "int4:g128", "fp8"; "int4:g32:asym" is not offered since
// load-time quantization is symmetric), and the second half of each chunk is
// scored, as llama.cpp's llama-perplexity does, so figures compare with its
// --kl-divergence output (a model that adds BOS gets it as each chunk's first
// token, as there): perplexity, and per candidate KL(reference ||
// candidate) mean / median / p99 / max, same-top-1 rate and the RMS of the
// change in the probability of the actual next token. KV is BF16 throughout.
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

struct Opts {
  std::string model, text, json_out;
  std::vector<std::string> candidates;
  int ctx = 512;
  int chunks = 16;
  int threads = 0;
};

struct Candidate {
  std::string spec;
  std::unique_ptr<ModelRunner> model;
  std::vector<double> kl, dp;
  int64_t same_top1 = 0, n = 0;
  double nll = 0;
  size_t bytes = 0;
};


// Weights of one precision for both phases.
RunnerOptions weights(const std::string& path, const std::string& precision) {
  RunnerOptions r;
  r.model_path = path;
  r.prefill_weights = r.decode_weights = precision;
  return r;
}

Result<std::unique_ptr<ModelRunner>> load_candidate(const std::string& base,
                                                    const std::string& spec) {
  if (spec.rfind("int4:g", 0) == 0) {
    RunnerOptions w = weights(base, "int4");
    try {
      w.int4_group = std::stoi(spec.substr(6));
    } catch (...) {
      return make_error("candidate '" + spec + "': expected int4:g32, int4:g64 or int4:g128");
    }
    if (w.int4_group != 32 && w.int4_group != 64 && w.int4_group != 128)
      return make_error("candidate '" + spec + "': group must be 32, 64 or 128");
    return ModelRunner::load(w);
  }
  if (spec == "fp8")  // FP8 e4m3, 128x128 block amax scales, through the FP8 kernels
    return ModelRunner::load(weights(base, "fp8"));
  if (spec.rfind("dequant:", 0) == 0)  // INT4 checkpoint run through the BF16 kernels
    return ModelRunner::load(weights(spec.substr(8), "bf16"));
  return ModelRunner::load(weights(spec, "native"));
}

int run(const Opts& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  auto ref = ModelRunner::load(weights(o.model, "bf16"));
  if (!ref) return fail(ref.error().message);
  const ModelConfig& c = (*ref)->config();
  std::vector<Candidate> cands;
  for (const auto& spec : o.candidates) {
    auto m = load_candidate(o.model, spec);
    if (!m) return fail(m.error().message);
    if ((*m)->config().vocab != c.vocab) return fail(spec + ": vocabulary differs from " + o.model);
    Candidate cd;
    cd.spec = spec;
    cd.bytes = (*m)->set_bytes(0);
    cd.model = std::move(*m);
    cands.push_back(std::move(cd));
  }
  std::ifstream f(o.text, std::ios::binary);
  if (!f) return fail("cannot open " + o.text);
  std::stringstream ss;
  ss << f.rdbuf();
  auto tok = load_tokenizer_for(o.model, nullptr);
  if (!tok) return fail(tok.error().message);
  const auto toks = (*tok)->encode(ss.str(), false, false);
  // As llama-perplexity: a model that adds BOS gets it as each chunk's first token.
  const int32_t bos = (*tok)->adds_bos() ? (*tok)->bos_id() : -1;
  const int64_t L = std::min<int64_t>(o.ctx, c.max_positions);
  const int64_t chunks = std::min<int64_t>(o.chunks, int64_t(toks.size()) / L);
  if (chunks <= 0) return fail(o.text + " is shorter than one chunk of " + std::to_string(L));
  const int64_t V = c.vocab, first = L / 2;
  std::vector<float> rl(size_t(L * V)), cl(size_t(L * V));
  std::vector<double> lr, lc;
  double ref_nll = 0;
  int64_t ref_n = 0;
  auto forward = [&](ModelRunner& m, const int32_t* ids,
                     std::vector<float>& out) -> Result<void> {
    SeqKv kv(m.config(), L);
    return m.forward(RunChunk{&kv, 0, std::span<const int32_t>(ids, size_t(L)), true}, out);
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t ch = 0; ch < chunks; ++ch) {
    std::vector<int32_t> chunk_ids(toks.begin() + ch * L, toks.begin() + (ch + 1) * L);
    if (bos >= 0) chunk_ids[0] = bos;
    const int32_t* ids = chunk_ids.data();
    if (auto r = forward(**ref, ids, rl); !r) return fail(r.error().message);
    for (int64_t p = first; p + 1 < L; ++p) {
      log_softmax({rl.data() + p * V, size_t(V)}, lr);
      ref_nll -= lr[size_t(ids[p + 1])];
      ++ref_n;
    }
    for (auto& cd : cands) {
      if (auto r = forward(*cd.model, ids, cl); !r) return fail(r.error().message);
      for (int64_t p = first; p + 1 < L; ++p) {
        log_softmax({rl.data() + p * V, size_t(V)}, lr);
        log_softmax({cl.data() + p * V, size_t(V)}, lc);
        double kl = 0;
        for (int64_t i = 0; i < V; ++i) kl += std::exp(lr[size_t(i)]) * (lr[size_t(i)] - lc[size_t(i)]);
        cd.kl.push_back(std::max(0.0, kl));
        const int32_t next = ids[p + 1];
        cd.dp.push_back(std::exp(lc[size_t(next)]) - std::exp(lr[size_t(next)]));
        cd.nll -= lc[size_t(next)];
        cd.same_top1 += Sampler::argmax({rl.data() + p * V, size_t(V)}) ==
                        Sampler::argmax({cl.data() + p * V, size_t(V)});
        ++cd.n;
      }
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\rchunk %lld/%lld (%.0f s, ETA %.0f s)", (long long)ch + 1,
                 (long long)chunks, el, el / double(ch + 1) * double(chunks - ch - 1));
  }
  std::fprintf(stderr, "\n");
  nlohmann::json out;
  const double ref_ppl = std::exp(ref_nll / double(ref_n));
  out["model"] = o.model;
  out["text"] = o.text;
  out["ctx"] = L;
  out["chunks"] = chunks;
  out["positions_scored"] = ref_n;
  out["reference"] = {{"weights", "bf16"}, {"ppl", ref_ppl}, {"bytes", (*ref)->set_bytes(0)}};
  std::printf("%d chunks of %lld tokens, second halves scored (%lld positions)\n", int(chunks),
              (long long)L, (long long)ref_n);
  std::printf("%-34s %9s %9s %10s %10s %10s %10s %9s %9s\n", "weights", "MiB", "ppl", "mean KL",
              "median KL", "p99 KL", "max KL", "top1 same", "RMS dp");
  std::printf("%-34s %9.1f %9.4f %10s %10s %10s %10s %9s %9s\n", "bf16 (reference)",
              double((*ref)->set_bytes(0)) / (1 << 20), ref_ppl, "-", "-", "-", "-", "-", "-");
  for (auto& cd : cands) {
    std::vector<double> k = cd.kl;
    std::sort(k.begin(), k.end());
    double mean = 0, dp2 = 0;
    for (double x : k) mean += x;
    mean /= double(k.size());
    for (double d : cd.dp) dp2 += d * d;
    const double rms_dp = std::sqrt(dp2 / double(cd.dp.size()));
    const double med = k[k.size() / 2];
    const double p99 = k[std::min(k.size() - 1, size_t(double(k.size()) * 0.99))];
    const double ppl = std::exp(cd.nll / double(cd.n));
    const double top1 = double(cd.same_top1) / double(cd.n);
    std::printf("%-34s %9.1f %9.4f %10.5f %10.5f %10.5f %10.4f %8.2f%% %8.3f%%\n", cd.spec.c_str(),
                double(cd.bytes) / (1 << 20), ppl, mean, med, p99, k.back(), 100 * top1,
                100 * rms_dp);
    out["candidates"].push_back({{"weights", cd.spec},
                                 {"bytes", cd.bytes},
                                 {"ppl", ppl},
                                 {"mean_kl", mean},
                                 {"median_kl", med},
                                 {"p99_kl", p99},
                                 {"max_kl", k.back()},
                                 {"same_top1", top1},
                                 {"rms_dp", rms_dp}});
  }
  if (!o.json_out.empty()) {
    std::ofstream jf(o.json_out);
    jf << out.dump(2) << "\n";
    if (!jf) return fail("cannot write " + o.json_out);
  }
  return 0;
}

}  // namespace

void register_eval_weights(CLI::App& app) {
  static Opts o;
  auto* cmd = app.add_subcommand(
      "eval-weights", "Quantized vs BF16 weights: perplexity, KL divergence, top-1 agreement");
  cmd->add_option("-m,--model", o.model, "reference checkpoint (run with BF16 weights)")->required();
  cmd->add_option("--candidate", o.candidates,
                  "an INT4 or FP8 checkpoint directory, int4:g32|g64|g128 (the reference "
                  "quantized at load with RTN), fp8 (the reference quantized at load to FP8 "
                  "e4m3 with 128x128 block scales), or dequant:DIR (an INT4 checkpoint's weights dequantized to "
                  "BF16: separates weight error from the int8 activations of the INT4 kernels); "
                  "repeatable")
      ->required();
  cmd->add_option("--text", o.text, "evaluation text (e.g. WikiText-2 test)")->required();
  cmd->add_option("--ctx", o.ctx, "tokens per chunk (the second half is scored)")
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_option("--chunks", o.chunks, "chunks from the start of the text")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--json", o.json_out, "also write the results as JSON to this file");
  cmd->add_option("-t,--threads", o.threads, "worker threads")->check(CLI::Range(0, 1024));
  cmd->callback([] { set_exit_code(run(o)); });
}

}  // namespace kvant::cli
