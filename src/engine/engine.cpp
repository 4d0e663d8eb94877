// The engine loop (see engine.h): scheduler -> integrity pass -> batched
// forward -> sampling and stop logic -> events -> commit.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "core/threads.h"
#include "dist/communicator.h"
#include "engine/engine_internal.h"
#include "engine/model_runner.h"
#include "engine/request_codec.h"
#include "engine/scheduler.h"
#include "engine/weight_options.h"
#include "io/gguf.h"
#include "io/model_files.h"
#include "kvcache/fault_injector.h"
#include "kvcache/kv_verifier.h"
#include "kvcache/page_pool.h"
#include "kvcache/prefix_index.h"
#include "model/model.h"

namespace kvant {

// engine_dist.cpp
Result<void> agree_all_loaded(dist::Communicator& comm, bool loaded);
Result<void> agree_on_pages(dist::Communicator& comm, PagePoolOptions& po,
                            std::unique_ptr<PagePool>& pool);

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

std::string fmt_bytes(double b) {
  char buf[64];
  if (b >= double(int64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t(1) << 30));
  else if (b >= double(1 << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

}  // namespace

std::string describe(const KvCapacity& c) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "KV cache: %s%s%s, %" PRId64 " pages of %" PRId64 " tokens = %" PRId64
                " tokens in %s (%.1f bytes/token); max context %" PRId64,
                kv_dtype_name(c.dtype), c.scale_mode == KvScaleMode::kNone ? "" : " ",
                c.scale_mode == KvScaleMode::kNone ? "" : kv_scale_mode_name(c.scale_mode), c.pages,
                c.page_tokens, c.tokens, fmt_bytes(double(c.arena_bytes)).c_str(),
                c.bytes_per_token, c.max_context);
  return buf;
}

// ---------------------------------------------------------------------------

Engine::~Engine() {
  // Rank 0 of a distributed engine tells the followers to stop.
  if (distributed() && rank() == 0 && !shutdown_seen_) {
    std::vector<std::unique_ptr<Req>> none;
    std::vector<RequestId> no_cancels;
    shutdown_seen_ = true;
    auto r = exchange_inputs(none, no_cancels);
    if (!r) std::fprintf(stderr, "kvant: telling the other ranks to stop: %s\n", r.error().message.c_str());
  }
  // Sequences release their pages in the scheduler's destructor, which must
  // run before the index and the pool go.
  scheduler_.reset();
  index_.reset();
}

const ModelConfig& Engine::model_config() const { return model_->config(); }

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& o) {
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = o;
  e->impl_ = std::make_unique<Impl>();
  if (o.threads > 0) set_num_threads(o.threads);
  if (o.page_tokens <= 0 || o.page_tokens > 4096)
    return make_error("engine: page size must be in [1, 4096] tokens, got " +
                      std::to_string(o.page_tokens));
  if (o.max_step_tokens <= 0 || o.max_running <= 0)
    return make_error("engine: max_step_tokens and max_running must be positive");
  if (auto p = check_parallelism({o.comm.get(), o.tp, o.ep}); !p)
    return make_error("engine: " + p.error().message);

  // Load on a thread of its own. Its OpenMP workers go away with it, so the
  // caller's thread keeps no idle team: a server that creates the engine on
  // its I/O thread and steps it on another saw decode take twice as long on
  // two cores while such a team existed (see docs/BENCHMARKS.md, Serving).
  auto wo = parse_weight_options(o.prefill_weights, o.decode_weights, o.int4_group,
                                 o.int4_lm_head);
  if (!wo) return wo.error();
  wo->backend = o.device;
  wo->mtp = o.mtp;
  // The model path is opened once: the config, every weight set and the
  // tokenizer come from the same files.
  Result<std::unique_ptr<Model>> m = make_error("engine: model not loaded");
  std::shared_ptr<const ModelFiles> files;
  std::thread loader([&] {
    if (o.threads > 0) set_num_threads(o.threads);
    auto f = ModelFiles::open(o.model_path);
    if (!f) {
      m = f.error();
      return;
    }
    files = *f;
    Parallelism par;
    par.comm = o.comm.get();
    par.tp = o.tp;
    par.ep = o.ep;
    m = Model::load(*files, *wo, par);
  });
  loader.join();
  if (e->distributed()) KV_TRY(agree_all_loaded(*o.comm, bool(m)));
  if (!m) return m.error();
  e->model_ = std::move(*m);
  auto t = o.tokenizer_path.empty() ? load_tokenizer(*files, &e->chat_template_)
                                    : load_tokenizer_for(o.tokenizer_path, &e->chat_template_);
  if (!t) return t.error();
  e->tokenizer_ = std::move(*t);
  const ModelConfig& c = e->model_->config();

  KvGeometry g;
  g.layers = c.kv_layers();
  g.kv_heads = c.cache_heads();
  g.head_dim = c.cache_dim();
  g.shared_kv = c.mla();
  g.index_dim = c.index_topk > 0 ? c.index_head_dim : 0;
  g.dtype = o.kv_dtype;
  g.page_tokens = o.page_tokens;
  g.scale_mode = o.kv_dtype == KvDType::kBf16 ? KvScaleMode::kNone : o.kv_scale_mode;
  if (o.kv_dtype != KvDType::kBf16 && g.scale_mode == KvScaleMode::kNone)
    return make_error("engine: FP8 KV needs a scale mode (static or dynamic)");
  PagePoolOptions po;
  po.geometry = g;
  if (g.scale_mode == KvScaleMode::kStatic) {
    const std::string path =
        o.kv_scales_path.empty() ? default_kv_scales_path(o.model_path) : o.kv_scales_path;
    auto s = load_kv_scales(path);
    if (!s)
      return make_error(s.error().message +
                        " (static FP8 KV scales come from `kvant calibrate-kv -m " + o.model_path +
                        "`; or use --kv-scale dynamic)");
    // This rank's KV heads of every layer (all of them in one process).
    const dist::Range held = e->model_->shard().kv_heads;
    auto sc = static_kv_scales(*s, path, c.layers, e->model_->full_config().cache_heads(),
                               held.begin, held.end, o.kv_dtype);
    if (!sc) return make_error("engine: " + sc.error().message);
    // The MTP layer (drafts only) takes the last main layer's scales.
    const size_t per_layer = size_t(held.end - held.begin);
    for (int64_t k = 0; k < c.mtp_layers; ++k)
      for (auto* v : {&sc->k, &sc->v}) {
        const std::vector<float> last(v->end() - std::ptrdiff_t(per_layer), v->end());
        v->insert(v->end(), last.begin(), last.end());
      }
    po.static_k_scales = std::move(sc->k);
    po.static_v_scales = std::move(sc->v);
  }
  int64_t budget = o.kv_memory_bytes;
  backend::Backend& be = e->model_->backend();
  po.arena = backend::kv_arena(be);
  if (budget <= 0) {
    const int64_t avail = be.free_memory() >= 0 ? be.free_memory() : mem_available_bytes();
    if (avail <= 0)
      return make_error("engine: cannot read MemAvailable; give the KV budget explicitly");
    budget = int64_t(double(avail) * o.kv_memory_fraction);
  }
  po.memory_bytes = budget;
  auto pool = PagePool::create(po);
  if (!pool) return pool.error();
  if (e->distributed()) KV_TRY(agree_on_pages(*o.comm, po, *pool));
  e->pool_ = std::move(*pool);
  if (o.prefix_caching) {
    PrefixIndexOptions io;
    io.verify_checksums = o.prefix_checksums;
    e->index_ = std::make_unique<PrefixIndex>(*e->pool_, io);
  }
  SchedulerOptions so;
  so.max_step_tokens = o.max_step_tokens;
  so.max_running = o.max_running;
  e->scheduler_ = std::make_unique<Scheduler>(*e->pool_, e->index_.get(), so);
  e->layout_hash_ = ::kvant::kv_layout_hash(*e->pool_);
  e->impl_->verifier = std::make_unique<KvVerifier>(*e->pool_);

  e->impl_->format = kv_format(e->pool_->layout(), po.static_k_scales, po.static_v_scales);

  KvCapacity& cap = e->capacity_;
  cap.dtype = g.dtype;
  cap.scale_mode = g.scale_mode;
  cap.page_tokens = g.page_tokens;
  cap.pages = e->pool_->num_pages();
  cap.tokens = e->pool_->capacity_tokens();
  cap.arena_bytes = e->pool_->arena_bytes();
  cap.bytes_per_token = e->pool_->bytes_per_token();
  int64_t ctx = c.max_positions > 0 ? c.max_positions : cap.tokens;
  if (o.max_context > 0) ctx = std::min(ctx, o.max_context);
  cap.max_context = std::min(ctx, cap.tokens);
  // The workspace for the largest step, planned now so that steps allocate nothing.
  e->model_->reserve(o.max_step_tokens, cap.max_context);
  if (e->distributed()) KV_TRY(e->check_ranks_agree());
  if (o.log_capacity) std::fprintf(stderr, "kvant: %s\n", describe(cap).c_str());
  if (o.log_capacity) {
    const Model& M = *e->model_;
    auto set = [&](int i) {
      return M.set_precision(i) + " (" + std::to_string(M.set_bytes(i) >> 20) + " MiB)";
    };
    std::fprintf(stderr, "kvant: weights: prefill %s, decode %s%s\n", set(M.prefill_set()).c_str(),
                 set(M.decode_set()).c_str(),
                 M.prefill_set() == M.decode_set() ? " (one set)" : " (both resident)");
  }
  return e;
}

// Every request's checks and clamps (submit, submit_handoff).
Result<void> Engine::check_request(Request& r) const {
  const ModelConfig& c = model_->config();
  if (r.prompt.empty()) return make_error("the prompt is empty");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= c.vocab)
      return make_error("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                        std::to_string(c.vocab) + ")");
  const int64_t n = int64_t(r.prompt.size());
  if (n >= capacity_.max_context)
    return make_error("the prompt has " + std::to_string(n) + " tokens; the context holds " +
                      std::to_string(capacity_.max_context) +
                      " (prompt plus at least one generated token)");
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > c.vocab)
    return make_error("prompt_logprobs must be in [-1, " + std::to_string(c.vocab) + "], got " +
                      std::to_string(r.prompt_logprobs));
  if (r.prompt_logprobs >= 0 && (r.prompt_logprobs_from < 1 || r.prompt_logprobs_from > n))
    return make_error("prompt_logprobs_from must be in [1, " + std::to_string(n) +
                      "] (the prompt's length), got " + std::to_string(r.prompt_logprobs_from));
  KV_TRY(check_sampling_params(r.sampling));
  if (r.constraint && distributed())
    return make_error(
        "structured output and forced tool calls are not available with tensor or expert "
        "parallelism");
  KV_TRY(check_speculative_params(r.speculative));
  if (r.speculative.method == SpecMethod::kMtp && r.speculative.num_tokens > 0 && c.mtp_layers == 0)
    return make_error(
        "speculative method mtp needs the model's multi-token-prediction layer: this engine "
        "runs without one (start it with --mtp on a checkpoint with num_nextn_predict_layers)");
  for (const auto& [t, b] : r.sampling.logit_bias)
    if (t >= c.vocab)
      return make_error("logit_bias token id " + std::to_string(t) +
                        " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  KV_TRY(check_stop_params(r.stop));
  const int64_t room = capacity_.max_context - n;
  if (r.stop.max_tokens <= 0 || r.stop.max_tokens > room) r.stop.max_tokens = int32_t(room);
  if (r.handoff) {
    if (r.prompt_only) return make_error("a handoff request generates its first token; not prompt_only");
    r.stop.max_tokens = 1;
  }
  return {};
}

RequestId Engine::enqueue(Request r, std::shared_ptr<const KvHandoff> handoff_in) {
  const int64_t n = int64_t(r.prompt.size());
  auto req = std::make_unique<Req>(std::move(r), *tokenizer_);
  req->id = next_id_.fetch_add(1);
  req->prompt_tokens = n;
  req->handoff_in = std::move(handoff_in);
  const RequestId id = req->id;
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    inbox_.push_back(std::move(req));
    pending_.fetch_add(1);
  }
  return id;
}

Result<RequestId> Engine::submit(Request r) {
  KV_TRY(check_request(r));
  return enqueue(std::move(r), nullptr);
}

void Engine::cancel(RequestId id) {
  std::lock_guard<std::mutex> lk(inbox_mu_);
  cancels_.push_back(id);
}

bool Engine::idle() const { return pending_.load() == 0; }

uint64_t Engine::sequence_of(RequestId id) const {
  auto it = impl_->reqs.find(id);
  return it == impl_->reqs.end() ? 0 : it->second->seq;
}

void Engine::emit(Req& r, int32_t token, std::string_view text, const StepLogprobs* lp,
                  FinishReason finish, std::string_view error, ErrorCode code) {
  if (!r.request.on_event) return;
  RequestEvent ev;
  ev.id = r.id;
  ev.token = token;
  ev.text = text;
  ev.logprobs = lp;
  if (r.request.prompt_logprobs >= 0 && !r.plp_sent && r.plp.complete()) {
    ev.prompt_logprobs = &r.plp;
    r.plp_sent = true;
  }
  ev.finish = finish;
  ev.error = error;
  ev.error_code = finish == FinishReason::Error ? code : ErrorCode::kNone;
  ev.prompt_tokens = r.prompt_tokens;
  ev.completion_tokens = r.completion_tokens;
  ev.cached_tokens = std::max<int64_t>(0, r.cached_tokens);
  if (finish != FinishReason::None) ev.handoff = r.handoff_out.get();
  r.request.on_event(ev);
}

// Ends a request: the scheduler returns its pages (when it still has the
// sequence), held-back text goes out with the final event, and it is gone.
void Engine::finish_request(Req& r, FinishReason reason, std::string_view error,
                            bool in_scheduler, ErrorCode code) {
  if (r.done) return;
  r.done = true;
  if (in_scheduler && scheduler_->find(r.seq) != nullptr) (void)scheduler_->finish(r.seq, reason);
  auto st = r.stop.finish(reason);
  const FinishReason fr =
      r.stop.finish_reason() != FinishReason::None ? r.stop.finish_reason() : reason;
  emit(r, -1, st.text, nullptr, fr, error, code);
  auto& S = impl_->stats;
  ++S.requests_finished;
  if (fr == FinishReason::Abort) ++S.requests_aborted;
  if (fr == FinishReason::Error) ++S.requests_failed;
  impl_->by_seq.erase(r.seq);
  pending_.fetch_sub(1);
}

bool Engine::distributed() const { return options_.comm && options_.comm->size() > 1; }
int Engine::rank() const { return options_.comm ? options_.comm->rank() : 0; }
int Engine::ranks() const { return options_.comm ? options_.comm->size() : 1; }

// Rank 0: one message per step, its size (8 bytes) then the encoded inputs,
// both broadcast. Others: the same, received, turned into requests as
// submit() made them on rank 0 (same ids, same clamped limits).
Result<void> Engine::exchange_inputs(std::vector<std::unique_ptr<Req>>& fresh,
                                     std::vector<RequestId>& cancels) {
  dist::Communicator& comm = *options_.comm;
  std::vector<std::byte> bytes;
  uint64_t size = 0;
  if (comm.rank() == 0) {
    StepInputs in;
    in.seq = ++input_seq_;
    in.shutdown = shutdown_seen_;
    for (const auto& r : fresh) {
      Request copy = r->request;
      copy.on_event = nullptr;
      in.submitted.emplace_back(r->id, std::move(copy));
    }
    in.cancelled = cancels;
    bytes = encode_step_inputs(in);
    size = bytes.size();
  }
  KV_TRY(comm.broadcast(std::as_writable_bytes(std::span<uint64_t>(&size, 1)), 0));
  bytes.resize(size_t(size));
  KV_TRY(comm.broadcast(bytes, 0));
  if (comm.rank() == 0) return {};
  auto in = decode_step_inputs(bytes);
  if (!in) return make_error("rank " + std::to_string(comm.rank()) + ": rank 0's step inputs: " +
                             in.error().message);
  if (in->seq != ++input_seq_)
    return make_error("rank " + std::to_string(comm.rank()) + ": step inputs " +
                      std::to_string(in->seq) + " arrived where " + std::to_string(input_seq_) +
                      " was due");
  if (in->shutdown) {
    shutdown_seen_ = true;
    return {};
  }
  for (auto& [id, r] : in->submitted) {
    const int64_t n = int64_t(r.prompt.size());
    auto req = std::make_unique<Req>(std::move(r), *tokenizer_);
    req->id = id;
    req->prompt_tokens = n;
    pending_.fetch_add(1);
    fresh.push_back(std::move(req));
  }
  cancels = std::move(in->cancelled);
  return {};
}

Result<void> Engine::admit_inbox() {
  std::vector<std::unique_ptr<Req>> fresh;
  std::vector<RequestId> cancels;
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    fresh.swap(inbox_);
    cancels.swap(cancels_);
  }
  if (distributed()) {
    // A rank that cannot exchange its step inputs leaves the others waiting
    // in this step's collectives: every rank stops, with the reason.
    if (auto x = exchange_inputs(fresh, cancels); !x) {
      std::fprintf(stderr, "kvant: rank %d of %d: %s; stopping every rank\n", rank(), ranks(),
                   x.error().message.c_str());
      std::fflush(stderr);
      options_.comm->abort(3);
    }
    if (shutdown_seen_) return {};
  }
  auto& I = *impl_;
  for (auto& rp : fresh) {
    Req& r = *rp;
    if (r.handoff_in) {  // started by admit_imports when it has pages
      I.pending_imports.push_back(r.id);
      I.reqs.emplace(r.id, std::move(rp));
      continue;
    }
    if (r.request.sampling.seed == 0) {
      // A seed of the engine's own, fixed at admission, so the request's
      // stream never depends on what runs beside it.
      std::seed_seq ss{uint32_t(r.id), uint32_t(r.id >> 32), uint32_t(++I.seed_counter), 0x6b76u};
      uint32_t v[2];
      ss.generate(v, v + 2);
      r.request.sampling.seed = (uint64_t(v[0]) << 32 | v[1]) | 1;
      r.sampler = Sampler(r.request.sampling);
    }
    r.sampler.set_prompt(r.request.prompt, r.request.stop.max_tokens);
    SequenceRequest sr;
    sr.prompt = r.request.prompt;
    sr.max_tokens = r.request.prompt_only ? 1 : r.request.stop.max_tokens;
    if (r.request.prompt_logprobs >= 0) {
      const int64_t from = r.request.prompt_logprobs_from;
      r.plp.reset(from, int64_t(r.request.prompt.size()) - from, r.request.prompt_logprobs);
      // The logits for position `from` come from the row of from - 1.
      sr.max_prefix_hit = from - 1;
    }
    auto id = scheduler_->add(std::move(sr));
    I.reqs.emplace(r.id, std::move(rp));
    if (!id) {
      finish_request(r, FinishReason::Error, id.error().message, false);
      I.reqs.erase(r.id);
      continue;
    }
    r.seq = *id;
    I.by_seq[r.seq] = &r;
  }
  for (RequestId id : cancels) {
    auto it = I.reqs.find(id);
    if (it == I.reqs.end()) continue;
    finish_request(*it->second, FinishReason::Abort, "", true);
    I.reqs.erase(it);
  }
  admit_imports();
  return {};
}

// The integrity pass over every (sequence, page, generation) the step
// touches: entries of failing sequences are marked in `skip`, and each
// failing request is aborted, naming its first bad page.
void Engine::check_step_integrity(const StepPlan& plan) {
  auto& I = *impl_;
  auto& S = I.stats;
  const size_t n = plan.sequences.size();
  I.skip.assign(n, 0);
  if (!options_.integrity_checks) return;
  const double t0 = now_s();
  I.items.clear();
  for (const auto& e : plan.sequences) I.items.push_back({e.id, e.pages});
  I.failures.clear();
  I.verifier->verify(I.items, I.failures);
  S.verify_seconds += now_s() - t0;
  for (const auto& f : I.failures) {
    for (size_t i = 0; i < n; ++i)
      if (plan.sequences[i].id == f.sequence) I.skip[i] = 1;
  }
  // One abort per failing request, naming its first bad page.
  for (const auto& f : I.failures) {
    auto it = I.by_seq.find(f.sequence);
    if (it == I.by_seq.end() || it->second->done) continue;
    Req& r = *it->second;
    const std::string msg = "KV cache integrity check failed, request aborted: page " +
                            std::to_string(f.page) + " (entry " + std::to_string(f.index) +
                            ") expected generation " + std::to_string(f.expected_generation) +
                            ", found " + std::to_string(f.actual_generation) + " (" +
                            verify_fault_name(f.fault) + ")";
    finish_request(r, FinishReason::Error, msg, true, ErrorCode::kKvIntegrity);
    I.reqs.erase(r.id);
  }
  S.integrity_violations += int64_t(I.failures.size());
  // The faulty tables are gone; pages a corrupted entry kept from the
  // free list come back.
  if (!I.failures.empty()) S.pages_repaired += scheduler_->repair_pool();
}

// The step's batch: every entry the integrity pass kept, its pages as
// addresses, with the first logits row of each chunk in row0 and all rows
// asked for where the chunk covers prompt positions whose log-probabilities
// are wanted.
void Engine::Impl::build_batch(const StepPlan& plan, PagePool& pool) {
  const size_t n = plan.sequences.size();
  batch.tokens.clear();
  batch.seqs.clear();
  batch_index.clear();
  row0.clear();
  if (page_ptrs.size() < n) page_ptrs.resize(n);
  spans.assign(n, KvSpan{});
  for (size_t i = 0; i < n; ++i) {
    if (skip[i]) continue;
    const auto& e = plan.sequences[i];
    auto& ptrs = page_ptrs[i];
    ptrs.resize(e.pages.size());
    for (size_t p = 0; p < e.pages.size(); ++p) ptrs[p] = pool.page_data(e.pages[p].page);
    spans[i] = KvSpan{&format, ptrs.data(), int64_t(ptrs.size())};
    batch.tokens.insert(batch.tokens.end(), e.tokens.begin(), e.tokens.end());
    if (e.draft > 0) {
      // A drafted decode: every token is a one-token chunk of its own (a
      // decode of its position, on the decode weights, attending from the
      // pages), all of them writing their K/V before any attends.
      for (int64_t t = 0; t < e.n_tokens; ++t) {
        row0.push_back(batch.seqs.empty() ? 0 : row0.back() + batch.seqs.back().logit_count());
        batch.seqs.push_back(SeqChunk{&spans[i], e.start + t, 1, false});
        batch_index.push_back(i);
      }
      continue;
    }
    SeqChunk chunk{&spans[i], e.start, e.n_tokens, false};
    Req* rq = by_seq[e.id];
    if (rq->request.prompt_logprobs >= 0 && !rq->plp_sent) {
      // Rows q in [from - 1, prompt - 2] predict prompt positions q + 1.
      const int64_t lo = rq->plp.first - 1, hi = rq->prompt_tokens - 2;
      if (e.start + e.n_tokens - 1 >= lo && e.start <= hi) {
        chunk.all_logits = true;
        chunk.logit_skip = std::max<int64_t>(0, lo - e.start);
      }
    }
    row0.push_back(batch.seqs.empty() ? 0 : row0.back() + batch.seqs.back().logit_count());
    batch.seqs.push_back(chunk);
    batch_index.push_back(i);
    if (e.kind == StepKind::Prefill) stats.prompt_tokens += e.n_tokens;
    Req* r = by_seq[e.id];
    if (r->cached_tokens < 0) r->cached_tokens = e.start;
  }
}

// Prompt log-probabilities from the chunks that computed all their rows.
void Engine::Impl::record_prompt_logprobs(const StepPlan& plan, int64_t vocab) {
  for (size_t j = 0; j < batch_index.size(); ++j) {
    const SeqChunk& ch = batch.seqs[j];
    if (!ch.all_logits) continue;
    const auto& e = plan.sequences[batch_index[j]];
    Req& r = *by_seq[e.id];
    lp_scratch.resize(size_t(vocab));
    for (int64_t k = 0; k < ch.logit_count(); ++k) {
      const int64_t p = e.start + ch.logit_skip + k + 1;  // the position this row predicts
      if (p < r.plp.first || p >= r.prompt_tokens) continue;
      std::span<const float> row(logits.data() + size_t(row0[j] + k) * size_t(vocab),
                                 size_t(vocab));
      r.plp.record(p, row, r.request.prompt[size_t(p)], lp_scratch);
    }
  }
}

Result<bool> Engine::step() {
  // OpenMP's thread count is per calling thread; the stepping thread may not
  // be the one that created the engine.
  if (options_.threads > 0 && num_threads() != options_.threads) set_num_threads(options_.threads);
  KV_TRY(admit_inbox());
  if (shutdown_seen_ && rank() != 0) return false;
  auto& I = *impl_;
  auto& S = I.stats;
  if (options_.debug_fault_interval > 0 && (S.steps + 1) % options_.debug_fault_interval == 0) {
    // Debug fault: the youngest running request's last page is freed while
    // its table still lists it (it may be reallocated in this very step).
    for (auto it = I.reqs.rbegin(); it != I.reqs.rend(); ++it) {
      PageTable* t =
          it->second->done ? nullptr : scheduler_->table_for_fault_injection(it->second->seq);
      if (t == nullptr || t->pages.empty()) continue;
      FaultInjector fi(*pool_);
      if (fi.free_while_referenced(*t, t->pages.size() - 1).ok()) ++S.faults_injected;
      break;
    }
  }
  propose_drafts();
  const StepPlan& plan = scheduler_->schedule();
  if (plan.empty()) {
    KV_TRY(scheduler_->commit({}));
    return !I.reqs.empty();
  }
  S.preemptions += int64_t(plan.preempted.size());
  if (options_.debug_fail_step > 0 && S.steps + 1 == options_.debug_fail_step)
    return make_error("debug: step " + std::to_string(S.steps + 1) + " failed (--debug-fail-step)");
  try {
    return run_plan(plan);
  } catch (const std::exception& e) {
    fail_plan(plan, std::string("the engine step failed: ") + e.what());
    return true;
  }
}

Result<bool> Engine::run_plan(const StepPlan& plan) {
  auto& I = *impl_;
  auto& S = I.stats;
  const size_t n = plan.sequences.size();
  if (options_.debug_throw_step > 0 && S.steps + 1 == options_.debug_throw_step)
    throw std::bad_alloc();
  I.handoffs_captured.clear();  // a failed step's are gone with their requests
  check_step_integrity(plan);
  I.build_batch(plan, *pool_);
  const int64_t vocab = model_->config().vocab;
  I.sampled.assign(n, -1);
  I.accepted.assign(n, 0);
  if (!I.batch.seqs.empty()) {
    I.logits.resize(size_t(I.batch.logit_rows()) * size_t(vocab));
    const double t0 = now_s();
    auto fr = model_->forward(I.batch, I.logits);
    S.forward_seconds += now_s() - t0;
    if (!fr.ok()) {
      // The batch was rejected as a whole: fail its requests, keep the engine.
      for (size_t j = 0; j < I.batch_index.size(); ++j) {
        Req* r = I.by_seq[plan.sequences[I.batch_index[j]].id];
        if (r && !r->done) {
          finish_request(*r, FinishReason::Error, fr.error().message, true);
          I.reqs.erase(r->id);
        }
      }
      KV_TRY(scheduler_->commit(I.sampled));
      return true;
    }
  }
  I.record_prompt_logprobs(plan, vocab);
  sample_and_stream(plan, vocab);
  if (model_->config().mtp_layers > 0 && !I.batch.seqs.empty()) {
    run_mtp(plan);
    // A handoff's final event goes out after commit (max_tokens 1), so
    // its pages can still take the MTP rows this step wrote.
    refresh_handoffs();
  }
  I.handoffs_captured.clear();
  KV_TRY(scheduler_->commit(I.sampled, I.accepted));
  for (Req* r : I.to_finish) {
    if (scheduler_->find(r->seq) != nullptr)
      (void)scheduler_->finish(r->seq, r->stop.finish_reason() != FinishReason::None
                                           ? r->stop.finish_reason()
                                           : FinishReason::Length);
    ++S.requests_finished;
    I.by_seq.erase(r->seq);
    pending_.fetch_sub(1);
    I.reqs.erase(r->id);
  }
  // Sequences the scheduler ended on its own (max tokens reached).
  for (const auto& f : scheduler_->finished()) {
    auto it = I.by_seq.find(f.id);
    if (it == I.by_seq.end()) continue;
    Req& r = *it->second;
    finish_request(r, f.reason, "", false);
    I.reqs.erase(r.id);
  }
  ++S.steps;
  S.kv_pages_peak = std::max(S.kv_pages_peak, pool_->used_pages());
  if (options_.debug_invariants) KV_TRY(check_invariants());
  return true;
}

// The requests of a step whose work threw: each fails with the message, its
// pages go back, and the pending plan is committed with nothing sampled (every
// entry is gone by then, so commit skips them all).
void Engine::fail_plan(const StepPlan& plan, std::string_view message) {
  auto& I = *impl_;
  ++I.stats.step_failures;
  ++I.stats.steps;  // a failed step is still one
  std::fprintf(stderr, "kvant: %.*s\n", int(message.size()), message.data());
  for (const auto& e : plan.sequences) {
    auto it = I.by_seq.find(e.id);
    if (it == I.by_seq.end()) continue;
    Req& r = *it->second;
    const RequestId id = r.id;
    if (!r.done) {
      finish_request(r, FinishReason::Error, message, true, ErrorCode::kEngine);
    } else {
      // Its final event went out before the failure; only its release is left.
      if (scheduler_->find(r.seq) != nullptr) (void)scheduler_->finish(r.seq, FinishReason::Length);
      ++I.stats.requests_finished;
      I.by_seq.erase(r.seq);
      pending_.fetch_sub(1);
    }
    I.reqs.erase(id);
  }
  I.sampled.assign(plan.sequences.size(), -1);
  (void)scheduler_->commit(I.sampled);  // an error only when the plan was already committed
  I.to_finish.clear();
}

void Engine::fail_all(std::string_view message) {
  auto& I = *impl_;
  std::vector<std::unique_ptr<Req>> fresh;
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    fresh.swap(inbox_);
    cancels_.clear();
  }
  for (auto& rp : fresh) {
    rp->done = true;
    emit(*rp, -1, "", nullptr, FinishReason::Error, message, ErrorCode::kEngine);
    ++I.stats.requests_finished;
    ++I.stats.requests_failed;
    pending_.fetch_sub(1);
  }
  std::vector<Req*> all;
  for (auto& [id, r] : I.reqs) all.push_back(r.get());
  for (Req* r : all) finish_request(*r, FinishReason::Error, message, true, ErrorCode::kEngine);
  I.reqs.clear();
  I.by_seq.clear();
  I.pending_imports.clear();
  I.stats.kv_imports_waiting = 0;
}

Result<void> Engine::run_until_idle() {
  while (!idle()) {
    auto r = step();
    if (!r) return r.error();
  }
  return {};
}

EngineStats Engine::stats() const {
  EngineStats s = impl_->stats;
  s.comm_seconds = model_->comm_seconds();
  const auto c = scheduler_->counters();
  s.running = c.running;
  s.waiting = c.waiting;
  s.preemptions = c.preemptions;
  s.prefix_hit_tokens = c.prefix_hit_tokens;
  s.prefix_lookup_tokens = c.prefix_lookup_tokens;
  s.kv_pages_total = pool_->num_pages();
  s.kv_pages_used = pool_->used_pages();
  s.kv_pages_cached = index_ ? index_->size() : 0;
  s.kv_handoffs_refused = handoffs_refused_.load();
  const auto& v = impl_->verifier->stats();
  s.integrity_passes = int64_t(v.passes);
  s.integrity_checks = int64_t(v.checks);
  return s;
}

Result<void> Engine::check_invariants() const { return scheduler_->check_invariants(); }

// ---------------------------------------------------------------------------
// Static KV scale calibration.

}  // namespace kvant
