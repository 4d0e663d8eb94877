// When a request offers a draft (speculative.h). A draft row costs a step
// about as much as any other row once the batch makes the step compute-bound
// rather than bandwidth-bound, so what a draft is worth depends on both the
// request's record and the batch:
//  - a wholly rejected draft pauses drafting for 1, 2, 4, then 8 steps (each
//    further miss in a row doubles the pause, up to 8); an accepted token
//    ends the run of misses;
//  - the request's acceptance rate (draft tokens accepted over fed, a moving
//    average starting at 1) must reach a bar that rises with the number of
//    running requests: none up to 2, then 0.05 per request from 0.2, at
//    most 0.75 (0.6 at 8 requests). Open-ended chat (about half accepted)
//    then drafts alone but not in a batch of 8, where copying text (about
//    0.8) still does.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvant {

struct SpeculativePacer {
  int32_t misses = 0;  // wholly rejected drafts in a row
  int32_t pause = 0;   // steps left without drafting
  float rate = 1.f;    // moving average of accepted / fed draft tokens

  static float bar(int64_t running) {
    return running <= 2 ? 0.f : std::min(0.75f, 0.2f + 0.05f * float(running));
  }
  bool may_draft(int64_t running) {
    if (pause > 0) {
      --pause;
      return false;
    }
    return rate >= bar(running);
  }
  // What may_draft would answer next, without counting a pause down.
  bool would_draft(int64_t running) const { return pause == 0 && rate >= bar(running); }
  void record(int64_t fed, int64_t accepted) {
    if (fed <= 0) return;
    rate = 0.7f * rate + 0.3f * float(accepted) / float(fed);
    if (accepted > 0) {
      misses = 0;
      return;
    }
    ++misses;
    pause = misses >= 4 ? 8 : 1 << (misses - 1);
  }
};

}  // namespace kvant
