// PagePool: the arena every KV page lives in, and the bookkeeping that says who
// may use which page: a free list, per-page reference counts, per-page
// generations (the integrity tags), optional XXH3 content checksums, and an
// invariant checker. Also the scalar reference for writing and reading one
// token's K/V rows in a page.
//
// It deals in page ids only: it knows nothing of models, requests, sequences
// or prefixes (page_table.h, prefix_index.h and the engine do), and it does not
// verify page tables itself (kv_verifier.h does, in one batched pass).
// Single-threaded: the scheduler owns it; kernels may read page memory
// concurrently through the raw accessors, which touch no bookkeeping.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/aligned.h"
#include "core/result.h"
#include "kvcache/kv_layout.h"
#include "kvcache/page_ref.h"

namespace kvant {

class FaultInjector;

struct PagePoolOptions {
  KvGeometry geometry;
  // Arena size: num_pages when > 0, else as many whole pages as fit in
  // memory_bytes (kv_pages_for_budget).
  int64_t memory_bytes = 0;
  int64_t num_pages = 0;
  // kStatic only: FP32 scales, either one per layer ([layers]) or one per
  // (layer, head) ([layers, kv_heads]); finite and > 0. V scales must be
  // empty with shared_kv (the K scale serves the shared row).
  std::vector<float> static_k_scales = {};
  std::vector<float> static_v_scales = {};
  // Where the arena lives: null, host memory; else a function returning
  // `bytes` zeroed bytes that the host can also read and write (a GPU
  // backend's memory for its KV pages).
  std::function<std::shared_ptr<uint8_t>(size_t bytes)> arena = nullptr;
};

class PagePool {
 public:
  // Largest page count: page ids must fit in uint32 with room for a sentinel.
  static constexpr int64_t kMaxPages = int64_t(1) << 31;

  // Errors: invalid geometry, bad scales, a budget smaller than one page.
  // A unique_ptr because tables, the verifier and the index keep references
  // to the pool: it must not move.
  static Result<std::unique_ptr<PagePool>> create(const PagePoolOptions& options);

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  const KvLayout& layout() const { return layout_; }
  const KvGeometry& geometry() const { return layout_.geometry; }
  int64_t num_pages() const { return int64_t(num_pages_); }
  int64_t free_pages() const { return int64_t(free_list_.size()); }
  int64_t used_pages() const { return num_pages() - free_pages(); }
  int64_t page_bytes() const { return layout_.page_bytes; }
  int64_t arena_bytes() const { return num_pages() * layout_.page_bytes; }
  int64_t capacity_tokens() const { return num_pages() * layout_.geometry.page_tokens; }
  double bytes_per_token() const { return kv_bytes_per_token(layout_); }

  // --- Allocation and reference counts --------------------------------------
  // Pops a free page with refcount 1 and a generation no page has had before
  // (a pool-wide counter; see docs/FORMATS.md for why not per page). nullopt
  // when no page is free -- running out is normal, not an error.
  std::optional<PageRef> allocate();
  // Adds a holder. The ref must be current: a bad id, a free page or a stale
  // generation is an error and changes nothing.
  Result<void> retain(PageRef ref);
  // Drops a holder; at refcount 0 the page returns to the free list with
  // generation kFreeGeneration. Errors (nothing changes): bad id, page already
  // free (double free), stale generation (the page was reallocated since).
  Result<void> release(PageRef ref);

  // 0 (kFreeGeneration) for a free page. Checked id.
  uint32_t generation(uint32_t page) const;
  uint32_t refcount(uint32_t page) const;
  bool is_current(PageRef ref) const {
    return ref.page < num_pages_ && ref.generation != kFreeGeneration &&
           generations_[ref.page] == ref.generation;
  }
  // [num_pages] current generations, for the verification pass.
  const uint32_t* generations() const { return generations_.data(); }

  // --- Page memory (raw; the attention kernel reads pages through these) ----
  uint8_t* page_data(uint32_t page);
  const uint8_t* page_data(uint32_t page) const;
  // [page_tokens, kv_heads, head_dim] elements of the dtype (uint16 BF16 bits
  // or FP8 codes). With shared_kv, v_data returns the K block.
  void* k_data(uint32_t page, int64_t layer);
  void* v_data(uint32_t page, int64_t layer);
  const void* k_data(uint32_t page, int64_t layer) const;
  const void* v_data(uint32_t page, int64_t layer) const;
  // Dynamic mode: [page_tokens, kv_heads] BF16 scales (uint16 bits) inside
  // the page; nullptr in the other modes. v_scales == k_scales with shared_kv.
  uint16_t* k_scales(uint32_t page, int64_t layer);
  uint16_t* v_scales(uint32_t page, int64_t layer);
  const uint16_t* k_scales(uint32_t page, int64_t layer) const;
  const uint16_t* v_scales(uint32_t page, int64_t layer) const;
  // Static mode: [kv_heads] scales of a layer; nullptr in the other modes.
  const float* static_k_scales(int64_t layer) const;
  const float* static_v_scales(int64_t layer) const;

  // Converts one token's FP32 rows (k, v: [kv_heads, head_dim]) into slot
  // `slot` of the page for one layer. v must be nullptr with shared_kv and
  // non-null otherwise. Dynamic mode stores amax/max_finite per head. Writing
  // into a free or sealed page is a bug (checked).
  void write_token(uint32_t page, int64_t slot, int64_t layer, const float* k, const float* v);
  // Dequantizes slot `slot` back to FP32 ([kv_heads, head_dim] each). v may be
  // nullptr; with shared_kv it receives the K row.
  void read_token(uint32_t page, int64_t slot, int64_t layer, float* k, float* v) const;

  // --- Content checksums (optional) -----------------------------------------
  // XXH3-64 of the page's page_bytes bytes, stored when the page is full. A
  // sealed page must not be written until it is freed (release unseals).
  Result<void> seal(uint32_t page);
  bool sealed(uint32_t page) const;
  // Recomputes and compares; errors name the page and both checksums.
  Result<void> verify_checksum(uint32_t page) const;
  uint64_t compute_checksum(uint32_t page) const;

  // --- Invariants ------------------------------------------------------------
  // `holders` lists every live reference the caller knows of: all page-table
  // entries of all sequences plus the prefix index's entries. Checks: the free
  // list holds exactly the free pages, once each; a page is free (generation 0,
  // refcount 0, unsealed) xor referenced (generation != 0, refcount > 0); every
  // holder is current; each page's refcount equals its number of holders.
  // The error lists the first problems; bad_pages (if given) receives every
  // page involved, sorted, once each.
  Result<void> check_invariants(std::span<const PageRef> holders,
                                std::vector<uint32_t>* bad_pages = nullptr) const;
  // Recovery after a detected fault (debug/test): trusts `holders` as the
  // complete list, sets each page's refcount to its number of current holders,
  // frees pages no one holds, and rebuilds the free list. Returns how many pages
  // changed. Stale holders are ignored: they no longer own anything.
  int64_t repair(std::span<const PageRef> holders);

  struct Stats {
    uint64_t allocations = 0;
    uint64_t releases = 0;        // successful
    uint64_t release_errors = 0;  // double free, stale or bad id
  };
  const Stats& stats() const { return stats_; }

 private:
  friend class FaultInjector;
  PagePool(const KvLayout& layout, uint32_t num_pages,
           const std::function<std::shared_ptr<uint8_t>(size_t)>& arena);
  // Frees a page whatever its refcount (fault injection only).
  void force_free(uint32_t page);
  void free_page(uint32_t page);
  Result<void> check_ref(PageRef ref, const char* what) const;
  int64_t block_offset(uint32_t page, int64_t layer) const;

  KvLayout layout_;
  uint32_t num_pages_ = 0;
  AlignedBuffer<uint8_t> arena_;       // [num_pages, page_bytes] in host memory, or
  std::shared_ptr<uint8_t> ext_arena_;  // ... from PagePoolOptions::arena
  uint8_t* base_ = nullptr;             // whichever holds the pages
  std::vector<uint32_t> generations_;  // [num_pages]; 0 = free
  std::vector<uint32_t> refcounts_;    // [num_pages]
  std::vector<uint32_t> free_list_;    // stack; capacity num_pages, never reallocates
  std::vector<uint64_t> checksums_;    // [num_pages], valid where sealed_
  std::vector<uint8_t> sealed_;        // [num_pages]
  std::vector<float> static_k_;        // [layers, kv_heads] (kStatic)
  std::vector<float> static_v_;        // [layers, kv_heads] (kStatic, !shared_kv)
  uint32_t next_generation_ = 1;
  Stats stats_;
};

}  // namespace kvant
