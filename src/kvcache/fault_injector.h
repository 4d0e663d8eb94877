// FaultInjector: deliberately breaks the cache's bookkeeping the ways real bugs
// would, so tests (and a debug mode, off by default) can show the integrity
// machinery catches each one. Faults: (a) a live sequence's page is freed
// behind its back and handed to another sequence, (b) a page-table entry is
// corrupted (points at another page, or its generation has a bit flipped),
// (c) a page is released twice, (d) a page is released while its table still
// lists it.
//
// It only performs faults and counts them; choosing targets and checking
// detection is the caller's job. Never constructed unless fault injection is
// asked for.
#pragma once

#include <cstdint>

#include "core/result.h"
#include "kvcache/page_pool.h"
#include "kvcache/page_table.h"

namespace kvant {

struct FaultCounts {
  uint64_t reassigned = 0;    // (a)
  uint64_t redirected = 0;    // (b) entry points at another page
  uint64_t flipped = 0;       // (b) entry's generation changed
  uint64_t double_frees = 0;  // (c)
  uint64_t early_frees = 0;   // (d)
  uint64_t total() const { return reassigned + redirected + flipped + double_frees + early_frees; }
};

class FaultInjector {
 public:
  explicit FaultInjector(PagePool& pool) : pool_(pool) {}

  // (a) Force-frees victim.pages[index] (whatever its refcount) and allocates
  // it again for `thief`, appending the new ref (new generation) to
  // thief.pages; every holder of the old ref is now stale. Returns the new ref.
  PageRef reassign_page(PageTable& victim, size_t index, PageTable& thief);
  // (b) Points t.pages[index] at `other_page`, keeping the old generation.
  void redirect_entry(PageTable& t, size_t index, uint32_t other_page);
  // (b) XORs t.pages[index].generation with `mask` (non-zero).
  void flip_generation(PageTable& t, size_t index, uint32_t mask);
  // (c) A finishing sequence releases every page, then releases
  // pages[index] once more. Returns the second release's result: an error
  // when the pool catches it on the spot (page free or reallocated); success
  // means another holder lost a reference, left to the invariant checker and
  // to verification of the other holders.
  Result<void> double_free(PageTable& t, size_t index);
  // (d) Releases t.pages[index] but leaves the entry in the table, as if the
  // sequence still used the page.
  Result<void> free_while_referenced(PageTable& t, size_t index);

  const FaultCounts& counts() const { return counts_; }

 private:
  PagePool& pool_;
  FaultCounts counts_;
};

}  // namespace kvant
