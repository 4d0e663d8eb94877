// `kvant serve`: the OpenAI-compatible HTTP server (src/server/) over one
// engine built from the shared engine flags. Resolves the chat template here
// (the server layer sees only the engine) and hands it over as a function
// from messages to prompt tokens.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "engine/kv_plan.h"
#include "server/admission.h"
#include "server/server.h"
#include "tokenizer/chat_output.h"
#include "tokenizer/chat_template.h"

namespace kvant::cli {
namespace {

struct ServeOpts {
  EngineFlags engine;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key, api_key_file;
  std::string model_name;
  std::string chat_template;
  std::string tool_parser = "auto", reasoning_parser = "auto";
  std::string max_body = "32MiB";
  int64_t max_waiting = 1024;
  int64_t max_queued_tokens = 0;
  std::string max_request_memory = "1GiB";
  int64_t max_connections = 4096, max_connections_per_address = 512;
  double header_timeout = 30, body_timeout = 30;
  int http_workers = 2;
  std::vector<std::string> allowed_hosts, allowed_origins;
  int max_logprobs = kMaxTopLogprobs;
  double shutdown_grace = 30;
  // Disaggregated prefill and decode.
  std::string role = "colocated";
  int kv_port = 0;
  std::vector<std::string> prefill_peers;
  double kv_lease = 60, kv_transfer_timeout = 600;
  int64_t debug_kv_flip_handoff = 0;
  double debug_kv_send_pause = 0;
};

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant: %s\n", msg.c_str());
  return 1;
}

std::string default_model_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name.empty() ? "kvant" : name;
}

int run_serve(const ServeOpts& o) {
  auto eo = engine_options(o.engine);
  if (!eo) return fail(eo.error().message);
  auto body = parse_byte_size(o.max_body);
  if (!body) return fail("--max-body: " + body.error().message);
  auto held = parse_byte_size(o.max_request_memory);
  if (!held) return fail("--max-request-memory: " + held.error().message);
  if (*held < *body)
    return fail("--max-request-memory (" + o.max_request_memory +
                ") must be at least --max-body (" + o.max_body + ")");
  auto key = server::resolve_api_key(o.api_key, o.api_key_file);
  if (!key) return fail(key.error().message);
  if (o.role != "colocated" && (o.engine.tp > 1 || o.engine.ep > 1))
    return fail("--role " + o.role + " runs in one process for now (no --tp/--ep)");
  if (o.role == "decode" && o.prefill_peers.empty())
    return fail("--role decode needs --prefill-peer HOST:PORT (the prefill servers' KV ports)");
  if (o.role != "decode" && !o.prefill_peers.empty())
    return fail("--prefill-peer is for --role decode");
  auto created = Engine::create(*eo);
  if (!created) return fail(created.error().message);
  Engine& eng = **created;
  if (eng.rank() != 0) {
    // A follower: rank 0 serves HTTP and decides when to stop (its engine
    // tells the others as it goes). A SIGTERM or SIGINT sent to a follower is
    // ignored so that rank 0's drain can still run its steps.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    auto r = eng.follow();
    return r ? 0 : fail(r.error().message);
  }

  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.api_key = *key;
  so.model_name = o.model_name.empty() ? default_model_name(o.engine.model) : o.model_name;
  so.max_body_bytes = *body;
  so.max_waiting = o.max_waiting;
  so.max_queued_tokens = o.max_queued_tokens;
  so.max_request_bytes = *held;
  so.max_connections = o.max_connections;
  so.max_connections_per_address = o.max_connections_per_address;
  so.header_timeout_seconds = o.header_timeout;
  so.body_timeout_seconds = o.body_timeout;
  so.workers = o.http_workers;
  so.allowed_hosts = o.allowed_hosts;
  so.allowed_origins = o.allowed_origins;
  so.max_logprobs = o.max_logprobs;
  so.shutdown_grace_seconds = o.shutdown_grace;
  if (o.role != "colocated") so.role = o.role;
  so.kv_port = o.kv_port;
  so.prefill_peers = o.prefill_peers;
  so.kv_transport.lease_seconds = o.kv_lease;
  so.kv_transport.transfer_timeout_seconds = o.kv_transfer_timeout;
  so.kv_transport.debug_flip_handoff = o.debug_kv_flip_handoff;
  so.kv_transport.debug_send_pause_seconds = o.debug_kv_send_pause;
  const Tokenizer& tok = eng.tokenizer();
  auto chat = ChatRenderer::create(o.chat_template, eng.chat_template(),
                                   eng.model_config().arch_name,
                                   tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "",
                                   tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "");
  if (!chat && !o.chat_template.empty()) return fail(chat.error().message);
  if (chat) {
    std::fprintf(stderr, "kvant serve: chat prompts use %s\n", chat->description().c_str());
    auto renderer = std::make_shared<const ChatRenderer>(std::move(*chat));
    so.render_chat = [&tok, renderer](const server::ChatInput& c) -> Result<server::RenderedChat> {
      JinjaChatInput in;
      in.messages = c.messages;
      in.tools = c.tools;
      in.variables = c.kwargs;
      in.add_generation_prompt = true;
      auto text = renderer->render(in);
      if (!text) return text.error();
      server::RenderedChat out;
      out.ids = tok.encode(*text, /*add_bos=*/false, /*parse_special=*/true);
      out.starts_in_reasoning = prompt_opens_reasoning(*text);
      out.reasoning_done = prompt_closes_reasoning(*text);
      return out;
    };
    // How the model writes tool calls and reasoning: named, or read from
    // its template.
    const std::string& tt = renderer->template_text();
    if (o.tool_parser == "auto") {
      so.tool_format = detect_tool_format(tt);
    } else {
      auto f = tool_format_from_name(o.tool_parser);
      if (!f) return fail(f.error().message);
      so.tool_format = *f;
    }
    if (o.reasoning_parser == "auto")
      so.reasoning_format = detect_reasoning_format(tt);
    else if (o.reasoning_parser == "think")
      so.reasoning_format = ReasoningFormat::ThinkTags;
    else if (o.reasoning_parser == "none")
      so.reasoning_format = ReasoningFormat::None;
    else
      return fail("--reasoning-parser must be auto, think or none, got '" + o.reasoning_parser + "'");
    std::fprintf(stderr, "kvant serve: tool calls: %s; reasoning: %s\n",
                 so.tool_format == ToolFormat::None ? "none (requests with tools are refused)"
                                                    : std::string(tool_format_name(so.tool_format)).c_str(),
                 so.reasoning_format == ReasoningFormat::ThinkTags ? "<think> tags" : "none");
  } else {
    std::fprintf(stderr, "kvant serve: no chat template (%s); only /v1/completions works\n",
                 chat.error().message.c_str());
  }
  so.on_listening = [&so](const std::string& host, int port) {
    std::fprintf(stderr, "kvant serve: model '%s' on http://%s:%d/v1\n", so.model_name.c_str(),
                 host.c_str(), port);
  };
  return server::run_server(eng, so);
}

}  // namespace

void register_serve(CLI::App& app) {
  static ServeOpts o;
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  add_engine_flags(cmd, o.engine);
  cmd->add_option("--host", o.host, "address to bind (default 127.0.0.1)");
  cmd->add_option("--port", o.port, "TCP port (0 = any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o.api_key,
                  "require 'Authorization: Bearer KEY' on /v1/* and /tokenize (default: "
                  "--api-key-file, else $KVANT_API_KEY); a flag shows in ps, the others do not");
  cmd->add_option("--api-key-file", o.api_key_file, "read the API key from this file's first line");
  cmd->add_option("--allowed-hosts", o.allowed_hosts,
                  "Host header names to answer (default with a loopback --host: loopback names "
                  "only, against DNS rebinding; '*' = any)")
      ->delimiter(',');
  cmd->add_option("--allowed-origins", o.allowed_origins,
                  "web origins (scheme://host[:port]) whose pages may call the API, with CORS; "
                  "loopback origins always may ('*' = any)")
      ->delimiter(',');
  cmd->add_option("--model-name", o.model_name,
                  "model id clients name (default: the model file's name without .gguf)");
  cmd->add_option("--chat-template", o.chat_template,
                  "chat template: a built-in name (chatml, smollm2, gemma, llama3) or a Jinja "
                  "file (default: the model's own template, else the built-in one detected)");
  cmd->add_option("--tool-parser", o.tool_parser,
                  "how the model writes tool calls: auto (from the chat template), hermes, "
                  "qwen3_coder, llama3_json, deepseek_v3, deepseek_v31, kimi_k2, glm45, none");
  cmd->add_option("--reasoning-parser", o.reasoning_parser,
                  "how the model writes reasoning: auto (from the chat template), think "
                  "(<think>...</think> becomes reasoning_content), none");
  cmd->add_option("--max-body", o.max_body, "largest request body, e.g. 32MiB (413 beyond)");
  cmd->add_option("--max-logprobs", o.max_logprobs,
                  "most alternatives per token in completions' logprobs; above 20 only for the "
                  "prompt's tokens (echo, max_tokens 0), e.g. 64 for kvant eval's KL over --url")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--max-waiting", o.max_waiting,
                  "requests waiting for their first token before new ones get 429")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  cmd->add_option("--max-queued-tokens", o.max_queued_tokens,
                  "prompt tokens of waiting requests before new ones get 429 (0 = four times "
                  "the KV cache's token capacity)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  cmd->add_option("--max-request-memory", o.max_request_memory,
                  "bytes all requests together may hold: bodies being read, prompts, echo text "
                  "and room for answers (429 beyond), e.g. 1GiB");
  cmd->add_option("--max-connections", o.max_connections,
                  "open connections; over it the longest-idle one is closed, or with none idle "
                  "the new one gets 503")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--max-connections-per-address", o.max_connections_per_address,
                  "open connections from one client address (same rule)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--header-timeout", o.header_timeout,
                  "seconds for a request's headers to arrive, and a kept-alive connection's idle "
                  "time (408 / close)")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--body-timeout", o.body_timeout,
                  "seconds for a request body to arrive, plus one per 64 KiB of it (408)")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--http-workers", o.http_workers,
                  "threads that parse, render and tokenize request bodies off the I/O thread")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--shutdown-grace", o.shutdown_grace,
                  "seconds in-flight requests get after SIGTERM before they are cancelled")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--role", o.role,
                  "colocated (default), prefill (runs prompts and hands their K/V to decode "
                  "servers) or decode (generates from K/V pulled from prefill servers)")
      ->check(CLI::IsMember({"colocated", "prefill", "decode"}));
  cmd->add_option("--kv-port", o.kv_port,
                  "prefill role: the KV transfer port on --host (0 = any free one; /health shows it)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--prefill-peer", o.prefill_peers,
                  "decode role: a prefill server's KV transfer address HOST:PORT (repeatable); "
                  "checked at start, a different KV layout refuses to start")
      ->delimiter(',');
  cmd->add_option("--kv-lease", o.kv_lease,
                  "prefill role: seconds a handoff's copy waits for the decode side's ack")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--kv-transfer-timeout", o.kv_transfer_timeout,
                  "seconds a transfer may take, the prompt's prefill included")
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--debug-kv-flip-handoff", o.debug_kv_flip_handoff,
                  "debug, prefill role: flip one byte of the Nth handoff's pages in transit")
      ->group("");
  cmd->add_option("--debug-kv-send-pause", o.debug_kv_send_pause,
                  "debug, prefill role: pause this many seconds halfway through each handoff")
      ->group("");
  cmd->callback([] { set_exit_code(run_serve(o)); });
}

}  // namespace kvant::cli
