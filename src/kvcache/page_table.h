// PageTable: one sequence's view of the cache -- the (page, generation) pairs
// it holds, in token order, and how many tokens are written. Plain data plus
// helpers that grow a table by whole pages, locate a token, and give every
// page back. It does not know what a sequence is (the engine does) nor verify
// itself (kv_verifier.h); the pool owns the pages.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/page_pool.h"
#include "kvcache/page_ref.h"

namespace kvant {

struct PageTable {
  std::vector<PageRef> pages;  // pages[i] holds tokens [i * page_tokens, (i + 1) * page_tokens)
  int64_t tokens = 0;          // tokens written; <= pages.size() * page_tokens
};

inline int64_t kv_pages_for_tokens(int64_t tokens, int64_t page_tokens) {
  return (tokens + page_tokens - 1) / page_tokens;
}

// Pages the table must gain to hold `new_tokens` more tokens.
int64_t page_table_pages_needed(const PageTable& t, int64_t new_tokens, int64_t page_tokens);

// Allocates the pages needed for `new_tokens` more tokens and advances
// t.tokens. All or nothing: returns false and changes nothing when the pool
// has too few free pages (the caller may evict prefix pages or preempt, then
// retry). Appending may grow t.pages' vector; reserve it for a no-allocation
// decode loop.
bool page_table_grow(PagePool& pool, PageTable& t, int64_t new_tokens);

// Where token `position` lives.
struct KvSlot {
  PageRef ref;
  int64_t slot = 0;  // index within the page, [0, page_tokens)
};
KvSlot page_table_locate(const PageTable& t, int64_t position, int64_t page_tokens);

// Shrinks the table to its first `tokens` tokens (<= t.tokens), giving back
// the pages past them (speculative decoding drops the K/V rows of rejected
// draft tokens this way). Rows past `tokens` in the last kept page stay as
// they are: they are overwritten before anything reads them.
void page_table_truncate(PagePool& pool, PageTable& t, int64_t tokens);

struct ReleaseCounts {
  int64_t released = 0;
  int64_t rejected = 0;  // stale, free or out-of-range entries: not this table's to free
};
// Gives every page back and empties the table. A rejected entry is left to
// its real owner -- freeing it would take a page from another sequence.
ReleaseCounts page_table_release(PagePool& pool, PageTable& t);

}  // namespace kvant
