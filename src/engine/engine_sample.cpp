// The sampling part of the engine step: a token drawn for every chunk that
// ends its sequence's tokens (constraint, sampler, stop logic, events).
#include "engine/engine_internal.h"

namespace kvant {

// Samples a token for every chunk that ends its sequence's tokens, runs the
// stop logic and streams the events; requests that end go to to_finish, to
// be let go after the scheduler's commit.
void Engine::sample_and_stream(const StepPlan& plan, int64_t vocab) {
  auto& I = *impl_;
  I.to_finish.clear();
  for (size_t j = 0; j < I.batch_index.size(); ++j) {
    const size_t i = I.batch_index[j];
    const auto& e = plan.sequences[i];
    if (!e.samples) continue;
    if (j > 0 && I.batch_index[j - 1] == i) continue;  // a drafted entry's later rows
    Req& r = *I.by_seq[e.id];
    if (e.draft > 0) {
      sample_drafted(r, e, i, size_t(I.row0[j]), vocab);
      continue;
    }
    const int64_t last_row = I.row0[j] + I.batch.seqs[j].logit_count() - 1;
    std::span<float> row(I.logits.data() + size_t(last_row) * size_t(vocab), size_t(vocab));
    if (r.request.prompt_only) {
      // The prompt is computed: the request ends without a token. The
      // scheduler's sequence (max_tokens 1) takes the argmax and finishes.
      const int32_t tok = Sampler::argmax(row);
      I.sampled[i] = tok;
      r.done = true;
      emit(r, -1, "", nullptr, FinishReason::Length, "");
      I.to_finish.push_back(&r);
      continue;
    }
    int32_t tok = -1;
    (void)draw_token(r, e.pages, i, row, tok);
  }
}

bool Engine::draw_token(Req& r, std::span<const PageRef> pages, size_t i, std::span<float> row,
                        int32_t& tok) {
  auto& I = *impl_;
  StepLogprobs* lp = r.request.logprobs ? &r.lp : nullptr;
  tok = -1;
  if (r.request.constraint && !constrain(r, row, i, -1)) return false;
  tok = r.sampler.sample(row, lp);
  r.sampler.accept(tok);
  if (r.request.constraint && !constrain(r, row, i, tok)) return false;
  if (r.request.handoff && !r.handoff_out) capture_handoff(r, tok, pages, lp);
  I.sampled[i] = tok;
  ++r.completion_tokens;
  ++I.stats.generated_tokens;
  auto st = r.stop.step(tok);
  if (st.finish != FinishReason::None) {
    // The last token's event carries the finish; the scheduler lets the
    // sequence go after commit.
    r.done = true;
    if (r.handoff_out && model_->config().mtp_layers > 0) {
      // Its pages go out with this event: after the MTP pass has written
      // its rows for them (run_plan, refresh_handoffs).
      r.deferred_final = {tok, std::string(st.text), st.finish};
      I.to_finish.push_back(&r);
      return false;
    }
    emit(r, tok, st.text, lp, st.finish, "");
    I.to_finish.push_back(&r);
    return false;
  }
  emit(r, tok, st.text, lp, FinishReason::None, "");
  return true;
}

}  // namespace kvant
