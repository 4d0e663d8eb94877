// `kvant bench`: prefill and decode throughput on random tokens, measured the
// way llama.cpp's llama-bench measures pp/tg: prefill is one forward over
// `--prompt-tokens` tokens, decode is `--gen-tokens` single-token steps from
// an empty context; each repeated `--reps` times, mean reported.
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"

namespace kvant::cli {
namespace {

struct BenchOpts {
  std::string model;
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int threads = 0;
  int reps = 3;
  bool json = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run_bench(const BenchOpts& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const double t_load = now_s();
  auto m = Model::load(o.model);
  if (!m) {
    std::fprintf(stderr, "kvant: %s\n", m.error().message.c_str());
    return 1;
  }
  const double load_s = now_s() - t_load;
  Model& model = **m;
  const auto& c = model.config();
  const int64_t ctx = std::max(o.prompt_tokens, o.gen_tokens) + 1;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab - 1));
  std::vector<float> logits(size_t(c.vocab));
  double pp_sum = 0, tg_sum = 0;
  for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms up
    SeqKv kv(c, ctx);
    double pp = 0, tg = 0;
    if (o.prompt_tokens > 0) {
      Batch b;
      for (int i = 0; i < o.prompt_tokens; ++i) b.tokens.push_back(tok(rng));
      b.seqs.push_back({&kv, 0, o.prompt_tokens, false});
      const double t0 = now_s();
      auto r = model.forward(b, logits);
      pp = now_s() - t0;
      if (!r.ok()) { std::fprintf(stderr, "kvant: %s\n", r.error().message.c_str()); return 1; }
    }
    if (o.gen_tokens > 0) {
      SeqKv kv2(c, ctx);
      Batch b;
      b.tokens = {tok(rng)};
      b.seqs.push_back({&kv2, 0, 1, false});
      const double t0 = now_s();
      for (int i = 0; i < o.gen_tokens; ++i) {
        b.seqs[0].pos0 = i;
        auto r = model.forward(b, logits);
        if (!r.ok()) { std::fprintf(stderr, "kvant: %s\n", r.error().message.c_str()); return 1; }
        b.tokens[0] = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      tg = now_s() - t0;
    }
    if (rep > 0) { pp_sum += pp; tg_sum += tg; }
  }
  const double pp_s = o.prompt_tokens > 0 ? o.prompt_tokens * o.reps / pp_sum : 0;
  const double tg_s = o.gen_tokens > 0 ? o.gen_tokens * o.reps / tg_sum : 0;
  const char* isa = kernels::isa_name(kernels::active().isa);
  if (o.json) {
    std::printf("{\"model\": \"%s\", \"arch\": \"%s\", \"threads\": %d, \"isa\": \"%s\", "
                "\"weights\": \"bf16\", \"prompt_tokens\": %d, \"gen_tokens\": %d, \"reps\": %d, "
                "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"load_s\": %.3f}\n",
                o.model.c_str(), c.arch_name.c_str(), num_threads(), isa, o.prompt_tokens,
                o.gen_tokens, o.reps, pp_s, tg_s, load_s);
  } else {
    std::printf("model %s (%s), %d threads, %s kernels, load %.2f s\n", o.model.c_str(),
                c.arch_name.c_str(), num_threads(), isa, load_s);
    std::printf("prefill pp%d: %.1f tok/s\ndecode tg%d: %.1f tok/s\n", o.prompt_tokens, pp_s,
                o.gen_tokens, tg_s);
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  static BenchOpts o;
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode throughput");
  cmd->add_option("-m,--model", o.model, "GGUF file or Hugging Face directory")->required();
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "tokens in the prefill batch")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--gen-tokens", o.gen_tokens, "decode steps")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-t,--threads", o.threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--reps", o.reps, "repetitions after one warm-up")->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", o.json, "print one JSON object");
  cmd->callback([] { set_exit_code(run_bench(o)); });
}

}  // namespace kvant::cli
