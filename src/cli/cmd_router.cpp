// kvant router: one OpenAI-compatible endpoint in front of prefill and
// decode servers (router/router.h).
#include "cli/commands.h"
#include "router/router.h"

namespace kvant::cli {

void register_router(CLI::App& app) {
  static router::RouterOptions o;
  auto* cmd = app.add_subcommand(
      "router", "OpenAI-compatible endpoint in front of prefill and decode servers");
  cmd->add_option("--host", o.host, "address to bind (default 127.0.0.1)");
  cmd->add_option("--port", o.port, "TCP port (0 = any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--prefill", o.prefill,
                  "a prefill server's HTTP address, http://HOST:PORT (kvant serve --role prefill; "
                  "repeatable)")
      ->required()
      ->delimiter(',');
  cmd->add_option("--decode", o.decode,
                  "a decode server's HTTP address (kvant serve --role decode; repeatable)")
      ->required()
      ->delimiter(',');
  cmd->add_option("--policy", o.policy,
                  "how a server is picked per request: round-robin or least-loaded (fewest "
                  "requests in flight through this router)")
      ->check(CLI::IsMember({"round-robin", "least-loaded"}));
  cmd->add_option("--startup-wait", o.startup_wait_seconds,
                  "seconds to wait for every server to answer /health at start")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--timeout", o.timeout_seconds, "seconds a forwarded request may take")
      ->check(CLI::Range(1.0, 86400.0));
  cmd->callback([] { set_exit_code(router::run_router(o)); });
}

}  // namespace kvant::cli
