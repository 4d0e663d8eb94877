// Engine: kvant's public serving API. It owns the model, the tokenizer, the
// KV page pool, the prefix index, the scheduler and every request's sampler
// and stop logic, and runs the loop that ties them together, one step at a
// time:
//
//   schedule (decodes, prefill chunks, admissions; preemption when pages run
//   out) -> integrity pass over every (request, page, generation) the step
//   touches (a mismatch aborts that request alone, finish reason "error")
//   -> one batched forward over all scheduled requests -> sample -> stop
//   strings / tokens -> events to each request's callback -> commit.
//
// submit() and cancel() may be called from any thread; step() and the
// callbacks run on the thread that drives the engine (one at a time). The
// server includes only this header; tools that drive a model directly, one
// forward at a time (benchmarks, evaluation, calibration), use ModelRunner
// (engine/model_runner.h). Neither exposes Model, its loader or its weights.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "engine/constraint.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/stop_matcher.h"
#include "kvcache/kv_layout.h"
#include "kvcache/page_ref.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace kvant {

struct Batch;  // model/model.h (the MTP pass's, engine-private)

namespace dist {
class Communicator;
}
class Model;
class ModelRunner;
class PagePool;
class PrefixIndex;
class Scheduler;
class FaultInjector;
struct KvHandoff;
struct StepPlan;
struct ScheduledSequence;

using RequestId = uint64_t;

struct EngineOptions {
  std::string model_path;  // GGUF file or Hugging Face directory
  std::string
      tokenizer_path;  // empty: the model's own; else a GGUF or a directory with tokenizer.json
  int threads = 0;     // 0 = OpenMP's default
  // The backend the model computes on: "cpu", or "cuda" (KVANT_CUDA builds
  // on a machine with a GPU: weights, activations and KV pages in its memory).
  std::string device = "cpu";
  // Weight precision per phase: "native" (the checkpoint's own), "bf16" or
  // "int4"; when they differ both sets stay resident. INT4 from a BF16/GGUF
  // checkpoint is quantized at load (RTN, int4_group, symmetric).
  std::string prefill_weights = "native", decode_weights = "native";
  int int4_group = 128;
  bool int4_lm_head = false;
  // Load the checkpoint's multi-token-prediction layer and run it after
  // every step over the positions the step computed (its K/V in the pages
  // beside the main layers'), so that a request asking for speculative
  // method kMtp drafts the token after next from it.
  bool mtp = false;
  // KV cache.
  KvDType kv_dtype = KvDType::kBf16;
  // FP8 only: kStatic needs per-(layer, KV head) scales from a calibration
  // pass (kv_scales_path, default <model>.kv_scales.json); kDynamic keeps
  // per-(token, head) scales in the pages.
  KvScaleMode kv_scale_mode = KvScaleMode::kDynamic;
  std::string kv_scales_path;
  int64_t kv_memory_bytes = 0;       // arena size; 0 = kv_memory_fraction of available memory
  double kv_memory_fraction = 0.25;  // of MemAvailable, when kv_memory_bytes is 0
  int64_t page_tokens = 16;
  // Scheduling.
  int64_t max_step_tokens = 512;  // tokens per forward step (decodes + prefill chunks)
  int64_t max_running = 64;       // sequences holding pages at once
  int64_t max_context = 0;        // prompt + generated; 0 = the model's maximum
  bool prefix_caching = true;
  bool prefix_checksums = false;  // XXH3 of shared pages, verified on reuse
  // Integrity pass before every step (off only to measure what it costs).
  bool integrity_checks = true;
  // Check pool, tables and index invariants after every step (tests, debug).
  bool debug_invariants = false;
  bool log_capacity = true;  // one line on stderr at start-up
  // Debug only, off by default: every N steps, free one page of a running
  // request behind its back (as a use-after-free bug would), so the
  // integrity pass can be watched catching it end to end.
  int64_t debug_fault_interval = 0;
  // Tensor / expert parallelism over the processes of `comm` (mpirun): tp
  // and ep are each 1 or comm's size (model/model.h, Parallelism). Rank 0
  // leads: it takes submit() and cancel() and, at the start of every step,
  // broadcasts what it accepted since the last one (engine/request_codec.h);
  // the other ranks run follow(), replaying it, so every rank's scheduler
  // makes the same decisions and every rank runs the same forward. Start-up
  // checks that every rank loaded the same model with the same options, and
  // gives every rank the smallest rank's KV page count. Null comm: one process.
  std::shared_ptr<dist::Communicator> comm;
  int tp = 1, ep = 1;
  // Debug only, off by default: step N (1-based) throws std::bad_alloc
  // inside its forward, so the failure path (the step's requests fail, the
  // engine goes on) can be watched end to end.
  int64_t debug_throw_step = 0;
  // Debug only, off by default: step N (1-based) returns an error instead of
  // running, as an unrecoverable failure (a dead peer rank) does, so the
  // server's whole-engine failure path can be watched end to end.
  int64_t debug_fail_step = 0;
};

// Why a request failed (RequestEvent::error_code), for callers that must
// tell a client a stable code while the message goes to the log.
enum class ErrorCode {
  kNone,
  kKvIntegrity,  // the integrity pass caught a page that changed under it
  kEngine,       // the step that ran it failed (the model rejected the batch, memory ran out)
  kConstraint,   // its output constraint failed (no token fits, or the grammar grew too large)
};

// One event per sampled token, and one final event (finish != None) that may
// also carry the last token.
struct RequestEvent {
  RequestId id = 0;
  int32_t token = -1;                      // the sampled token, -1 if none
  std::string_view text;                   // text that became safe to show
  const StepLogprobs* logprobs = nullptr;  // when the request asked for them
  // The prompt's log-probabilities (Request::prompt_logprobs), with the
  // request's first event; null on every other event and when not asked for.
  const PromptLogprobs* prompt_logprobs = nullptr;
  FinishReason finish = FinishReason::None;
  std::string_view error;  // with FinishReason::Error: what went wrong
  ErrorCode error_code = ErrorCode::kNone;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // generated so far, this token included
  int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache
  // A handoff request's final event: its prompt's K/V and first token for a
  // decode engine (kv_handoff.h); null otherwise. Valid during the callback.
  const KvHandoff* handoff = nullptr;
};
using RequestCallback = std::function<void(const RequestEvent&)>;

struct Request {
  std::vector<int32_t> prompt;  // token ids, non-empty
  SamplingParams sampling;
  StopParams stop;  // stop.max_tokens <= 0: up to the context limit
  bool logprobs = false;
  // Log-probabilities of the prompt's own tokens: -1 none; else, for every
  // prompt position from prompt_logprobs_from on (>= 1), that token's and the
  // `prompt_logprobs` most likely tokens' there. Positions before it may be
  // served from the prefix cache; those from it on are computed.
  int32_t prompt_logprobs = -1;
  int64_t prompt_logprobs_from = 1;
  // Generates nothing: the request finishes ("length") once its prompt is
  // computed (scoring a prompt, the completions API's max_tokens 0 with echo).
  bool prompt_only = false;
  // Disaggregated prefill (kv_handoff.h): computes the prompt, samples the
  // first token and finishes ("length", or the stop reason that token hit);
  // the final event carries the prompt's K/V and that token for a decode
  // engine. stop.max_tokens is taken as 1.
  bool handoff = false;
  // What the output must look like (constraint.h): masks each draw and
  // follows each drawn token. One per request (it keeps the request's
  // position in its grammar); null: unconstrained.
  std::shared_ptr<TokenConstraint> constraint;
  // Speculative decoding by prompt lookup (speculative.h): off unless
  // num_tokens > 0. The output is the same with it as without.
  SpeculativeParams speculative;
  RequestCallback on_event;  // may be empty
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_total = 0, kv_pages_used = 0, kv_pages_peak = 0;
  int64_t kv_pages_cached = 0;    // held by the prefix index (all of kv_pages_used when idle)
  int64_t prompt_tokens = 0;      // computed prompt tokens (prefill work)
  int64_t generated_tokens = 0;   // sampled tokens
  int64_t requests_finished = 0;  // every reason
  int64_t requests_aborted = 0;   // cancelled
  int64_t requests_failed = 0;    // finish reason error
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0, prefix_lookup_tokens = 0;
  int64_t integrity_passes = 0, integrity_checks = 0, integrity_violations = 0;
  int64_t pages_repaired = 0;   // pool pages fixed up after integrity failures
  int64_t faults_injected = 0;  // debug_fault_interval
  int64_t steps = 0;
  int64_t step_failures = 0;  // steps whose work threw (their requests failed)
  // Disaggregation: K/V handed out (handoff requests), taken in
  // (submit_handoff), and refused (layout, checksum or shape).
  int64_t kv_handoffs_out = 0, kv_handoffs_in = 0, kv_handoffs_refused = 0;
  int64_t kv_imports_waiting = 0;  // taken in, waiting for pages or a running slot
  // Speculative decoding: decode steps that carried a draft, draft tokens
  // fed, and how many of them were accepted.
  int64_t spec_steps = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  double mtp_seconds = 0;  // in the multi-token-prediction pass (also in forward_seconds)
  double forward_seconds = 0, verify_seconds = 0;
  // Of forward_seconds, the time in collectives (tensor / expert parallelism).
  double comm_seconds = 0;
};

struct KvCapacity {
  KvDType dtype = KvDType::kBf16;
  KvScaleMode scale_mode = KvScaleMode::kNone;
  int64_t page_tokens = 0, pages = 0, tokens = 0;
  int64_t arena_bytes = 0;
  double bytes_per_token = 0;
  int64_t max_context = 0;
};
std::string describe(const KvCapacity& c);

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& model_config() const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& chat_template() const { return chat_template_; }
  const KvCapacity& capacity() const { return capacity_; }
  const EngineOptions& options() const { return options_; }

  // Validates and queues a request (thread-safe). Errors name the problem:
  // empty prompt, a prompt at or beyond the context limit (both counts),
  // out-of-range sampling or stop parameters, token ids outside the vocabulary.
  Result<RequestId> submit(Request request);
  // Ends a request at the next step with finish reason "abort", returning
  // its pages (thread-safe; unknown or finished ids are ignored).
  void cancel(RequestId id);
  // The decode half of a disaggregated request (kv_handoff.h): `request`
  // (its prompt the handoff's, its sampling and stop the client's; max_tokens
  // counts the handed-over first token) continues from the handoff's pages
  // and first token, whose event comes first. Thread-safe; the checks run on
  // the caller's thread. Errors (counted in kv_handoffs_refused): a layout
  // other than this engine's (the message names the difference), a page
  // whose bytes do not match its checksum, a prompt or page count that does
  // not match, max_tokens below 2, several ranks (not supported yet), and
  // what submit() refuses.
  Result<RequestId> submit_handoff(Request request, std::shared_ptr<const KvHandoff> kv);
  // This engine's KV layout digest (kv_layout_hash), for peers to compare.
  uint64_t kv_layout_hash() const { return layout_hash_; }
  const KvLayout& kv_layout() const;

  // Runs one step. Returns false when there was nothing to do. Errors are
  // engine failures, not per-request ones. An exception inside the step's
  // work (integrity pass, forward, sampling) fails that step's requests
  // (finish reason "error", ErrorCode::kEngine) and the engine goes on.
  Result<bool> step();
  // Ends every request, admitted or not yet, with finish reason "error" and
  // `message`, returning their pages: the last resort of a caller whose
  // step() threw outside the step's own boundary. Stepping thread only.
  void fail_all(std::string_view message);
  // Steps until no request is left.
  Result<void> run_until_idle();
  // Ranks other than 0 of a distributed engine: steps as rank 0 does, with
  // its inputs, until rank 0's engine goes away (its destructor says so) or
  // the transport fails (an error naming it; a peer that stops answering
  // within the communicator's timeout is one).
  Result<void> follow();
  // This process's rank and the number of ranks (0 and 1 alone).
  int rank() const;
  int ranks() const;
  // Bytes of the weights this process holds (its slice under TP / EP),
  // every resident set counted once.
  size_t weight_bytes() const;
  bool idle() const;

  EngineStats stats() const;

  // Page pool, tables and index invariants (tests, debug).
  Result<void> check_invariants() const;

 private:
  friend struct EngineTesting;  // engine/engine_testing.h: tests reach the internals
  // The scheduler sequence serving a request (0 when not running or waiting).
  uint64_t sequence_of(RequestId id) const;
  struct Req;
  Engine() = default;
  Result<void> admit_inbox();
  // Distributed: rank 0 sends its step inputs, the others receive and queue
  // them (setting shutdown_seen_ when rank 0 has gone).
  Result<void> exchange_inputs(std::vector<std::unique_ptr<Req>>& fresh,
                               std::vector<RequestId>& cancels);
  Result<void> check_ranks_agree();
  bool distributed() const;
  bool shutdown_seen_ = false;
  uint64_t input_seq_ = 0;
  void finish_request(Req& r, FinishReason reason, std::string_view error, bool in_scheduler,
                      ErrorCode code = ErrorCode::kEngine);
  void emit(Req& r, int32_t token, std::string_view text, const StepLogprobs* lp,
            FinishReason finish, std::string_view error, ErrorCode code = ErrorCode::kNone);
  // The step's work after scheduling (may throw; step() catches).
  Result<bool> run_plan(const StepPlan& plan);
  void fail_plan(const StepPlan& plan, std::string_view message);
  // Parts of step(), in the order it runs them.
  void check_step_integrity(const StepPlan& plan);
  void sample_and_stream(const StepPlan& plan, int64_t vocab);
  // Speculative decoding (engine_speculative.cpp): drafts offered to the
  // scheduler before it plans; a drafted entry's rows drawn in order while
  // the draws agree with the draft (plan entry i, its first logits row row0).
  void propose_drafts();
  // The MTP layer over the positions this step computed and kept (their
  // next tokens now known): its K/V, and the drafts of the requests that
  // ask for them.
  void run_mtp(const StepPlan& plan);
  Result<void> mtp_pass(const Batch& b);
  void sample_drafted(Req& r, const ScheduledSequence& e, size_t i, size_t row0, int64_t vocab);
  // One drawn token of request r (plan entry i, its pages `pages`) from
  // `row`: constraint, sampler, stop logic and the event. False when the
  // request ended with it.
  bool draw_token(Req& r, std::span<const PageRef> pages, size_t i, std::span<float> row,
                  int32_t& tok);
  // A constrained request's row before the draw (`token` -1: the mask) or
  // the drawn token after it; false when the constraint failed and the
  // request ended (engine_constraint.cpp).
  bool constrain(Req& r, std::span<float> row, size_t i, int32_t token);
  // Disaggregation (engine_handoff.cpp): a handoff request's copy of its
  // pages at its first token; imported requests given pages and started.
  void capture_handoff(Req& r, int32_t token, std::span<const PageRef> pages,
                       const StepLogprobs* lp);
  // The page bytes (and checksums) of the handoffs captured this step again,
  // after the MTP pass has written its rows for the prompt's last chunk.
  void refresh_handoffs();
  void admit_imports();
  // submit()'s checks and clamps (max_tokens to the room left), and the
  // queueing of a checked request.
  Result<void> check_request(Request& r) const;
  RequestId enqueue(Request r, std::shared_ptr<const KvHandoff> handoff_in);
  Result<void> start_import(Req& r);
  uint64_t layout_hash_ = 0;

  EngineOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string chat_template_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PrefixIndex> index_;
  std::unique_ptr<Scheduler> scheduler_;
  KvCapacity capacity_;
  struct Impl;
  std::unique_ptr<Impl> impl_;

  mutable std::mutex inbox_mu_;
  std::vector<std::unique_ptr<Req>> inbox_;
  std::vector<RequestId> cancels_;
  std::atomic<RequestId> next_id_{1};
  std::atomic<int64_t> pending_{0};  // submitted and not yet finished
  std::atomic<int64_t> handoffs_refused_{0};  // submit_handoff's refusals (any thread)
};


// Static FP8 KV scales, one per (layer, KV head) for K and for V: amax of the
// calibration activations / the format's largest finite value.
struct KvScales {
  int64_t layers = 0, kv_heads = 0;
  std::vector<float> k_amax, v_amax;  // [layers * kv_heads]
  int64_t tokens = 0;                 // calibration tokens seen
  std::string source;                 // what text they came from
};
// Runs the model (engine/model_runner.h) over `tokens` in chunks with a BF16
// cache and records the largest |K| and |V| per (layer, KV head).
Result<KvScales> calibrate_kv_scales(ModelRunner& model, std::span<const int32_t> tokens,
                                     int64_t chunk_tokens);
Result<void> save_kv_scales(const KvScales& s, const std::string& path);
Result<KvScales> load_kv_scales(const std::string& path);
std::string default_kv_scales_path(const std::string& model_path);
// The static scales one rank's pages use, from the file's amax values:
// [layers * held heads] for K and for V, each amax / the dtype's largest
// finite value (1 where the amax is 0), for the KV heads [held_begin,
// held_end) of every layer (all of them in one process). Errors: a file
// whose layers x heads are not the model's (`model_heads`: every rank's
// heads together, the cache heads; MLA: 1).
struct StaticKvScales {
  std::vector<float> k, v;
};
Result<StaticKvScales> static_kv_scales(const KvScales& s, const std::string& path, int64_t layers,
                                        int64_t model_heads, int64_t held_begin, int64_t held_end,
                                        KvDType dtype);

}  // namespace kvant
