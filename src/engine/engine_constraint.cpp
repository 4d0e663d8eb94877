// Output constraints in the sampling step (engine.h, Request::constraint):
// tokens that do not fit the required output are masked before the sampler
// sees the row, and the drawn token moves the constraint on. A constraint
// that fails ends its request with the reason; the step goes on.
#include "engine/engine_internal.h"

namespace kvant {

bool Engine::constrain(Req& r, std::span<float> row, size_t i, int32_t token) {
  auto& I = *impl_;
  Result<void> ok = token < 0 ? r.request.constraint->mask(row) : r.request.constraint->accept(token);
  if (ok.ok()) return true;
  // The scheduler still takes a token for the sequence, which ends now.
  I.sampled[i] = token < 0 ? Sampler::argmax(row) : token;
  r.done = true;
  emit(r, -1, "", nullptr, FinishReason::Error, ok.error().message, ErrorCode::kConstraint);
  I.to_finish.push_back(&r);
  return false;
}

}  // namespace kvant
