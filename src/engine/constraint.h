// What a request's output must look like, enforced while sampling: before
// each draw the engine asks the request's TokenConstraint which tokens may
// come next (the others' logits become -inf), and after it tells the
// constraint which token was drawn. Structured output (JSON schemas, regular
// expressions, choice lists) and forced tool calls are constraints
// (grammar/token_constraint.h); the engine knows only this interface. A
// constraint belongs to one request and is used by the engine's stepping
// thread alone.
#pragma once

#include <cstdint>
#include <span>

#include "core/result.h"

namespace kvant {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits of every token that may not come next to -inf (ids at
  // or above the tokenizer's vocabulary too). End-of-generation tokens stay
  // only where the output may end. Fails when no token may come next.
  virtual Result<void> mask(std::span<float> logits) = 0;
  // Moves past `token`, which mask() allowed. Fails on a token it did not.
  virtual Result<void> accept(int32_t token) = 0;
};

}  // namespace kvant
