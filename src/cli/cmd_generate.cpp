// `kvant generate`: one prompt in, text out (streamed), then prompt and decode
// throughput on stderr. Plain or chat (the model's own template, or one named
// with --chat-template).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/threads.h"
#include "engine/sampler.h"
#include "io/gguf.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvant::cli {
namespace {

struct GenOpts {
  std::string model, prompt, system, chat_template;
  int n_predict = 128;
  int threads = 0;
  int ctx = 4096;
  bool chat = false;
  SamplingParams sp;
};

// The chat template of a Hugging Face directory (tokenizer_config.json).
std::string read_hf_chat_template(const std::string& dir) {
  std::ifstream f(std::filesystem::path(dir) / "tokenizer_config.json");
  if (!f) return "";
  auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
    return j["chat_template"].get<std::string>();
  return "";
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

int run_generate(const GenOpts& o) {
  namespace fs = std::filesystem;
  if (o.threads > 0) set_num_threads(o.threads);
  auto m = Model::load(o.model);
  if (!m) return fail(m.error().message);
  Model& model = **m;
  const auto& cfg = model.config();

  std::optional<Tokenizer> tok;
  std::string chat_tmpl;
  if (fs::is_directory(o.model)) {
    auto t = Tokenizer::from_hf_json((fs::path(o.model) / "tokenizer.json").string());
    if (!t) return fail(t.error().message);
    tok = std::move(*t);
    chat_tmpl = read_hf_chat_template(o.model);
  } else {
    auto g = GgufFile::open(o.model);
    if (!g) return fail(g.error().message);
    auto t = Tokenizer::from_gguf(*g);
    if (!t) return fail(t.error().message);
    tok = std::move(*t);
    chat_tmpl = g->get_string("tokenizer.chat_template").value_or("");
  }

  std::vector<int32_t> ids;
  if (o.chat) {
    auto fmt = o.chat_template.empty() ? detect_chat_format(chat_tmpl, cfg.arch_name)
                                       : chat_format_from_name(o.chat_template);
    if (!fmt) return fail(fmt.error().message);
    std::vector<ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.prompt});
    const std::string bos = tok->bos_id() >= 0 ? tok->token_text(tok->bos_id()) : "";
    auto text = render_chat(*fmt, msgs, true, bos);
    if (!text) return fail(text.error().message);
    ids = tok->encode(*text, /*add_bos=*/false, /*parse_special=*/true);
  } else {
    ids = tok->encode(o.prompt, /*add_bos=*/true, /*parse_special=*/true);
  }
  if (ids.empty()) return fail("the prompt is empty after tokenization");
  const int64_t ctx = std::min<int64_t>(o.ctx, cfg.max_positions);
  if (int64_t(ids.size()) + 1 > ctx)
    return fail("prompt has " + std::to_string(ids.size()) + " tokens; the context holds " + std::to_string(ctx));
  const int64_t n_gen = std::min<int64_t>(o.n_predict, ctx - int64_t(ids.size()));

  SeqKv kv(cfg, ctx);
  Sampler sampler(o.sp);
  StreamDecoder out(*tok);
  std::vector<float> logits(size_t(cfg.vocab));
  std::vector<int32_t> history = ids;

  Batch b;
  b.tokens = ids;
  b.seqs.push_back({&kv, 0, int64_t(ids.size()), false});
  const double t0 = now_s();
  auto r = model.forward(b, logits);
  if (!r.ok()) return fail(r.error().message);
  const double t_prompt = now_s() - t0;

  const double t1 = now_s();
  int64_t generated = 0;
  std::string stop_reason = "length";
  for (int64_t i = 0; i < n_gen; ++i) {
    const int32_t next = sampler.sample(logits, history);
    ++generated;
    const auto& eog = tok->eog_ids();
    if (std::find(eog.begin(), eog.end(), next) != eog.end()) {
      stop_reason = "stop";
      break;
    }
    history.push_back(next);
    std::string piece = out.push(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (i + 1 == n_gen) break;
    b.tokens = {next};
    b.seqs[0] = {&kv, int64_t(history.size()) - 1, 1, false};
    auto rr = model.forward(b, logits);
    if (!rr.ok()) return fail(rr.error().message);
  }
  const double t_gen = now_s() - t1;
  std::string rest = out.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::printf("\n");
  std::fprintf(stderr, "\nprompt: %zu tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | finish: %s | %d threads\n",
               ids.size(), double(ids.size()) / t_prompt, (long long)generated,
               generated > 0 ? double(generated) / t_gen : 0.0, stop_reason.c_str(), num_threads());
  return 0;
}

}  // namespace

void register_generate(CLI::App& app) {
  static GenOpts o;
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt");
  cmd->add_option("-m,--model", o.model, "GGUF file or Hugging Face directory")->required();
  cmd->add_option("-p,--prompt", o.prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", o.n_predict, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temp", o.sp.temperature, "temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", o.sp.top_k, "top-k (0 = off)")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--top-p", o.sp.top_p, "top-p")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", o.sp.min_p, "min-p")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", o.sp.repetition_penalty, "repetition penalty")->check(CLI::Range(0.01, 100.0));
  cmd->add_option("--seed", o.sp.seed, "sampling seed");
  cmd->add_option("-t,--threads", o.threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("-c,--ctx", o.ctx, "context length")->check(CLI::Range(16, 1 << 22));
  cmd->add_flag("--chat", o.chat, "wrap the prompt in the model's chat template");
  cmd->add_option("--system", o.system, "system message (with --chat)");
  cmd->add_option("--chat-template", o.chat_template, "chat template by name: chatml, smollm2, gemma, llama3");
  cmd->callback([] { set_exit_code(run_generate(o)); });
}

}  // namespace kvant::cli
