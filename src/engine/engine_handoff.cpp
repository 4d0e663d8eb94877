// Disaggregated prefill and decode inside the engine (kv_handoff.h): the
// prefill side's copy of a request's pages, and the decode side's checks,
// page allocation and start.
#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"
#include "engine/engine_internal.h"
#include "kvcache/page_pool.h"
#include "kvcache/page_table.h"
#include "kvcache/prefix_index.h"

namespace kvant {

const KvLayout& Engine::kv_layout() const { return pool_->layout(); }

// At the handoff request's first token: its plan entry's pages hold the
// whole prompt (the chunk that samples ends at the prompt's last token).
void Engine::capture_handoff(Req& r, int32_t token, std::span<const PageRef> pages,
                             const StepLogprobs* lp) {
  auto h = std::make_unique<KvHandoff>();
  const int64_t pb = pool_->page_bytes();
  h->layout_hash = layout_hash_;
  h->page_bytes = pb;
  h->page_tokens = pool_->geometry().page_tokens;
  h->prompt = r.request.prompt;
  h->first_token = token;
  if (lp != nullptr) {
    h->has_logprobs = true;
    h->first_logprobs = *lp;
  }
  h->sampler_state = r.sampler.rng_state();
  const size_t n = size_t(kv_pages_for_tokens(int64_t(h->prompt.size()), h->page_tokens));
  KV_CHECK_GE(pages.size(), n);
  h->pages.resize(n);
  h->data.resize(n * size_t(pb));
  for (size_t i = 0; i < n; ++i) {
    uint8_t* dst = h->data.data() + i * size_t(pb);
    std::memcpy(dst, pool_->page_data(pages[i].page), size_t(pb));
    h->pages[i] = {pages[i].page, pages[i].generation, kv_page_checksum(dst, pb)};
  }
  r.handoff_out = std::move(h);
  ++impl_->stats.kv_handoffs_out;
  impl_->handoffs_captured.push_back(&r);
}

void Engine::refresh_handoffs() {
  const int64_t pb = pool_->page_bytes();
  for (Req* r : impl_->handoffs_captured) {
    KvHandoff& h = *r->handoff_out;
    for (size_t i = 0; i < h.pages.size(); ++i) {
      uint8_t* dst = h.data.data() + i * size_t(pb);
      std::memcpy(dst, pool_->page_data(h.pages[i].src_page), size_t(pb));
      h.pages[i].checksum = kv_page_checksum(dst, pb);
    }
    h.mtp_draft = r->mtp_draft;
    Req::DeferredFinal& d = r->deferred_final;
    if (d.token >= 0) {
      emit(*r, d.token, d.text, r->request.logprobs ? &r->lp : nullptr, d.finish, "");
      d.token = -1;
    }
  }
  impl_->handoffs_captured.clear();
}

Result<RequestId> Engine::submit_handoff(Request request, std::shared_ptr<const KvHandoff> kv) {
  auto refuse = [&](const std::string& why) -> Result<RequestId> {
    handoffs_refused_.fetch_add(1);
    return make_error("KV handoff refused: " + why);
  };
  if (!kv) return refuse("no K/V");
  if (distributed()) return refuse("not supported across several ranks (--tp / --ep) yet");
  if (request.handoff || request.prompt_only || request.prompt_logprobs >= 0)
    return refuse("the decode half of a request is a plain generating request");
  const KvHandoff& h = *kv;
  if (h.layout_hash != layout_hash_)
    return refuse("the prefill side's KV layout differs from this engine's (" +
                  std::to_string(pool_->geometry().page_tokens) + "-token " +
                  kv_dtype_name(pool_->geometry().dtype) + " pages of " +
                  std::to_string(pool_->page_bytes()) + " bytes here; their page is " +
                  std::to_string(h.page_bytes) + " bytes of " + std::to_string(h.page_tokens) +
                  " tokens)");
  if (h.page_bytes != pool_->page_bytes() || h.page_tokens != pool_->geometry().page_tokens)
    return refuse("page size differs");
  if (h.prompt != request.prompt) return refuse("the request's prompt is not the handoff's");
  const size_t n = size_t(kv_pages_for_tokens(int64_t(h.prompt.size()), h.page_tokens));
  if (h.pages.size() != n || h.data.size() != n * size_t(h.page_bytes))
    return refuse(std::to_string(h.pages.size()) + " pages (" + std::to_string(h.data.size()) +
                  " bytes) for a prompt of " + std::to_string(h.prompt.size()) + " tokens");
  if (h.first_token < 0 || h.first_token >= model_->config().vocab)
    return refuse("first token " + std::to_string(h.first_token) + " is outside the vocabulary");
  for (size_t i = 0; i < n; ++i) {
    const uint64_t sum = kv_page_checksum(h.data.data() + i * size_t(h.page_bytes), h.page_bytes);
    if (sum != h.pages[i].checksum) {
      std::fprintf(stderr,
                   "kvant: KV handoff: page %zu of %zu (source page %u, generation %u) fails its "
                   "checksum\n",
                   i, n, h.pages[i].src_page, h.pages[i].src_generation);
      return refuse("page " + std::to_string(i) + " of " + std::to_string(n) +
                    " does not match its checksum (corrupted in transit)");
    }
  }
  if (int64_t(n) + 1 > pool_->num_pages())
    return refuse("the prompt needs " + std::to_string(n) + " pages; this engine's pool has " +
                  std::to_string(pool_->num_pages()));
  // submit()'s checks and clamps, as for any request; the handed-over first
  // token counts against max_tokens.
  if (auto c = check_request(request); !c) return refuse(c.error().message);
  if (int64_t(request.prompt.size()) + 1 >= capacity_.max_context)
    return refuse("the prompt and its first token fill the context of " +
                  std::to_string(capacity_.max_context));
  if (request.stop.max_tokens < 2)
    return refuse("max_tokens " + std::to_string(request.stop.max_tokens) +
                  ": the prefill side's first token was all of it");
  return enqueue(std::move(request), std::move(kv));
}

// Stepping thread, at admission: every waiting import in order, until one
// finds no room (the rest wait behind it). Room is its pages plus one free
// page for every running sequence and itself, so that admitting it does
// not at once force a preemption (which would recompute a prompt here,
// the work disaggregation moved away).
void Engine::admit_imports() {
  auto& I = *impl_;
  while (!I.pending_imports.empty()) {
    auto it = I.reqs.find(I.pending_imports.front());
    if (it == I.reqs.end()) {  // cancelled while it waited
      I.pending_imports.pop_front();
      continue;
    }
    Req& r = *it->second;
    const int64_t running = scheduler_->running_count();
    if (running >= options_.max_running) break;
    const int64_t need = int64_t(r.handoff_in->pages.size()) + running + 1;
    if (pool_->free_pages() < need && index_) (void)index_->evict_for(need - pool_->free_pages());
    if (pool_->free_pages() < need) break;
    I.pending_imports.pop_front();
    if (auto s = start_import(r); !s) {
      finish_request(r, FinishReason::Error, s.error().message, true);
      I.reqs.erase(it);
    }
  }
  I.stats.kv_imports_waiting = int64_t(I.pending_imports.size());
}

Result<void> Engine::start_import(Req& r) {
  auto& I = *impl_;
  const KvHandoff& h = *r.handoff_in;
  // The prefill side drew the first token under the same constraint; this
  // side's copy moves past it.
  if (r.request.constraint) KV_TRY(r.request.constraint->accept(h.first_token));
  const int64_t pb = pool_->page_bytes();
  std::vector<PageRef> pages;
  pages.reserve(h.pages.size());
  for (size_t i = 0; i < h.pages.size(); ++i) {
    auto ref = pool_->allocate();
    KV_CHECK(ref.has_value());  // admit_imports made room
    std::memcpy(pool_->page_data(ref->page), h.data.data() + i * size_t(pb), size_t(pb));
    pages.push_back(*ref);
  }
  SequenceRequest sr;
  sr.prompt = h.prompt;
  sr.max_tokens = r.request.stop.max_tokens;
  auto seq = scheduler_->add_prefilled(std::move(sr), pages, h.first_token);
  if (!seq) {
    for (const PageRef& p : pages) (void)pool_->release(p);
    return seq.error();
  }
  r.seq = *seq;
  I.by_seq[r.seq] = &r;
  r.cached_tokens = 0;
  ++I.stats.kv_handoffs_in;
  // The first token as if sampled here: the penalties count it, the random
  // stream continues where the prefill side left it, and it streams first.
  r.sampler.set_prompt(r.request.prompt, r.request.stop.max_tokens);
  r.sampler.accept(h.first_token);
  r.sampler.set_rng_state(h.sampler_state);
  r.completion_tokens = 1;
  // The prefill side's MTP draft, for this side's first step (ids checked:
  // a draft is fed to the forward).
  const SpeculativeParams& sp = r.request.speculative;
  if (model_->config().mtp_layers > 0 && sp.method == SpecMethod::kMtp && sp.num_tokens > 0 &&
      std::all_of(h.mtp_draft.begin(), h.mtp_draft.end(),
                  [&](int32_t t) { return t >= 0 && t < model_->config().vocab; })) {
    r.mtp_draft.assign(h.mtp_draft.begin(),
                       h.mtp_draft.begin() + std::min<ptrdiff_t>(ptrdiff_t(h.mtp_draft.size()),
                                                                 sp.num_tokens));
    r.mtp_draft_pos = int64_t(h.prompt.size()) + 1;
  }
  const StepLogprobs* lp = r.request.logprobs && h.has_logprobs ? &h.first_logprobs : nullptr;
  auto st = r.stop.step(h.first_token);
  if (st.finish == FinishReason::None) {
    emit(r, h.first_token, st.text, lp, FinishReason::None, "");
    return {};
  }
  // The first token ended it (a stop string the prefill side could not see
  // whole, with the client's stop list): done, pages back.
  r.done = true;
  emit(r, h.first_token, st.text, lp, st.finish, "");
  (void)scheduler_->finish(r.seq, st.finish);
  ++I.stats.requests_finished;
  I.by_seq.erase(r.seq);
  pending_.fetch_sub(1);
  I.reqs.erase(r.id);
  return {};
}

}  // namespace kvant
