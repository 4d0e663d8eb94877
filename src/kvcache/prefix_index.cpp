// Prefix index over full pages (see prefix_index.h).
//
// Eviction order relies on one property: an entry's last_used is never older
// than any of its children's, because lookup and insert walk chains from the
// head and stamp every entry they pass with the same clock. Sorting candidates
// by (last_used, deeper first) therefore puts every child before its parent,
// and one pass frees a chain tail-first.
#include "kvcache/prefix_index.h"

#include <xxhash.h>

#include <algorithm>

#include "core/check.h"

namespace kvant {
namespace {

// Seed of the first page's hash; later pages are seeded with the previous key.
constexpr uint64_t kPrefixSeed = 0x6b76616e74707278ull;  // "kvantprx"

uint64_t chain_key(uint64_t prev, std::span<const int32_t> page) {
  return XXH3_64bits_withSeed(page.data(), page.size_bytes(), prev);
}

}  // namespace

PrefixIndex::PrefixIndex(PagePool& pool, PrefixIndexOptions options)
    : pool_(pool), options_(options), page_tokens_(pool.geometry().page_tokens) {}

uint32_t PrefixIndex::find(uint32_t parent, uint64_t parent_serial, uint64_t key,
                           std::span<const int32_t> page) const {
  auto [lo, hi] = by_key_.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    const uint32_t s = it->second;
    const Entry& e = entries_[s];
    if (e.parent != parent || e.parent_serial != parent_serial) continue;
    const int32_t* stored = tokens_.data() + int64_t(s) * page_tokens_;
    if (std::equal(page.begin(), page.end(), stored)) return s;
  }
  return kNoParent;
}

uint32_t PrefixIndex::add(uint32_t parent, uint64_t key, std::span<const int32_t> page,
                          PageRef ref) {
  uint32_t s;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    s = uint32_t(entries_.size());
    entries_.emplace_back();
    tokens_.resize(tokens_.size() + size_t(page_tokens_));
  }
  Entry& e = entries_[s];
  e.key = key;
  e.serial = next_serial_++;
  e.parent = parent;
  e.parent_serial = parent == kNoParent ? 0 : entries_[parent].serial;
  e.children = 0;
  e.depth = parent == kNoParent ? 0 : entries_[parent].depth + 1;
  e.ref = ref;
  e.last_used = clock_;
  std::copy(page.begin(), page.end(), tokens_.begin() + int64_t(s) * page_tokens_);
  if (parent != kNoParent) ++entries_[parent].children;
  by_key_.emplace(key, s);
  ++live_;
  return s;
}

void PrefixIndex::remove(uint32_t slot, bool release) {
  Entry& e = entries_[slot];
  KV_CHECK_NE(e.serial, uint64_t(0));
  auto [lo, hi] = by_key_.equal_range(e.key);
  for (auto it = lo; it != hi; ++it)
    if (it->second == slot) {
      by_key_.erase(it);
      break;
    }
  if (e.parent != kNoParent && entries_[e.parent].serial == e.parent_serial)
    --entries_[e.parent].children;
  // A failed release means the page is no longer the index's (taken by a
  // fault); there is nothing to give back.
  if (release) (void)pool_.release(e.ref);
  e.serial = 0;
  free_slots_.push_back(slot);
  --live_;
}

int64_t PrefixIndex::lookup(std::span<const int32_t> tokens, std::vector<PageRef>& out) {
  ++clock_;
  ++stats_.lookups;
  const int64_t full = int64_t(tokens.size()) / page_tokens_;
  uint32_t parent = kNoParent;
  uint64_t parent_serial = 0, key = kPrefixSeed;
  int64_t matched = 0;
  for (int64_t i = 0; i < full; ++i) {
    auto page = tokens.subspan(size_t(i * page_tokens_), size_t(page_tokens_));
    key = chain_key(key, page);
    const uint32_t s = find(parent, parent_serial, key, page);
    if (s == kNoParent) break;
    Entry& e = entries_[s];
    if (!pool_.is_current(e.ref)) {
      ++stats_.stale_dropped;
      remove(s, false);
      break;
    }
    if (options_.verify_checksums && !pool_.verify_checksum(e.ref.page)) {
      ++stats_.checksum_failures;
      remove(s, true);
      break;
    }
    auto r = pool_.retain(e.ref);
    KV_CHECK(r.ok());  // the ref is current, so only a refcount overflow could fail
    e.last_used = clock_;
    out.push_back(e.ref);
    parent = s;
    parent_serial = e.serial;
    ++matched;
  }
  stats_.hit_pages += uint64_t(matched);
  stats_.miss_pages += uint64_t(full - matched);
  stats_.hit_tokens += uint64_t(matched * page_tokens_);
  stats_.miss_tokens += uint64_t(int64_t(tokens.size()) - matched * page_tokens_);
  return matched;
}

int64_t PrefixIndex::insert(std::span<const int32_t> tokens, std::span<const PageRef> refs) {
  ++clock_;
  const int64_t full = std::min<int64_t>(int64_t(tokens.size()) / page_tokens_, refs.size());
  uint32_t parent = kNoParent;
  uint64_t parent_serial = 0, key = kPrefixSeed;
  int64_t added = 0;
  for (int64_t i = 0; i < full; ++i) {
    auto page = tokens.subspan(size_t(i * page_tokens_), size_t(page_tokens_));
    key = chain_key(key, page);
    uint32_t s = find(parent, parent_serial, key, page);
    if (s != kNoParent && !pool_.is_current(entries_[s].ref)) {
      ++stats_.stale_dropped;
      remove(s, false);
      s = kNoParent;
    }
    if (s == kNoParent) {
      const PageRef ref = refs[size_t(i)];
      if (!pool_.is_current(ref)) break;
      auto r = pool_.retain(ref);
      KV_CHECK(r.ok());
      if (options_.verify_checksums && !pool_.sealed(ref.page)) {
        auto sr = pool_.seal(ref.page);
        KV_CHECK(sr.ok());
      }
      s = add(parent, key, page, ref);
      ++added;
      ++stats_.inserted_pages;
    }
    entries_[s].last_used = clock_;
    parent = s;
    parent_serial = entries_[s].serial;
  }
  return added;
}

int64_t PrefixIndex::evict_for(int64_t n_pages) {
  if (n_pages <= 0) return 0;
  drop_stale();
  scratch_.clear();
  for (uint32_t s = 0; s < entries_.size(); ++s) {
    const Entry& e = entries_[s];
    if (e.serial != 0 && pool_.refcount(e.ref.page) == 1) scratch_.push_back(s);
  }
  std::sort(scratch_.begin(), scratch_.end(), [&](uint32_t a, uint32_t b) {
    const Entry &x = entries_[a], &y = entries_[b];
    if (x.last_used != y.last_used) return x.last_used < y.last_used;
    if (x.depth != y.depth) return x.depth > y.depth;
    return a < b;
  });
  int64_t freed = 0;
  for (uint32_t s : scratch_) {
    if (freed >= n_pages) break;
    if (entries_[s].children != 0) continue;  // a descendant is still in use
    remove(s, true);
    ++freed;
  }
  stats_.evicted_pages += uint64_t(freed);
  return freed;
}

int64_t PrefixIndex::evictable_pages() const {
  // Counts entries held by the index alone whose every descendant is too,
  // visiting deeper entries first.
  std::vector<uint32_t> order;
  std::vector<uint32_t> blocked(entries_.size(), 0);
  for (uint32_t s = 0; s < entries_.size(); ++s)
    if (entries_[s].serial != 0) order.push_back(s);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return entries_[a].depth > entries_[b].depth; });
  int64_t n = 0;
  for (uint32_t s : order) {
    const Entry& e = entries_[s];
    const bool alone = pool_.is_current(e.ref) && pool_.refcount(e.ref.page) == 1;
    if (alone && !blocked[s])
      ++n;
    else if (e.parent != kNoParent && entries_[e.parent].serial == e.parent_serial)
      blocked[e.parent] = 1;
  }
  return n;
}

int64_t PrefixIndex::drop_stale() {
  int64_t n = 0;
  for (uint32_t s = 0; s < entries_.size(); ++s)
    if (entries_[s].serial != 0 && !pool_.is_current(entries_[s].ref)) {
      remove(s, false);
      ++n;
    }
  stats_.stale_dropped += uint64_t(n);
  return n;
}

void PrefixIndex::clear() {
  for (uint32_t s = 0; s < entries_.size(); ++s)
    if (entries_[s].serial != 0) remove(s, true);
  entries_.clear();
  tokens_.clear();
  free_slots_.clear();
  by_key_.clear();
}

void PrefixIndex::collect_refs(std::vector<PageRef>& out) const {
  for (const Entry& e : entries_)
    if (e.serial != 0) out.push_back(e.ref);
}

}  // namespace kvant
