// Registers every sub-command; callbacks set the process exit code.
#include "cli/commands.h"

namespace kvant::cli {
namespace {
int g_rc = 0;
}
int exit_code() { return g_rc; }
void set_exit_code(int rc) { g_rc = rc; }
void register_all(CLI::App& app) {
  register_inspect(app);
  register_bench(app);
  register_generate(app);
  register_plan(app);
  register_eval_kv(app);
  register_eval_weights(app);
  register_eval(app);
  register_serve(app);
  register_router(app);
  register_quantize(app);
  register_synth(app);
}
}  // namespace kvant::cli
