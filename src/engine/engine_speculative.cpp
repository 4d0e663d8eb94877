// Speculative decoding in the engine step (speculative.h): drafts (prompt
// lookup, or the MTP layer's from the last step) offered to the scheduler
// before it plans, a drafted entry's rows drawn in order, one token per
// row, while each drawn token equals the draft token the next row was
// computed with, and the MTP pass after the draws.
#include <chrono>
#include <cstdio>

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
    if (r.request.speculative.method == SpecMethod::kMtp) {
      // The MTP layer's draft for the position after the pending token.
      I.draft.clear();
      if (r.mtp_draft_pos == int64_t(s->tokens.size())) I.draft = r.mtp_draft;
    } else {
      ngram_propose(s->tokens, r.request.speculative, I.draft);
    }
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

void Engine::run_mtp(const StepPlan& plan) {
  auto& I = *impl_;
  Batch& b = I.mtp_batch;
  b.tokens.clear();
  b.seqs.clear();
  I.mtp_src.clear();
  I.mtp_chain.clear();
  int64_t row = 0;   // the entry's first token row in the step's forward
  int64_t mrow = 0;  // its first row in the MTP pass
  const int64_t running = scheduler_->running_count();
  for (size_t j = 0; j < I.batch_index.size(); row += I.batch.seqs[j].n_tokens, ++j) {
    const size_t i = I.batch_index[j];
    if (j > 0 && I.batch_index[j - 1] == i) continue;  // a drafted entry's later rows
    const auto& e = plan.sequences[i];
    auto it = I.by_seq.find(e.id);
    const SequenceState* s = scheduler_->find(e.id);
    if (it == I.by_seq.end() || s == nullptr) continue;
    Req& r = *it->second;
    r.mtp_draft.clear();
    r.mtp_draft_pos = -1;
    // Positions kept: a drafted decode's last token and its accepted drafts.
    const int64_t kept = e.draft > 0 ? 1 + I.accepted[i] : e.n_tokens;
    // Each position's next token: the step's own tokens, then the prompt's
    // next one (a chunk inside the prompt) or the token drawn now.
    const int64_t after = e.start + kept;
    const int32_t next = e.draft == 0 && after < int64_t(s->tokens.size())
                             ? s->tokens[size_t(after)]
                             : I.sampled[i];
    if (next < 0) continue;
    b.tokens.insert(b.tokens.end(), e.tokens.begin() + 1, e.tokens.begin() + kept);
    b.tokens.push_back(next);
    // Logits (the output head, a large share of a small model's bytes) only
    // for a request that will offer a draft next step.
    // A handoff request is done after its first token, but its draft
    // travels with its pages to the decode side.
    const bool drafts = (!r.done || r.handoff_out) &&
                        r.request.speculative.method == SpecMethod::kMtp &&
                        r.request.speculative.num_tokens > 0 && r.pacer.would_draft(running);
    SeqChunk ch{I.batch.seqs[j].kv, e.start, kept, false};
    ch.no_logits = !drafts;
    b.seqs.push_back(ch);
    I.mtp_src.push_back(row);
    // A drafting request's pending token sits at `after`; its drafts start
    // at after + 1.
    if (drafts) I.mtp_chain.push_back({&r, ch.kv, after, mrow + kept - 1});
    mrow += kept;
  }
  if (b.seqs.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  auto fr = mtp_pass(b);
  // Longer drafts: the layer again, on its own output (the last row's
  // state before its output norm) and the draft token just drawn, one
  // position further each time. Its K/V rows there are overwritten by the
  // pass that runs once the main model has computed those positions, before
  // any real query reads them; a position past the request's pages ends its
  // draft.
  for (int32_t depth = 1; fr.ok(); ++depth) {
    b.tokens.clear();
    b.seqs.clear();
    I.mtp_src.clear();
    size_t kept = 0;
    for (auto& c : I.mtp_chain) {
      Req& r = *c.req;
      const int64_t pos = c.pending + depth - 1;  // where the last draft token sits
      if (int64_t(r.mtp_draft.size()) != depth || depth >= r.request.speculative.num_tokens ||
          pos >= c.kv->capacity())
        continue;
      b.tokens.push_back(r.mtp_draft.back());
      b.seqs.push_back(SeqChunk{c.kv, pos, 1, false});
      I.mtp_src.push_back(c.row);
      c.row = int64_t(kept);
      I.mtp_chain[kept++] = c;
    }
    I.mtp_chain.resize(kept);
    if (b.seqs.empty()) break;
    fr = mtp_pass(b);
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  I.stats.forward_seconds += dt;
  I.stats.mtp_seconds += dt;
  if (!fr.ok()) {
    // Drafts only: the requests go on without them.
    std::fprintf(stderr, "kvant: multi-token prediction failed: %s\n", fr.error().message.c_str());
    for (auto& [id, rp] : I.reqs) rp->mtp_draft.clear();
  }
}

// One MTP forward over `b` from rows I.mtp_src of the last forward; each
// chain entry's request gets its chunk's argmax appended as a draft token
// (the chain entries are the batch's logit-bearing chunks, in order).
Result<void> Engine::mtp_pass(const Batch& b) {
  auto& I = *impl_;
  const int64_t vocab = model_->config().vocab;
  I.mtp_logits.resize(size_t(b.logit_rows() * vocab));
  KV_TRY(model_->forward_mtp(b, I.mtp_src, I.mtp_logits));
  for (size_t k = 0; k < I.mtp_chain.size(); ++k) {
    Req& r = *I.mtp_chain[k].req;
    r.mtp_draft.push_back(Sampler::argmax(
        std::span<const float>(I.mtp_logits.data() + k * size_t(vocab), size_t(vocab))));
    r.mtp_draft_pos = I.mtp_chain[k].pending + 1;
  }
  return {};
}

}  // namespace kvant
