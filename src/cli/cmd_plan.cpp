// `kvant plan`: KV cache capacity of any Hugging Face config.json in a byte
// budget, per KV dtype and per tensor-parallel rank. Option parsing and
// printing only; the config rules and arithmetic live in engine/kv_plan.
// It loads no weights and does not check that kvant can run the model.
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "dist/shard_plan.h"
#include "model/config.h"
#include "engine/kv_plan.h"
#include "engine/weight_plan.h"
#include "io/json_text.h"

namespace kvant::cli {
namespace {

struct PlanOpts {
  std::string config;
  std::string memory;
  int64_t tp = 1;
  int64_t ep = 1;  // expert-parallel ranks (1, or tp's count: EP over the TP ranks)
  std::string kv_dtype = "all";
  std::string scales = "dynamic";  // the engine's default (docs/FORMATS.md, Scales)
  int64_t page_tokens = 16;
  bool json = false;
  bool mtp = false;  // serve with the first MTP layer (kvant serve --mtp)
  // A deployment: GPUs (tensor-parallel over all of them), each one's memory,
  // and the share kept back for activations, graphs and communication.
  int64_t gpus = 0;
  std::string gpu_memory = "141GB";
  double headroom = 0.12;
};

std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GB (%.1f GiB)", bytes / 1e9, bytes / double(1ull << 30));
  return b;
}

std::string thousands(int64_t v) {
  std::string d = std::to_string(v), out;
  for (size_t i = 0; i < d.size(); ++i) {
    out += d[i];
    const size_t left = d.size() - i - 1;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  return out;
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant plan: %s\n", msg.c_str());
  return 1;
}

// What each rank of `kvant serve --tp TP --ep EP` holds (dist/shard_plan.h):
// checkpoint parameters and their BF16 bytes, per rank. Empty when the
// config is not one kvant loads (the KV plan above still applies).
Result<nlohmann::json> shard_report(const std::string& path, int64_t tp, int64_t ep,
                                    std::string& text) {
  auto c = config_from_hf_json(path);
  if (!c) return c.error();
  const int64_t n = std::max(tp, ep);
  nlohmann::json ranks = nlohmann::json::array();
  const int64_t full = dist::full_weight_params(*c);
  char buf[256];
  std::snprintf(buf, sizeof buf, "\nweights per rank, --tp %lld --ep %lld (shard plan; BF16 bytes):\n",
                (long long)tp, (long long)ep);
  text += buf;
  int64_t sum = 0;
  for (int64_t r = 0; r < n; ++r) {
    auto p = dist::make_shard_plan(*c, int(tp), tp > 1 ? int(r) : 0, int(ep), ep > 1 ? int(r) : 0);
    if (!p) return p.error();
    const int64_t params = dist::shard_weight_params(*c, *p);
    sum += params;
    ranks.push_back({{"rank", r}, {"params", params}, {"bf16_bytes", 2 * params}});
    std::snprintf(buf, sizeof buf, "  rank %lld: %.3fB parameters, %s (%.1f%% of the model)\n",
                  (long long)r, double(params) / 1e9, gb(2.0 * double(params)).c_str(),
                  100.0 * double(params) / double(full));
    text += buf;
  }
  std::snprintf(buf, sizeof buf, "  whole model: %.3fB parameters; over all ranks %.3fB (%.1f%% replicated)\n",
                double(full) / 1e9, double(sum) / 1e9, 100.0 * double(sum - full) / double(full));
  text += buf;
  return nlohmann::json{{"tp", tp}, {"ep", ep}, {"full_params", full}, {"ranks", ranks}};
}

// The KV dtypes, scales, page size and ranks a plan is made for.
Result<KvPlanOptions> kv_plan_options(const PlanOpts& o) {
  KvPlanOptions po;
  po.tp = o.gpus > 0 ? o.gpus : o.tp;
  po.page_tokens = o.page_tokens;
  if (o.kv_dtype == "bf16")
    po.dtypes = {KvDType::kBf16};
  else if (o.kv_dtype == "fp8_e4m3")
    po.dtypes = {KvDType::kFp8E4m3};
  else if (o.kv_dtype == "fp8_e5m2")
    po.dtypes = {KvDType::kFp8E5m2};
  else if (o.kv_dtype != "all")
    return make_error("--kv-dtype must be bf16, fp8_e4m3, fp8_e5m2 or all, got '" + o.kv_dtype + "'");
  if (o.scales == "static")
    po.fp8_scales = KvScaleMode::kStatic;
  else if (o.scales == "dynamic")
    po.fp8_scales = KvScaleMode::kDynamic;
  else
    return make_error("--scales must be static or dynamic, got '" + o.scales + "'");
  return po;
}

// The config's multi-token-prediction layers (num_nextn_predict_layers).
int64_t mtp_layers(const nlohmann::json& cfg) {
  auto it = cfg.find("num_nextn_predict_layers");
  return it != cfg.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// --mtp: the first MTP layer is served, with its K/V in every page.
void serve_first_mtp_layer(KvCacheShape& shape) {
  shape.layers += 1;
  auto& n = shape.notes;
  n.erase(std::remove_if(n.begin(), n.end(),
                         [](const std::string& s) {
                           return s.find("multi-token-prediction") != std::string::npos;
                         }),
          n.end());
  n.push_back("--mtp: the first multi-token-prediction layer is served; its K/V is counted as "
              "one more layer");
}

int run_plan(const PlanOpts& o) {
  if (o.ep > 1 && o.tp > 1 && o.ep != o.tp)
    return fail("--ep runs over the TP ranks: give --ep 1 or --ep " + std::to_string(o.tp));
  if (o.memory.empty() && o.gpus <= 0 && o.tp <= 1 && o.ep <= 1)
    return fail("give --memory (a KV budget per rank), --gpus, or --tp/--ep for the weights per rank");
  auto bytes = parse_byte_size(o.memory.empty() ? "1GiB" : o.memory);
  if (!bytes) return fail(bytes.error().message);
  auto pr = kv_plan_options(o);
  if (!pr) return fail(pr.error().message);
  KvPlanOptions po = *pr;
  po.memory_bytes = *bytes;

  std::error_code ec;
  const std::string path = std::filesystem::is_directory(o.config, ec)
                               ? (std::filesystem::path(o.config) / "config.json").string()
                               : o.config;
  auto cfg = read_json_file(path);
  if (!cfg) return fail(cfg.error().message);
  auto shape = kv_cache_shape_from_config(*cfg);
  if (!shape) return fail(path + ": " + shape.error().message);
  const int64_t nextn = mtp_layers(*cfg);
  if (o.mtp) {
    if (nextn <= 0) return fail(path + ": --mtp: the config has no num_nextn_predict_layers");
    serve_first_mtp_layer(*shape);
  }
  auto plan = make_kv_plan(*shape, po);
  if (!plan) return fail(plan.error().message);
  // Weights (only where the config describes a decoder kvant can size).
  auto weights = weight_plan_from_config(*cfg);
  if (o.gpus <= 0) {
    std::string shard_text;
    nlohmann::json shard;
    if (o.tp > 1 || o.ep > 1) {
      auto s = shard_report(path, o.tp, o.ep, shard_text);
      if (!s) return fail(path + ": " + s.error().message);
      shard = *s;
    }
    if (o.json) {
      auto j = kv_plan_to_json(*plan);
      j["config"] = path;
      if (weights) j["weights"] = weight_plan_to_json(*weights);
      if (!shard.is_null()) j["shard"] = shard;
      std::printf("%s\n", j.dump().c_str());
    } else {
      if (!o.memory.empty()) std::fputs(kv_plan_to_text(*plan).c_str(), stdout);
      std::fputs(shard_text.c_str(), stdout);
    }
    return 0;
  }
  if (!weights) return fail(path + ": " + weights.error().message);
  auto hbm = parse_byte_size(o.gpu_memory);
  if (!hbm) return fail(hbm.error().message);
  if (o.headroom < 0 || o.headroom >= 1) return fail("--headroom must be in [0, 1)");

  // KV bytes per token: per layer and over all layers, one rank.
  KvPlanOptions one = po;
  one.memory_bytes = int64_t(1) << 40;
  one.dtypes = {KvDType::kBf16, KvDType::kFp8E4m3};
  auto per_token = make_kv_plan(*shape, one);
  if (!per_token) return fail(per_token.error().message);
  const double usable = double(*hbm) * (1.0 - o.headroom);
  nlohmann::json jd = nlohmann::json::array();
  std::string text;
  char buf[512];
  const auto& s = shape.value();
  std::snprintf(buf, sizeof buf, "model: %s, %lld layers; %.1fB parameters (%.1fB routed-expert, %.1fB active per token)%s\n",
                (weights->architecture.empty() ? s.architecture : weights->architecture).c_str(),
                (long long)s.layers, double(weights->params_no_mtp) / 1e9,
                double(weights->expert_params) / 1e9, double(weights->active_params) / 1e9,
                weights->params != weights->params_no_mtp ? " without MTP layers" : "");
  text += buf;
  text += "\nKV cache per token (one rank; " + std::string(s.mla ? "MLA latent row, every rank holds it whole" : "KV heads split over ranks") + "):\n";
  for (const auto& r : per_token->rows) {
    std::snprintf(buf, sizeof buf, "  %-9s %-8s %8.1f B per layer  %10s B per token\n",
                  kv_dtype_name(r.dtype), kv_scale_mode_name(r.scales),
                  r.bytes_per_token / double(s.layers),
                  thousands(int64_t(std::llround(r.bytes_per_token))).c_str());
    text += buf;
  }
  // Served: without MTP layers, or with the first one under --mtp.
  auto served = [&](const WeightPolicyBytes& w) {
    return o.mtp ? w.bytes_no_mtp + (w.bytes - w.bytes_no_mtp) / double(nextn) : w.bytes_no_mtp;
  };
  text += o.mtp ? "\nweights (checkpoint, MTP layers included | served, with the first MTP layer):\n"
                : "\nweights (checkpoint, MTP layers included | served, without them):\n";
  for (const auto& w : weights->policies) {
    std::snprintf(buf, sizeof buf, "  %-9s %22s | %22s   %s\n", w.name.c_str(), gb(w.bytes).c_str(),
                  gb(served(w)).c_str(), w.description.c_str());
    text += buf;
  }
  std::snprintf(buf, sizeof buf,
                "\n%lld x %s GPUs, tensor parallel %lld, %.0f%% of each kept as headroom "
                "(activations, graphs, communication): %s usable per GPU\n",
                (long long)o.gpus, gb(double(*hbm)).c_str(), (long long)o.gpus, o.headroom * 100,
                gb(usable).c_str());
  text += buf;
  std::snprintf(buf, sizeof buf, "  %-9s %22s %22s %16s %16s\n", "weights", "per GPU", "KV per GPU",
                "tokens BF16 KV", "tokens FP8 KV");
  text += buf;
  for (const auto& w : weights->policies) {
    const double per_gpu = served(w) / double(o.gpus);
    const double kv = usable - per_gpu;
    nlohmann::json row = {{"weights", w.name}, {"weight_bytes", w.bytes},
                          {"weight_bytes_served", served(w)},
                          {"weight_bytes_per_gpu", per_gpu}, {"kv_bytes_per_gpu", kv}};
    int64_t tok[2] = {0, 0};
    if (kv > 0) {
      KvPlanOptions d = po;
      d.memory_bytes = int64_t(kv);
      d.dtypes = {KvDType::kBf16, KvDType::kFp8E4m3};
      auto kp = make_kv_plan(*shape, d);
      if (!kp) return fail(kp.error().message);
      tok[0] = kp->rows[0].tokens;
      tok[1] = kp->rows[1].tokens;
    }
    row["tokens_bf16_kv"] = tok[0];
    row["tokens_fp8_kv"] = tok[1];
    jd.push_back(row);
    std::snprintf(buf, sizeof buf, "  %-9s %22s %22s %16s %16s\n", w.name.c_str(), gb(per_gpu).c_str(),
                  kv > 0 ? gb(kv).c_str() : "none", thousands(tok[0]).c_str(), thousands(tok[1]).c_str());
    text += buf;
  }
  text += "\ntokens: whole KV pages in (usable - weights per GPU); weights split evenly over the "
          "GPUs (small replicated parts such as MLA's down-projections are not modelled).\n";
  for (const auto& n : weights->notes)
    if (!o.mtp || n.find("multi-token-prediction") == std::string::npos) text += "note: " + n + "\n";
  for (const auto& n : s.notes) text += "note: " + n + "\n";
  if (o.json) {
    nlohmann::json j;
    j["config"] = path;
    j["kv"] = kv_plan_to_json(*per_token);
    j["weights"] = weight_plan_to_json(*weights);
    j["deployment"] = {{"gpus", o.gpus}, {"gpu_memory_bytes", *hbm}, {"headroom", o.headroom},
                       {"usable_bytes_per_gpu", usable}, {"rows", jd}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fputs(text.c_str(), stdout);
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
  cmd->add_option("--memory", o.memory, "KV budget per rank: bytes, or e.g. 2GiB, 512MiB, 80GB");
  cmd->add_option("--gpus", o.gpus,
                  "plan a deployment on this many GPUs (tensor parallel over all): weight bytes "
                  "per precision and the KV tokens left")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--gpu-memory", o.gpu_memory, "memory of each GPU (default 141GB, an H200)");
  cmd->add_option("--headroom", o.headroom,
                  "share of each GPU kept for activations, graphs and communication (default 0.12)");
  cmd->add_option("--tp", o.tp, "tensor-parallel ranks")->check(CLI::Range(1, 4096));
  cmd->add_option("--ep", o.ep, "expert-parallel ranks (1, or the same as --tp)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--kv-dtype", o.kv_dtype, "bf16, fp8_e4m3, fp8_e5m2 or all (default all)");
  cmd->add_option("--scales", o.scales, "FP8 scales: dynamic (the engine's default) or static");
  cmd->add_option("--page-tokens", o.page_tokens, "tokens per KV page")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", o.json, "print one JSON object");
  cmd->add_flag("--mtp", o.mtp,
                "count the first multi-token-prediction layer (weights and K/V), as "
                "kvant serve --mtp serves it");
  cmd->callback([] { set_exit_code(run_plan(o)); });
}

}  // namespace kvant::cli
