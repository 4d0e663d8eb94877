// `kvant plan`: KV cache capacity of any Hugging Face config.json in a byte
// budget, per KV dtype and per tensor-parallel rank. Option parsing and
// printing only; the config rules and arithmetic live in engine/kv_plan.
// It loads no weights and does not check that kvant can run the model.
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "engine/kv_plan.h"
#include "io/json_text.h"

namespace kvant::cli {
namespace {

struct PlanOpts {
  std::string config;
  std::string memory;
  int64_t tp = 1;
  std::string kv_dtype = "all";
  std::string scales = "dynamic";  // the engine's default (docs/FORMATS.md, Scales)
  int64_t page_tokens = 16;
  bool json = false;
};

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant plan: %s\n", msg.c_str());
  return 1;
}

int run_plan(const PlanOpts& o) {
  auto bytes = parse_byte_size(o.memory);
  if (!bytes) return fail(bytes.error().message);
  KvPlanOptions po;
  po.memory_bytes = *bytes;
  po.tp = o.tp;
  po.page_tokens = o.page_tokens;
  if (o.kv_dtype == "bf16")
    po.dtypes = {KvDType::kBf16};
  else if (o.kv_dtype == "fp8_e4m3")
    po.dtypes = {KvDType::kFp8E4m3};
  else if (o.kv_dtype == "fp8_e5m2")
    po.dtypes = {KvDType::kFp8E5m2};
  else if (o.kv_dtype != "all")
    return fail("--kv-dtype must be bf16, fp8_e4m3, fp8_e5m2 or all, got '" + o.kv_dtype + "'");
  if (o.scales == "static")
    po.fp8_scales = KvScaleMode::kStatic;
  else if (o.scales == "dynamic")
    po.fp8_scales = KvScaleMode::kDynamic;
  else
    return fail("--scales must be static or dynamic, got '" + o.scales + "'");

  std::error_code ec;
  const std::string path = std::filesystem::is_directory(o.config, ec)
                               ? (std::filesystem::path(o.config) / "config.json").string()
                               : o.config;
  auto cfg = read_json_file(path);
  if (!cfg) return fail(cfg.error().message);
  auto shape = kv_cache_shape_from_config(*cfg);
  if (!shape) return fail(path + ": " + shape.error().message);
  auto plan = make_kv_plan(*shape, po);
  if (!plan) return fail(plan.error().message);
  if (o.json) {
    auto j = kv_plan_to_json(*plan);
    j["config"] = path;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fputs(kv_plan_to_text(*plan).c_str(), stdout);
  }
  return 0;
}

}  // namespace

void register_plan(CLI::App& app) {
  static PlanOpts o;
  auto* cmd =
      app.add_subcommand("plan", "KV cache capacity of a Hugging Face config in a memory budget");
  cmd->add_option("-c,--config", o.config,
                  "config.json (or its directory) of any Hugging Face model")
      ->required();
  cmd->add_option("--memory", o.memory, "KV budget per rank: bytes, or e.g. 2GiB, 512MiB, 80GB")
      ->required();
  cmd->add_option("--tp", o.tp, "tensor-parallel ranks")->check(CLI::Range(1, 4096));
  cmd->add_option("--kv-dtype", o.kv_dtype, "bf16, fp8_e4m3, fp8_e5m2 or all (default all)");
  cmd->add_option("--scales", o.scales, "FP8 scales: dynamic (the engine's default) or static");
  cmd->add_option("--page-tokens", o.page_tokens, "tokens per KV page")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", o.json, "print one JSON object");
  cmd->callback([] { set_exit_code(run_plan(o)); });
}

}  // namespace kvant::cli
