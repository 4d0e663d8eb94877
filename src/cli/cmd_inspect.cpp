// `kvant inspect FILE.gguf`: prints metadata and the tensor directory.
#include <cstdio>

#include "cli/commands.h"
#include "io/gguf.h"

namespace kvant::cli {

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensors");
  static std::string path;
  static bool all = false;
  cmd->add_option("file", path, "GGUF file")->required();
  cmd->add_flag("--all", all, "print long arrays in full");
  cmd->callback([] {
    auto g = GgufFile::open(path);
    if (!g) { std::fprintf(stderr, "kvant: %s\n", g.error().message.c_str()); set_exit_code(1); return; }
    std::printf("GGUF v%u, %zu metadata entries, %zu tensors\n", g->version(), g->metadata().size(), g->tensors().size());
    for (auto& [k, v] : g->metadata()) {
      if (v.is_array()) {
        size_t n = v.strs.size() + v.nums.size();
        std::printf("  %s = array[%zu]", k.c_str(), n);
        for (size_t i = 0; i < n && (all || i < 4); ++i) {
          if (!v.strs.empty()) std::printf(" '%s'", v.strs[i].c_str()); else std::printf(" %g", v.nums[i]);
        }
        std::printf("\n");
      } else if (v.is_string()) {
        std::string s = v.s.size() > 200 && !all ? v.s.substr(0, 200) + "..." : v.s;
        std::printf("  %s = \"%s\"\n", k.c_str(), s.c_str());
      } else {
        std::printf("  %s = %g\n", k.c_str(), v.as_double());
      }
    }
    for (auto& t : g->tensors()) {
      std::printf("  %-40s %-6s [", t.name.c_str(), dtype_name(t.dtype));
      for (size_t i = 0; i < t.shape.size(); ++i) std::printf(i ? ", %lld" : "%lld", (long long)t.shape[i]);
      std::printf("] @%llu\n", (unsigned long long)t.offset);
    }
  });
}

}  // namespace kvant::cli
