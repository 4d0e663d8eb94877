// Page-table helpers (see page_table.h).
#include "kvcache/page_table.h"

#include "core/check.h"

namespace kvant {

int64_t page_table_pages_needed(const PageTable& t, int64_t new_tokens, int64_t page_tokens) {
  const int64_t want = kv_pages_for_tokens(t.tokens + new_tokens, page_tokens);
  const int64_t have = int64_t(t.pages.size());
  return want > have ? want - have : 0;
}

bool page_table_grow(PagePool& pool, PageTable& t, int64_t new_tokens) {
  KV_CHECK_GE(new_tokens, 0);
  const int64_t need = page_table_pages_needed(t, new_tokens, pool.geometry().page_tokens);
  if (need > pool.free_pages()) return false;
  for (int64_t i = 0; i < need; ++i) {
    // Cannot fail: free_pages() was checked and the pool is single-threaded.
    std::optional<PageRef> r = pool.allocate();
    KV_CHECK(r.has_value());
    t.pages.push_back(*r);
  }
  t.tokens += new_tokens;
  return true;
}

KvSlot page_table_locate(const PageTable& t, int64_t position, int64_t page_tokens) {
  KV_CHECK(position >= 0 && position < int64_t(t.pages.size()) * page_tokens);
  return KvSlot{t.pages[size_t(position / page_tokens)], position % page_tokens};
}

void page_table_truncate(PagePool& pool, PageTable& t, int64_t tokens) {
  KV_CHECK(tokens >= 0 && tokens <= t.tokens);
  const size_t keep = size_t(kv_pages_for_tokens(tokens, pool.geometry().page_tokens));
  while (t.pages.size() > keep) {
    // A stale entry (after a fault) is another holder's; the integrity pass reports it.
    (void)pool.release(t.pages.back());
    t.pages.pop_back();
  }
  t.tokens = tokens;
}

ReleaseCounts page_table_release(PagePool& pool, PageTable& t) {
  ReleaseCounts c;
  for (const PageRef& r : t.pages) {
    if (pool.release(r))
      ++c.released;
    else
      ++c.rejected;
  }
  t.pages.clear();
  t.tokens = 0;
  return c;
}

}  // namespace kvant
