// The engine's private state, shared by its source files (engine.cpp, the
// step; engine_dist.cpp, several ranks; engine_handoff.cpp, disaggregated
// prefill and decode). Not for use outside engine/.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_handoff.h"
#include "engine/scheduler.h"
#include "engine/speculative_pacer.h"
#include "kvcache/kv_verifier.h"
#include "kvcache/kv_view.h"
#include "model/model.h"

namespace kvant {

struct Engine::Req {
  RequestId id = 0;
  SeqId seq = 0;
  Request request;
  Sampler sampler;
  StopMatcher stop;
  StepLogprobs lp;
  PromptLogprobs plp;     // when request.prompt_logprobs >= 0
  bool plp_sent = false;  // went out with the first event
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = -1;  // set at the first scheduled chunk
  bool done = false;
  SpeculativePacer pacer;
  // Multi-token prediction: the MTP layer's draft from the last step and the
  // position of its first token (-1: none).
  std::vector<int32_t> mtp_draft;
  int64_t mtp_draft_pos = -1;
  // Disaggregation (kv_handoff.h): what a handoff request hands out with its
  // final event, and what an imported one starts from.
  std::unique_ptr<KvHandoff> handoff_out;
  // A handoff's final event held back for the MTP pass (token -1: none).
  struct DeferredFinal {
    int32_t token = -1;
    std::string text;
    FinishReason finish = FinishReason::None;
  } deferred_final;
  std::shared_ptr<const KvHandoff> handoff_in;
  Req(Request r, const Tokenizer& tok)
      : request(std::move(r)), sampler(request.sampling), stop(request.stop, tok) {}
};

struct Engine::Impl {
  KvFormat format;
  std::unique_ptr<KvVerifier> verifier;
  std::map<RequestId, std::unique_ptr<Req>> reqs;  // admitted, not finished
  std::unordered_map<SeqId, Req*> by_seq;
  // Per-step scratch, kept to avoid reallocating.
  std::vector<VerifyItem> items;
  std::vector<VerifyFailure> failures;
  std::vector<uint8_t> skip;
  std::vector<std::vector<uint8_t*>> page_ptrs;
  std::vector<KvSpan> spans;
  std::vector<size_t> batch_index;  // plan entry of each batch chunk
  std::vector<int64_t> row0;        // first logits row of each batch chunk
  std::vector<float> lp_scratch;    // prompt log-probabilities
  Batch batch;
  std::vector<float> logits;
  std::vector<int32_t> sampled;
  std::vector<int32_t> accepted;  // draft tokens accepted per plan entry
  std::vector<int32_t> draft;     // scratch for a proposal
  std::vector<Req*> to_finish;
  std::vector<Req*> handoffs_captured;  // this step's (refresh_handoffs)
  // The MTP pass's batch, its source rows and logits, and the requests
  // drafting: each one's pages, its pending token's position, and the row
  // of its last position in the latest MTP forward.
  struct MtpChain {
    Req* req;
    const KvSpan* kv;
    int64_t pending, row;
  };
  Batch mtp_batch;
  std::vector<int64_t> mtp_src;
  std::vector<float> mtp_logits;
  std::vector<MtpChain> mtp_chain;
  EngineStats stats;
  uint64_t seed_counter = 0;
  // Imported requests waiting for pages (or a running slot), oldest first.
  std::deque<RequestId> pending_imports;
  std::mutex stats_mu;  // stats() may be read from another thread

  void build_batch(const StepPlan& plan, PagePool& pool);
  void record_prompt_logprobs(const StepPlan& plan, int64_t vocab);
};

}  // namespace kvant
