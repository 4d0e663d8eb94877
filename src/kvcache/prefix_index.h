// PrefixIndex: reuse of full KV pages across sequences that share a token
// prefix. Maps each full page of tokens, keyed by a chained XXH3 hash (the
// previous page's key seeds this page's hash), to the physical page holding
// it. A match is always confirmed by comparing the stored tokens and the
// parent entry, never by the hash alone. The index holds one reference on
// each page it lists; pages held only by the index are evicted in
// least-recently-used order when the pool runs short.
//
// It does not own sequences or decide when to look up or insert (the
// scheduler does), and never writes page content. Single-threaded, like the
// pool. Destroying it does not release its pages: call clear() while the pool
// is alive.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/page_pool.h"
#include "kvcache/page_ref.h"

namespace kvant {

struct PrefixIndexOptions {
  // Seal pages on insert and verify their XXH3 checksum on every reuse; a
  // page whose content changed is dropped from the index and not reused.
  bool verify_checksums = false;
};

struct PrefixStats {
  uint64_t lookups = 0;
  uint64_t hit_pages = 0;    // full pages found and reused
  uint64_t miss_pages = 0;   // full pages of a lookup not found
  uint64_t hit_tokens = 0;   // hit_pages * page_tokens
  uint64_t miss_tokens = 0;  // every other looked-up token, partial tail included
  uint64_t inserted_pages = 0;
  uint64_t evicted_pages = 0;
  uint64_t stale_dropped = 0;      // entries whose page was taken behind the index's back
  uint64_t checksum_failures = 0;  // entries dropped because their content changed
};

class PrefixIndex {
 public:
  explicit PrefixIndex(PagePool& pool, PrefixIndexOptions options = {});
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Finds the longest chain of indexed full pages that starts at tokens[0],
  // retains each page for the caller and appends its ref to `out`. Returns
  // the number of pages matched (tokens covered = pages * page_tokens). The
  // caller keeps at least one token unmatched if it needs that token's logits.
  int64_t lookup(std::span<const int32_t> tokens, std::vector<PageRef>& out);

  // Indexes the full pages of `tokens`; refs[i] holds tokens [i * P, (i+1) * P).
  // Pages already indexed with the same tokens and parent are only touched
  // (the existing page stays the shared one). Each newly indexed page gets one
  // reference from the index. Stops at the first ref that is not current.
  // Returns the number of pages newly indexed.
  int64_t insert(std::span<const int32_t> tokens, std::span<const PageRef> refs);

  // Frees up to n_pages pages held by the index alone, least recently used
  // first (a chain's tail goes before its head). Returns pages freed.
  int64_t evict_for(int64_t n_pages);
  // Pages that evict_for could free now. O(entries log entries) with scratch
  // allocation: for planning and reports, not for every decode step.
  int64_t evictable_pages() const;

  // Drops entries whose page was freed or reallocated without the index (only
  // after a fault; lookups also drop them lazily). Returns entries dropped.
  int64_t drop_stale();
  // Releases every page the index holds and empties it.
  void clear();

  int64_t size() const { return live_; }  // indexed pages
  // Appends every ref the index holds (for PagePool::check_invariants).
  void collect_refs(std::vector<PageRef>& out) const;
  const PrefixStats& stats() const { return stats_; }

 private:
  static constexpr uint32_t kNoParent = UINT32_MAX;
  struct Entry {
    uint64_t key = 0;
    uint64_t serial = 0;         // 0 = unused slot; never reused, so a dead parent never matches
    uint64_t parent_serial = 0;  // 0 for a chain head
    uint32_t parent = kNoParent;
    uint32_t children = 0;  // live entries naming this one as parent
    uint32_t depth = 0;     // page index in its chain
    PageRef ref;
    uint64_t last_used = 0;
  };

  uint32_t find(uint32_t parent, uint64_t parent_serial, uint64_t key,
                std::span<const int32_t> page_tokens) const;
  uint32_t add(uint32_t parent, uint64_t key, std::span<const int32_t> page_tokens, PageRef ref);
  // Removes an entry; releases its page reference when `release` is set.
  void remove(uint32_t slot, bool release);

  PagePool& pool_;
  PrefixIndexOptions options_;
  int64_t page_tokens_;
  std::vector<Entry> entries_;
  std::vector<int32_t> tokens_;  // [entries_.size(), page_tokens]
  std::vector<uint32_t> free_slots_;
  std::unordered_multimap<uint64_t, uint32_t> by_key_;
  std::vector<uint32_t> scratch_;  // eviction candidates, kept to avoid reallocating
  uint64_t clock_ = 0;
  uint64_t next_serial_ = 1;
  int64_t live_ = 0;
  PrefixStats stats_;
};

}  // namespace kvant
