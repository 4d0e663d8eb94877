// Speculative decoding in the engine step (speculative.h): prompt-lookup
// drafts offered to the scheduler before it plans, and a drafted entry's
// rows drawn in order, one token per row, while each drawn token equals the
// draft token the next row was computed with.
#include "engine/engine_internal.h"

namespace kvant {

void Engine::propose_drafts() {
  auto& I = *impl_;
  const int64_t running = scheduler_->running_count();
  for (auto& [id, rp] : I.reqs) {
    Req& r = *rp;
    if (r.done || r.request.speculative.num_tokens <= 0 || r.seq == 0) continue;
    const SequenceState* s = scheduler_->find(r.seq);
    if (s == nullptr || s->status != SequenceStatus::Running ||
        int64_t(s->tokens.size()) - s->computed != 1)
      continue;
    if (!r.pacer.may_draft(running)) continue;
    ngram_propose(s->tokens, r.request.speculative, I.draft);
    if (!I.draft.empty()) scheduler_->propose(r.seq, I.draft);
  }
}

void Engine::sample_drafted(Req& r, const ScheduledSequence& e, size_t i, size_t row0,
                            int64_t vocab) {
  auto& I = *impl_;
  auto& S = I.stats;
  int64_t accepted = 0;
  for (int64_t t = 0; t <= e.draft; ++t) {
    std::span<float> row(I.logits.data() + (row0 + size_t(t)) * size_t(vocab), size_t(vocab));
    int32_t tok = -1;
    const bool live = draw_token(r, e.pages, i, row, tok);
    if (!live || t == e.draft || tok != e.tokens[size_t(t + 1)]) break;
    ++accepted;
  }
  I.accepted[i] = int32_t(accepted);
  ++S.spec_steps;
  S.spec_draft_tokens += e.draft;
  S.spec_accepted_tokens += accepted;
  r.pacer.record(e.draft, accepted);
}

}  // namespace kvant
