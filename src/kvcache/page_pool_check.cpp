// PagePool's integrity helpers that are not on the per-step path: XXH3 content
// checksums of full pages, the invariant checker and the repair used after a
// detected fault (see page_pool.h). The per-step generation check is
// kv_verifier.cpp.
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // XXH3 with the widest vectors the CPU has, chosen at run time
#endif

#include <algorithm>
#include <cstdio>
#include <string>

#include "kvcache/page_pool.h"

namespace kvant {
namespace {

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

uint64_t PagePool::compute_checksum(uint32_t page) const {
  return XXH3_64bits(page_data(page), size_t(layout_.page_bytes));
}

Result<void> PagePool::seal(uint32_t page) {
  if (page >= num_pages_) return make_error("seal: page " + std::to_string(page) + " out of range");
  if (generations_[page] == kFreeGeneration)
    return make_error("seal: page " + std::to_string(page) + " is free");
  checksums_[page] = compute_checksum(page);
  sealed_[page] = 1;
  return {};
}

bool PagePool::sealed(uint32_t page) const { return page < num_pages_ && sealed_[page] != 0; }

Result<void> PagePool::verify_checksum(uint32_t page) const {
  if (page >= num_pages_)
    return make_error("checksum: page " + std::to_string(page) + " out of range");
  if (!sealed_[page])
    return make_error("checksum: page " + std::to_string(page) + " has no checksum (not sealed)");
  const uint64_t now = compute_checksum(page);
  if (now != checksums_[page])
    return make_error("checksum: page " + std::to_string(page) + " content changed: sealed " +
                      hex64(checksums_[page]) + ", now " + hex64(now));
  return {};
}

Result<void> PagePool::check_invariants(std::span<const PageRef> holders,
                                        std::vector<uint32_t>* bad_pages) const {
  constexpr int kMaxListed = 8;
  std::string msg;
  int64_t problems = 0;
  std::vector<uint32_t> bad;
  auto report = [&](uint32_t page, const std::string& what) {
    if (problems < kMaxListed) msg += (msg.empty() ? "" : "; ") + what;
    ++problems;
    if (page < num_pages_) bad.push_back(page);
  };
  const std::string p_ = "page ";

  // Free list: in range, each once, only free pages, and every free page.
  std::vector<uint8_t> on_free_list(num_pages_, 0);
  for (uint32_t p : free_list_) {
    if (p >= num_pages_) {
      report(p, "free list holds out-of-range page " + std::to_string(p));
      continue;
    }
    if (on_free_list[p]++) report(p, "free list holds " + p_ + std::to_string(p) + " twice");
  }
  for (uint32_t p = 0; p < num_pages_; ++p) {
    const bool free = generations_[p] == kFreeGeneration;
    const std::string id = p_ + std::to_string(p);
    if (free != (refcounts_[p] == 0))
      report(p, id + " has generation " + std::to_string(generations_[p]) + " but refcount " +
                    std::to_string(refcounts_[p]));
    if (free && !on_free_list[p]) report(p, id + " is free but not on the free list");
    if (!free && on_free_list[p]) report(p, id + " is referenced but on the free list");
    if (free && sealed_[p]) report(p, id + " is free but sealed");
  }

  // Holders: each current, and per-page counts equal to the refcounts.
  std::vector<uint32_t> held(num_pages_, 0);
  for (const PageRef& r : holders) {
    if (r.page >= num_pages_) {
      report(r.page, "holder names out-of-range page " + std::to_string(r.page));
      continue;
    }
    if (!is_current(r)) {
      report(r.page, "holder of " + p_ + std::to_string(r.page) + " expects generation " +
                         std::to_string(r.generation) + ", page has " +
                         std::to_string(generations_[r.page]));
      continue;
    }
    ++held[r.page];
  }
  for (uint32_t p = 0; p < num_pages_; ++p)
    if (held[p] != refcounts_[p])
      report(p, p_ + std::to_string(p) + " refcount " + std::to_string(refcounts_[p]) + " but " +
                    std::to_string(held[p]) + " holders");

  if (bad_pages) {
    std::sort(bad.begin(), bad.end());
    bad.erase(std::unique(bad.begin(), bad.end()), bad.end());
    *bad_pages = std::move(bad);
  }
  if (problems == 0) return {};
  if (problems > kMaxListed) msg += "; and " + std::to_string(problems - kMaxListed) + " more";
  return make_error("kv pool invariants: " + std::to_string(problems) + " problem(s): " + msg);
}

int64_t PagePool::repair(std::span<const PageRef> holders) {
  std::vector<uint32_t> held(num_pages_, 0);
  for (const PageRef& r : holders)
    if (is_current(r)) ++held[r.page];
  int64_t changed = 0;
  free_list_.clear();
  for (uint32_t p = num_pages_; p > 0; --p) {
    const uint32_t q = p - 1;
    const bool was_free = generations_[q] == kFreeGeneration;
    if (!was_free && held[q] > 0) {
      if (refcounts_[q] != held[q]) ++changed;
      refcounts_[q] = held[q];
      continue;
    }
    if (!was_free || refcounts_[q] != 0 || sealed_[q]) ++changed;
    generations_[q] = kFreeGeneration;
    refcounts_[q] = 0;
    sealed_[q] = 0;
    free_list_.push_back(q);
  }
  return changed;
}

}  // namespace kvant
