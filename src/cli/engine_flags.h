// The engine flags several sub-commands share (generate, bench, eval-kv,
// serve): model, threads, KV dtype and scales, KV memory, page size,
// scheduling limits. Parsed once into EngineOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/result.h"
#include "engine/engine.h"

namespace kvant::cli {

struct EngineFlags {
  std::string model;
  std::string tokenizer;  // empty: the model's own
  int threads = 0;
  std::string device = "cpu";
  std::string kv_dtype = "bf16";
  std::string kv_scale = "dynamic";
  std::string kv_scales_path;
  std::string kv_memory;  // e.g. 2GiB; empty = a quarter of available memory
  int page_tokens = 16;
  int max_step_tokens = 512;
  int max_running = 64;
  int ctx = 0;
  bool no_prefix_cache = false;
  bool no_integrity = false;
  bool prefix_checksums = false;
  bool debug_invariants = false;
  int debug_inject_faults = 0;
  int64_t debug_throw_step = 0;
  int64_t debug_fail_step = 0;
  std::string prefill_weights = "native", decode_weights = "native";
  int int4_group = 128;
  bool int4_lm_head = false;
  bool mtp = false;
  // Under mpirun: tensor / expert parallelism over its processes, and how
  // long a collective may wait for a peer before every rank stops.
  int tp = 1, ep = 1;
  double dist_timeout = 30;
};

// `with_model` false when the command registers -m itself.
void add_engine_flags(CLI::App* cmd, EngineFlags& f, bool with_model = true);
Result<KvDType> parse_kv_dtype(const std::string& s);
Result<KvScaleMode> parse_kv_scale(const std::string& s);
Result<EngineOptions> engine_options(const EngineFlags& f);

}  // namespace kvant::cli
