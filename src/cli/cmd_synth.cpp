// `kvant synth`: a scaled-down random-weight checkpoint with a real model's
// structure (quant/synth.h), for benchmarks of architectures too large to
// load here.
#include <cstdio>

#include "cli/commands.h"
#include "quant/synth.h"

namespace kvant::cli {

void register_synth(CLI::App& app) {
  static SynthOptions o;
  auto* cmd = app.add_subcommand(
      "synth", "write a random-weight checkpoint shaped like a config.json, scaled down");
  cmd->add_option("--like", o.like, "config.json (or its directory) of the model to imitate")
      ->required();
  cmd->add_option("-o,--out", o.out, "output directory")->required();
  cmd->add_option("--scale", o.scale,
                  "factor on widths, head and expert counts and layers (default 0.125)");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "GGUF file whose tokenizer the checkpoint takes (its vocabulary sets vocab_size)");
  cmd->add_option("--seed", o.seed, "random seed (default 1)");
  cmd->add_flag("--mtp", o.mtp,
                "add one multi-token-prediction layer (random: its drafts are wrong; for "
                "measuring the cost of kvant serve --mtp)");
  cmd->callback([] {
    auto r = synth_checkpoint(o);
    if (!r) {
      std::fprintf(stderr, "kvant synth: %s\n", r.error().message.c_str());
      set_exit_code(1);
      return;
    }
    const auto& c = r->config;
    std::printf("%s: %s, %lld layers, hidden %lld, %lld heads, %lld routed experts (top %lld) of "
                "%lld, %.1fM parameters, %.1f MB\n",
                o.out.c_str(), c["architectures"][0].get<std::string>().c_str(),
                (long long)c.value("num_hidden_layers", 0), (long long)c.value("hidden_size", 0),
                (long long)c.value("num_attention_heads", 0),
                (long long)c.value("n_routed_experts", c.value("num_experts", 0)),
                (long long)c.value("num_experts_per_tok", 0),
                (long long)c.value("moe_intermediate_size", 0), double(r->params) / 1e6,
                double(r->bytes) / 1e6);
  });
}

}  // namespace kvant::cli
