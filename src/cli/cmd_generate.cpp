// `kvant generate`: one prompt in, text out (streamed), then prompt and decode
// throughput on stderr. Runs as one request through the engine (paged KV in
// the chosen dtype, chunked prefill, the integrity pass). Plain or chat (the model's own template,
// or one named with --chat-template).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvant::cli {
namespace {

struct GenOpts {
  EngineFlags engine;
  std::string prompt, system, chat_template;
  int n_predict = 128;
  bool chat = false;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  SamplingParams sp;
  SpeculativeParams spec;
  std::string spec_method = "ngram";
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

// Under --tp / --ep, each rank's share: the weights it holds and its
// memory as the kernel counts it (/proc/self/status: VmRSS, VmHWM, RssAnon),
// to set beside `kvant plan --tp N --ep M`.
void report_memory(const Engine& eng) {
  if (eng.ranks() <= 1) return;
  std::ifstream f("/proc/self/status");
  std::string line, rss = "?", hwm = "?", anon = "?";
  auto mib = [](const std::string& l) {
    return std::to_string(std::stoll(l.substr(l.find(':') + 1)) / 1024) + " MiB";
  };
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss = mib(line);
    if (line.rfind("VmHWM:", 0) == 0) hwm = mib(line);
    if (line.rfind("RssAnon:", 0) == 0) anon = mib(line);
  }
  std::fprintf(stderr, "kvant: rank %d of %d: weights %zu MiB held; RSS %s (peak %s), anonymous %s\n",
               eng.rank(), eng.ranks(), eng.weight_bytes() >> 20, rss.c_str(), hwm.c_str(),
               anon.c_str());
}

int run_generate(const GenOpts& o) {
  auto eo = engine_options(o.engine);
  if (!eo) return fail(eo.error().message);
  eo->max_running = 1;
  SpeculativeParams spec = o.spec;
  if (o.spec_method == "mtp") {
    // Drafts from the MTP layer: load it; one token per step unless
    // --speculative asks for more (the layer chained on itself).
    eo->mtp = true;
    spec.method = SpecMethod::kMtp;
    spec.num_tokens = std::max(1, spec.num_tokens);
  }
  auto created = Engine::create(*eo);
  if (!created) return fail(created.error().message);
  Engine& eng = **created;
  if (eng.rank() != 0) {  // a follower of rank 0's engine (mpirun, --tp / --ep)
    auto r = eng.follow();
    report_memory(eng);
    return r ? 0 : fail(r.error().message);
  }
  const Tokenizer& tok = eng.tokenizer();

  std::vector<int32_t> ids;
  if (o.chat) {
    auto chat = ChatRenderer::create(o.chat_template, eng.chat_template(),
                                     eng.model_config().arch_name,
                                     tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "",
                                     tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "");
    if (!chat) return fail(chat.error().message);
    std::vector<ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.prompt});
    auto text = chat->render(msgs, /*add_generation_prompt=*/true);
    if (!text) return fail(text.error().message);
    ids = tok.encode(*text, /*add_bos=*/false, /*parse_special=*/true);
  } else {
    ids = tok.encode(o.prompt, /*add_bos=*/true, /*parse_special=*/true);
  }
  if (ids.empty()) return fail("the prompt is empty after tokenization");

  Request r;
  r.prompt = ids;
  r.sampling = o.sp;
  r.stop.max_tokens = o.n_predict;
  r.stop.stop = o.stop;
  r.stop.ignore_eos = o.ignore_eos;
  r.speculative = spec;
  double t_first = 0, t_last = 0;
  int64_t generated = 0;
  FinishReason finish = FinishReason::None;
  std::string error;
  r.on_event = [&](const RequestEvent& e) {
    if (e.token >= 0) {
      if (generated == 0) t_first = now_s();
      t_last = now_s();
      ++generated;
    }
    std::fwrite(e.text.data(), 1, e.text.size(), stdout);
    std::fflush(stdout);
    if (e.finish != FinishReason::None) {
      finish = e.finish;
      error = std::string(e.error);
    }
  };
  const double t0 = now_s();
  auto id = eng.submit(std::move(r));
  if (!id) return fail(id.error().message);
  auto done = eng.run_until_idle();
  if (!done) return fail(done.error().message);
  std::printf("\n");
  report_memory(eng);
  if (finish == FinishReason::Error) return fail(error);
  const double prefill_s = t_first - t0;
  const double decode_s = t_last - t_first;
  std::fprintf(stderr,
               "\nprompt: %zu tokens %.1f tok/s | decode: %lld tokens %.1f tok/s | finish: %s | %d "
               "threads\n",
               ids.size(), double(ids.size()) / prefill_s, (long long)generated,
               generated > 1 ? double(generated - 1) / decode_s : 0.0,
               std::string(finish_reason_name(finish)).c_str(), num_threads());
  if (spec.num_tokens > 0) {
    const EngineStats s = eng.stats();
    std::fprintf(stderr, "speculative: %lld draft tokens, %lld accepted (%.0f%%) in %lld steps\n",
                 (long long)s.spec_draft_tokens, (long long)s.spec_accepted_tokens,
                 s.spec_draft_tokens ? 100.0 * double(s.spec_accepted_tokens) /
                                           double(s.spec_draft_tokens)
                                     : 0.0,
                 (long long)s.spec_steps);
  }
  return 0;
}

}  // namespace

void register_generate(CLI::App& app) {
  static GenOpts o;
  auto* cmd = app.add_subcommand("generate",
                                 "Generate text from a prompt (one request through the engine)");
  add_engine_flags(cmd, o.engine);
  cmd->add_option("-p,--prompt", o.prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", o.n_predict, "tokens to generate")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temp", o.sp.temperature, "temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", o.sp.top_k, "top-k (0 = off)")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--top-p", o.sp.top_p, "top-p")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", o.sp.min_p, "min-p")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", o.sp.repetition_penalty, "repetition penalty")
      ->check(CLI::Range(0.01, 100.0));
  cmd->add_option("--presence-penalty", o.sp.presence_penalty, "presence penalty")
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", o.sp.frequency_penalty, "frequency penalty")
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--seed", o.sp.seed, "sampling seed (0 = the engine picks one)");
  cmd->add_option("--stop", o.stop, "stop string (repeatable)");
  cmd->add_option("--speculative", o.spec.num_tokens,
                  "speculative decoding by prompt lookup: draft tokens per step (0 = off)")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--speculative-method", o.spec_method,
                  "where drafts come from: ngram (prompt lookup) or mtp (the checkpoint's "
                  "multi-token-prediction layer, loaded as with --mtp; --speculative N tokens "
                  "per step, default 1)")
      ->check(CLI::IsMember({"ngram", "mtp"}));
  cmd->add_option("--lookup-min", o.spec.min_ngram, "shortest suffix a draft is looked up by")
      ->check(CLI::Range(1, 16));
  cmd->add_option("--lookup-max", o.spec.max_ngram, "longest suffix a draft is looked up by")
      ->check(CLI::Range(1, 16));
  cmd->add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-generation tokens");
  cmd->add_flag("--chat", o.chat, "wrap the prompt in the model's chat template");
  cmd->add_option("--system", o.system, "system message (with --chat)");
  cmd->add_option("--chat-template", o.chat_template,
                  "chat template: a built-in name (chatml, smollm2, gemma, llama3) or a Jinja "
                  "file (default: the model's own template, else the built-in one detected)");
  cmd->callback([] { set_exit_code(run_generate(o)); });
}

}  // namespace kvant::cli
