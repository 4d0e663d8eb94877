// Sub-command registry for the kvant binary.
#pragma once

#include <CLI/CLI.hpp>

namespace kvant::cli {
void register_all(CLI::App& app);
int exit_code();
void set_exit_code(int rc);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
void register_generate(CLI::App& app);
void register_plan(CLI::App& app);
void register_eval_kv(CLI::App& app);
void register_eval_weights(CLI::App& app);
void register_eval(CLI::App& app);
void register_serve(CLI::App& app);
void register_router(CLI::App& app);
void register_quantize(CLI::App& app);
void register_synth(CLI::App& app);
void register_bench_serve(CLI::App& bench);  // `kvant bench serve`, under bench
}  // namespace kvant::cli
