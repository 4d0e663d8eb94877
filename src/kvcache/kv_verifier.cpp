// The batched generation check (see kv_verifier.h).
#include "kvcache/kv_verifier.h"

namespace kvant {
namespace {

// Fast path: no branch on the data, so the loop runs at load throughput. A
// ref is bad when its page is out of range, its generation differs from the
// pool's, or it carries the free generation (0 would otherwise match a free
// page). Out-of-range ids read slot 0 instead of memory past the table.
bool span_is_clean(const uint32_t* gens, uint32_t n, const PageRef* refs, size_t count) {
  uint32_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const PageRef r = refs[i];
    const bool in_range = r.page < n;
    const uint32_t actual = gens[in_range ? r.page : 0];
    bad |= uint32_t(!in_range) | uint32_t(actual != r.generation) |
           uint32_t(r.generation == kFreeGeneration);
  }
  return bad == 0;
}

}  // namespace

const char* verify_fault_name(VerifyFault f) {
  switch (f) {
    case VerifyFault::kStaleGeneration:
      return "generation mismatch";
    case VerifyFault::kPageFree:
      return "page is free";
    case VerifyFault::kBadPage:
      return "page id out of range";
  }
  return "?";
}

std::string describe(const VerifyFailure& f) {
  return "sequence " + std::to_string(f.sequence) + ": page " + std::to_string(f.page) +
         " (entry " + std::to_string(f.index) + ") " + verify_fault_name(f.fault) +
         ": expected generation " + std::to_string(f.expected_generation) + ", found " +
         std::to_string(f.actual_generation);
}

size_t KvVerifier::verify(std::span<const VerifyItem> items, std::vector<VerifyFailure>& out) {
  const uint32_t* gens = pool_.generations();
  const uint32_t n = uint32_t(pool_.num_pages());
  size_t found = 0;
  uint64_t checked = 0;
  for (const VerifyItem& item : items) {
    checked += item.refs.size();
    if (span_is_clean(gens, n, item.refs.data(), item.refs.size())) [[likely]]
      continue;
    // Slow path, only for a failing sequence: name every bad entry.
    for (size_t i = 0; i < item.refs.size(); ++i) {
      const PageRef r = item.refs[i];
      VerifyFailure f{item.sequence, uint32_t(i), r.page,
                      r.generation,  0,           VerifyFault::kStaleGeneration};
      if (r.page >= n) {
        f.fault = VerifyFault::kBadPage;
      } else {
        f.actual_generation = gens[r.page];
        if (f.actual_generation == kFreeGeneration)
          f.fault = VerifyFault::kPageFree;
        else if (f.actual_generation == r.generation)
          continue;
      }
      out.push_back(f);
      ++found;
    }
  }
  ++stats_.passes;
  stats_.checks += checked;
  stats_.violations += found;
  return found;
}

}  // namespace kvant
