// When a request's generation ends, and what text its client sees on the
// way: stop token ids (with the tokenizer's end-of-generation ids), stop
// strings that may span token boundaries, and max_tokens. Owns the finish
// reasons and the hold-back of text that could still become a stop string;
// it does not own sampling (sampler.h), the transport of text to the client,
// or finishes decided elsewhere (abort, error, context full), which it is
// only told about through StopMatcher::finish.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/tokenizer.h"

namespace kvant {

// Every finished request has one; None while it runs.
enum class FinishReason : uint8_t { None, Stop, Length, Abort, Error };
// "stop", "length", "abort", "error" (the API's spelling); "" for None.
std::string_view finish_reason_name(FinishReason r);

inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

// Text-only stop-string search over a stream of pieces. The answer does not
// depend on how the text is cut into pieces: a match is the stop string that
// ends first in the text (of two ending at the same byte, the longer), and
// text is released as soon as no stop string can begin in it. Matching is
// bytewise, so a stop string split inside a UTF-8 character still matches;
// and since held text starts where a stop string starts, released text never
// ends inside a character that was whole in the input.
class StopStringMatcher {
 public:
  // Empty strings are ignored; duplicates report the first index.
  explicit StopStringMatcher(std::span<const std::string> stops);

  struct Step {
    std::string_view text;  // safe to show now; valid until the next call
    int32_t matched = -1;   // index of the stop string found, or -1
  };
  // Appends `piece`. On a match, `text` ends where the stop string begins and
  // everything after it is dropped; the matcher then stays done and later
  // calls return nothing. With `last`, no more text follows: whatever is
  // held back is released.
  Step push(std::string_view piece, bool last = false);

  size_t held_bytes() const { return held_.size(); }
  bool done() const { return done_; }

 private:
  // Aho-Corasick over bytes: node 0 is the root; children kept as
  // (byte, node) lists since stop strings are few and short. A node's depth
  // is the length of the stop-string prefix it spells, which is exactly how
  // much text must be held back when the scan ends there.
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;
    int32_t fail = 0;
    int32_t depth = 0;
    int32_t out = -1;  // longest stop string ending here (itself or via fail), -1 = none
  };
  int32_t child(int32_t node, uint8_t b) const;
  int32_t advance(int32_t node, uint8_t b) const;

  std::vector<Node> nodes_;
  std::vector<int32_t> lengths_;  // [stop string] bytes
  int32_t state_ = 0;
  bool done_ = false;
  std::string held_;
  std::string out_;
};

struct StopParams {
  std::vector<std::string> stop;        // stop strings, not shown to the client
  std::vector<int32_t> stop_token_ids;  // in addition to the tokenizer's eog ids
  bool ignore_eos = false;              // do not stop on eog ids (benchmarks)
  int32_t max_tokens = 0;               // generated tokens; <= 0 = no limit here
  bool skip_special_tokens = true;      // control tokens add no text
};

// An error naming what is wrong (too many or too long stop strings, an empty
// one, a negative token id), for a client's bad request.
Result<void> check_stop_params(const StopParams& p);

// Per-token stop logic for one request, with its own streaming detokenizer.
// For each sampled token, call step(); show `text`; when `finish` is not
// None the request is over (later calls return no text and the same
// reason). A stop token's own text is never shown; held-back text is
// released on every finish except a stop-string match, where the stop
// string and what follows are dropped. A stop token or string ending the
// max_tokens-th token makes the reason Stop, not Length.
class StopMatcher {
 public:
  // `tokenizer` must outlive the matcher (its decoder keeps a pointer).
  StopMatcher(const StopParams& p, const Tokenizer& tokenizer);

  struct Step {
    std::string_view text;  // valid until the next call
    FinishReason finish = FinishReason::None;
    int32_t stop_token = -1;   // the id that stopped it, if one did
    int32_t stop_string = -1;  // index into StopParams::stop, if one did
  };
  Step step(int32_t token);
  // A finish decided outside (abort, error, the context is full: length):
  // releases held-back text. Once finished, returns the reason it ended with.
  Step finish(FinishReason reason);

  bool is_stop_token(int32_t token) const;
  int32_t generated() const { return generated_; }
  FinishReason finish_reason() const { return finish_; }

 private:
  Step end(std::string_view tail, FinishReason reason);

  std::vector<int32_t> stop_ids_;  // sorted, unique
  int32_t max_tokens_;
  StreamDecoder decoder_;
  StopStringMatcher strings_;
  int32_t generated_ = 0;
  FinishReason finish_ = FinishReason::None;
};

}  // namespace kvant
