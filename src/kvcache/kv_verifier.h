// KvVerifier: the per-step integrity pass. Before a forward step the engine
// hands it every (sequence, page refs) the step will touch; it compares each
// ref's expected generation with the pool's current one and reports every
// mismatch. One tight loop over the refs, run on its own -- never fused into
// attention -- so the kernels stay oblivious to tags and the check costs one
// load and compare per page. It allocates nothing unless a failure is found.
//
// It does not decide what to do about a failure (the engine aborts that
// sequence) and does not look at page content (checksums are PagePool's).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/page_pool.h"
#include "kvcache/page_ref.h"

namespace kvant {

struct VerifyItem {
  uint64_t sequence = 0;          // opaque id, echoed in failures
  std::span<const PageRef> refs;  // the pages this step reads or writes for it
};

enum class VerifyFault : uint8_t {
  kStaleGeneration = 0,  // the page was freed and reallocated since (or the entry is corrupt)
  kPageFree = 1,         // the page is on the free list
  kBadPage = 2,          // the page id is outside the pool
};
const char* verify_fault_name(VerifyFault f);

struct VerifyFailure {
  uint64_t sequence = 0;
  uint32_t index = 0;  // position of the ref in the item's span
  uint32_t page = 0;
  uint32_t expected_generation = 0;  // what the sequence recorded
  uint32_t actual_generation = 0;    // the pool's (0: free or out of range)
  VerifyFault fault = VerifyFault::kStaleGeneration;
};
// "sequence 7: page 12 (entry 3) generation mismatch: expected 881, found 902"
std::string describe(const VerifyFailure& f);

struct VerifyStats {
  uint64_t passes = 0;      // verify() calls
  uint64_t checks = 0;      // page refs compared
  uint64_t violations = 0;  // failures reported
};

class KvVerifier {
 public:
  explicit KvVerifier(const PagePool& pool) : pool_(pool) {}
  // Appends one failure per bad ref to `out` (not cleared; reserve it to keep
  // a failing step allocation-free too). Returns the number appended.
  size_t verify(std::span<const VerifyItem> items, std::vector<VerifyFailure>& out);
  const VerifyStats& stats() const { return stats_; }

 private:
  const PagePool& pool_;
  VerifyStats stats_;
};

}  // namespace kvant
