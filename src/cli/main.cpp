// kvant command line: one binary, sub-commands. Each sub-command lives in its
// own file (cmd_*.cpp) and registers here.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvant: LLM inference for memory-bound serving"};
  app.require_subcommand(1);
  kvant::cli::register_all(app);
  CLI11_PARSE(app, argc, argv);
  return kvant::cli::exit_code();
}
