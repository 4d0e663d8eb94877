// The distributed side of Engine (engine.h, EngineOptions::comm): the
// followers' loop, and the start-up agreements between ranks (every rank
// loaded, the same model and options, one KV page count).
#include <algorithm>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "engine/engine.h"
#include "kvcache/page_pool.h"
#include "model/model.h"

namespace kvant {

Result<void> Engine::follow() {
  if (!distributed() || rank() == 0)
    return make_error("follow: only ranks other than 0 of a distributed engine follow");
  while (!shutdown_seen_) KV_TRY(step());
  return {};
}

// A digest of what decides every rank's behaviour: the checkpoint's config
// and weight bytes per set, the engine options that steer scheduling and
// numerics, the tokenizer's size. Ranks that differ would issue different
// collectives and hang or compute garbage; they are refused at start.
Result<void> Engine::check_ranks_agree() {
  const ModelConfig& f = model_->full_config();
  const EngineOptions& o = options_;
  std::ostringstream s;
  s << f.arch_name << ' ' << f.vocab << ' ' << f.hidden << ' ' << f.layers << ' ' << f.heads << ' '
    << f.kv_heads << ' ' << f.head_dim << ' ' << f.ffn << ' ' << f.n_experts << ' ' << f.moe_ffn
    << ' ' << f.moe_top_k << ' ' << f.kv_lora_rank << ' ' << f.max_positions << ' '
    << f.rms_eps << ' ' << f.rope.theta << " | " << model_->set_precision(model_->prefill_set())
    << ' ' << model_->set_precision(model_->decode_set()) << ' ' << o.prefill_weights << ' '
    << o.decode_weights << ' ' << o.int4_group << ' ' << o.int4_lm_head << ' ' << o.mtp << ' ' << int(o.kv_dtype)
    << ' ' << int(o.kv_scale_mode) << ' ' << o.page_tokens << ' ' << o.max_step_tokens << ' '
    << o.max_running << ' ' << o.max_context << ' ' << o.prefix_caching << ' '
    << o.prefix_checksums << ' ' << o.integrity_checks << ' ' << o.debug_fault_interval << ' '
    << o.debug_throw_step << ' ' << o.debug_fail_step << ' ' << o.tp << ' ' << o.ep << ' ' << tokenizer_->vocab_size() << ' '
    << capacity_.max_context;
  const std::string text = s.str();
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  dist::Communicator& comm = *options_.comm;
  std::vector<uint64_t> all(size_t(comm.size()));
  KV_TRY(comm.all_gather(std::as_bytes(std::span<const uint64_t>(&h, 1)),
                         std::as_writable_bytes(std::span<uint64_t>(all))));
  for (int r = 1; r < comm.size(); ++r)
    if (all[size_t(r)] != all[0])
      return make_error("engine: rank " + std::to_string(r) + " loaded a different model or runs "
                        "different options than rank 0 (start-up digest " +
                        std::to_string(all[size_t(r)]) + " vs " + std::to_string(all[0]) +
                        "); start every rank with the same model files and flags. This rank's: " +
                        text);
  return {};
}

size_t Engine::weight_bytes() const {
  size_t b = model_->set_bytes(model_->prefill_set());
  if (model_->decode_set() != model_->prefill_set()) b += model_->set_bytes(model_->decode_set());
  return b;
}

// Every rank learns whether every other one loaded, so that one bad file or
// flag ends them all with a message rather than a wait. Ranks load at their
// own pace: this collective gets ten minutes.
Result<void> agree_all_loaded(dist::Communicator& comm, bool loaded) {
  const double steady = comm.timeout();
  comm.set_timeout(std::max(steady, 600.0));
  const uint8_t ok = loaded ? 1 : 0;
  std::vector<uint8_t> all(size_t(comm.size()));
  auto r = comm.all_gather(std::as_bytes(std::span<const uint8_t>(&ok, 1)),
                           std::as_writable_bytes(std::span<uint8_t>(all)));
  comm.set_timeout(steady);
  if (!r) return r.error();
  if (!loaded) return {};  // the caller reports its own error
  for (int q = 0; q < comm.size(); ++q)
    if (!all[size_t(q)])
      return make_error("engine: rank " + std::to_string(q) +
                        " could not load the model (its own message says why)");
  return {};
}

// Every rank schedules alike only with the same page count: the smallest
// rank's (ranks hold different KV heads, and read their own free memory at
// slightly different times). Rebuilds `pool` when this rank's is larger.
Result<void> agree_on_pages(dist::Communicator& comm, PagePoolOptions& po,
                            std::unique_ptr<PagePool>& pool) {
  const int64_t mine = pool->num_pages();
  std::vector<int64_t> all(size_t(comm.size()));
  KV_TRY(comm.all_gather(std::as_bytes(std::span<const int64_t>(&mine, 1)),
                         std::as_writable_bytes(std::span<int64_t>(all))));
  const int64_t least = *std::min_element(all.begin(), all.end());
  if (least == mine) return {};
  po.num_pages = least;
  auto p = PagePool::create(po);
  if (!p) return p.error();
  pool = std::move(*p);
  return {};
}

}  // namespace kvant
