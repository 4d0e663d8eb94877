// `kvant eval` over several processes (mpirun, --tp / --ep). Rank 0 runs the
// tasks as one process does: data, tokenization, resume log, progress, KL
// files and results are its alone. The other ranks hold their share of the
// model and run only what every rank must run together, in the order rank
// 0 runs it, which rank 0 tells them over the communicator (EvalLink):
//   load    load the model and its scorer (each rank its own slice, its own
//           heads' static KV scales);
//   score   one LoglikScorer::score call (context and continuations);
//   window  one LoglikScorer::window call (tokens and the first scored position);
//   engine  make the generation engine and follow rank 0's until rank 0's
//           goes away (GSM8K);
//   stop    rank 0 is done (with its exit status).
// The scorer's state (the cached prefix) then evolves the same on every
// rank, so every forward is the same collective everywhere. Followers need
// the model files at the same path, nothing else (no data, no output files).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/result.h"

namespace kvant::dist {
class Communicator;
}

namespace kvant::eval {

struct Ctx;

enum class EvalOp : int64_t { kLoad = 1, kScore = 2, kWindow = 3, kEngine = 4, kStop = 5 };

class EvalLink {
 public:
  explicit EvalLink(dist::Communicator& comm) : comm_(comm) {}
  int rank() const;

  // Rank 0: tell the others what comes next.
  Result<void> send(EvalOp op, std::span<const int32_t> payload = {});
  Result<void> send_score(std::span<const int32_t> context,
                          const std::vector<std::vector<int32_t>>& continuations);
  Result<void> send_window(std::span<const int32_t> tokens, int64_t first);

  // Other ranks: the next message.
  struct Message {
    EvalOp op = EvalOp::kStop;
    std::vector<int32_t> data;
  };
  Result<Message> receive();

  // Payload decoders (the inverse of send_score / send_window).
  static Result<void> decode_score(std::span<const int32_t> data, std::vector<int32_t>& context,
                                   std::vector<std::vector<int32_t>>& continuations);
  static Result<void> decode_window(std::span<const int32_t> data, std::vector<int32_t>& tokens,
                                    int64_t& first);

 private:
  dist::Communicator& comm_;
};

// A rank other than 0: runs what rank 0 sends until it sends stop; returns
// rank 0's exit status. c.load_model and c.make_engine load what this rank
// holds. Errors: the transport failed or a message made no sense (the
// caller then ends every rank).
Result<int> follow_eval(Ctx& c, EvalLink& link);

}  // namespace kvant::eval
