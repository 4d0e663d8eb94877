#include "cli/engine_flags.h"

#include <algorithm>

#include "dist/communicator.h"

#include "engine/kv_plan.h"

namespace kvant::cli {

void add_engine_flags(CLI::App* cmd, EngineFlags& f, bool with_model) {
  if (with_model)
    cmd->add_option("-m,--model", f.model, "GGUF file or Hugging Face directory")->required();
  cmd->add_option("--tokenizer", f.tokenizer,
                  "the tokenizer of another GGUF file or directory (default: the model's own)");
  cmd->add_option("-t,--threads", f.threads, "worker threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--device", f.device,
                  "where the model computes: cpu, or cuda (a CUDA build on a machine with an "
                  "NVIDIA GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--prefill-weights", f.prefill_weights,
                  "weights for prefill chunks: native (the checkpoint's), bf16, fp8 (e4m3, "
                  "128x128 block scales) or int4")
      ->check(CLI::IsMember({"native", "bf16", "fp8", "int4"}));
  cmd->add_option("--decode-weights", f.decode_weights,
                  "weights for decode steps: native, bf16, fp8 or int4 (both sets stay "
                  "resident when they differ)")
      ->check(CLI::IsMember({"native", "bf16", "fp8", "int4"}));
  cmd->add_option("--int4-group", f.int4_group,
                  "group size when a BF16/GGUF checkpoint is quantized to INT4 at load")
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_flag("--int4-lm-head", f.int4_lm_head,
                "also quantize the output projection when quantizing at load");
  cmd->add_flag("--mtp", f.mtp,
                "load the checkpoint's multi-token-prediction layer (DeepSeek-V3, GLM-4.5) and "
                "keep its KV, so that requests may draft with it (speculative method mtp)");
  cmd->add_option("--kv-dtype", f.kv_dtype, "KV cache dtype: bf16, fp8_e4m3, fp8_e5m2");
  cmd->add_option("--kv-scale", f.kv_scale,
                  "FP8 KV scales: dynamic (per token and head, in the page) or static "
                  "(per layer and head, from kvant calibrate-kv)");
  cmd->add_option("--kv-scales", f.kv_scales_path,
                  "static KV scales file (default: <model>.kv_scales.json)");
  cmd->add_option("--kv-memory", f.kv_memory,
                  "KV cache budget, e.g. 2GiB (default: 25% of available memory)");
  cmd->add_option("--page-tokens", f.page_tokens, "tokens per KV page")->check(CLI::Range(1, 4096));
  cmd->add_option("--max-step-tokens", f.max_step_tokens,
                  "tokens per forward step (prefill chunk budget)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-running", f.max_running, "requests running at once")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("-c,--ctx", f.ctx, "context limit (default: the model's)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_flag("--no-prefix-cache", f.no_prefix_cache,
                "do not share prompt prefixes between requests");
  cmd->add_flag("--no-integrity", f.no_integrity,
                "skip the per-step KV integrity pass (to measure its cost)");
  cmd->add_flag("--prefix-checksums", f.prefix_checksums,
                "XXH3 checksums of shared pages, checked on reuse");
  cmd->add_flag("--debug-invariants", f.debug_invariants,
                "check page pool, tables and prefix index invariants after every step (slow)");
  cmd->add_option("--debug-inject-faults", f.debug_inject_faults,
                  "debug: every N steps free a running request's page behind its back (0 = off)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--tp", f.tp,
                  "tensor-parallel ranks: 1, or the process count under mpirun -np N")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--ep", f.ep,
                  "expert-parallel ranks: 1, or the process count under mpirun -np N "
                  "(with --tp N too, experts split over the TP ranks)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--dist-timeout", f.dist_timeout,
                  "seconds a collective waits for a peer rank before every rank stops with a "
                  "message (0 = for ever)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--debug-throw-step", f.debug_throw_step,
                  "debug: step N throws out of memory inside its forward (0 = off)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  cmd->add_option("--debug-fail-step", f.debug_fail_step,
                  "debug: step N fails the whole engine, as a dead peer rank does (0 = off)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
}

Result<KvDType> parse_kv_dtype(const std::string& s) {
  if (s == "bf16") return KvDType::kBf16;
  if (s == "fp8_e4m3" || s == "fp8" || s == "e4m3") return KvDType::kFp8E4m3;
  if (s == "fp8_e5m2" || s == "e5m2") return KvDType::kFp8E5m2;
  return make_error("--kv-dtype must be bf16, fp8_e4m3 or fp8_e5m2, got '" + s + "'");
}

Result<KvScaleMode> parse_kv_scale(const std::string& s) {
  if (s == "dynamic") return KvScaleMode::kDynamic;
  if (s == "static") return KvScaleMode::kStatic;
  return make_error("--kv-scale must be static or dynamic, got '" + s + "'");
}

// The job's communicator, made on first use and kept for the life of the
// process: MPI starts once and cannot start again once it has finalised,
// and a command may make several engines one after another (bench's
// configurations, eval's scorer and generation engine).
Result<std::shared_ptr<dist::Communicator>> world_communicator() {
  static std::shared_ptr<dist::Communicator> world;
  if (!world) {
    auto c = dist::make_communicator("mpi");
    if (!c) return c.error();
    world = std::move(*c);
  }
  return world;
}

Result<EngineOptions> engine_options(const EngineFlags& f) {
  EngineOptions o;
  o.model_path = f.model;
  o.tokenizer_path = f.tokenizer;
  o.threads = f.threads;
  o.device = f.device;
  o.prefill_weights = f.prefill_weights;
  o.decode_weights = f.decode_weights;
  o.int4_group = f.int4_group;
  o.int4_lm_head = f.int4_lm_head;
  o.mtp = f.mtp;
  auto d = parse_kv_dtype(f.kv_dtype);
  if (!d) return d.error();
  o.kv_dtype = *d;
  auto sm = parse_kv_scale(f.kv_scale);
  if (!sm) return sm.error();
  o.kv_scale_mode = *sm;
  o.kv_scales_path = f.kv_scales_path;
  if (!f.kv_memory.empty()) {
    auto b = parse_byte_size(f.kv_memory);
    if (!b) return make_error("--kv-memory: " + b.error().message);
    o.kv_memory_bytes = *b;
  }
  o.page_tokens = f.page_tokens;
  o.max_step_tokens = f.max_step_tokens;
  o.max_running = f.max_running;
  o.max_context = f.ctx;
  o.prefix_caching = !f.no_prefix_cache;
  o.integrity_checks = !f.no_integrity;
  o.prefix_checksums = f.prefix_checksums;
  o.debug_invariants = f.debug_invariants;
  o.debug_fault_interval = f.debug_inject_faults;
  o.debug_throw_step = f.debug_throw_step;
  o.debug_fail_step = f.debug_fail_step;
  o.tp = f.tp;
  o.ep = f.ep;
  const bool mpi = dist::launched_by_mpirun();
  if (mpi || f.tp > 1 || f.ep > 1) {
    if (!mpi)
      return make_error("--tp " + std::to_string(f.tp) + " --ep " + std::to_string(f.ep) +
                        " runs one process per rank: start it with mpirun -np " +
                        std::to_string(std::max(f.tp, f.ep)) + " (README: Running on several processes)");
    auto comm = world_communicator();
    if (!comm) return comm.error();
    const int n = (*comm)->size();
    if (n > 1 && f.tp == 1 && f.ep == 1)
      return make_error("mpirun started " + std::to_string(n) +
                        " processes, but neither --tp nor --ep is " + std::to_string(n) +
                        ": each process would serve the whole model alone");
    (*comm)->set_timeout(f.dist_timeout);
    o.comm = *comm;
    if (o.comm->rank() != 0) o.log_capacity = false;
  }
  return o;
}

}  // namespace kvant::cli
