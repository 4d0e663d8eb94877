// Fault injection (see fault_injector.h).
#include "kvcache/fault_injector.h"

#include "core/check.h"

namespace kvant {

PageRef FaultInjector::reassign_page(PageTable& victim, size_t index, PageTable& thief) {
  KV_CHECK_LT(index, victim.pages.size());
  const uint32_t page = victim.pages[index].page;
  pool_.force_free(page);
  // The free list is a stack, so the page just freed is the next one out.
  std::optional<PageRef> r = pool_.allocate();
  KV_CHECK(r.has_value());
  KV_CHECK_EQ(r->page, page);
  thief.pages.push_back(*r);
  ++counts_.reassigned;
  return *r;
}

void FaultInjector::redirect_entry(PageTable& t, size_t index, uint32_t other_page) {
  KV_CHECK_LT(index, t.pages.size());
  KV_CHECK_NE(t.pages[index].page, other_page);
  t.pages[index].page = other_page;
  ++counts_.redirected;
}

void FaultInjector::flip_generation(PageTable& t, size_t index, uint32_t mask) {
  KV_CHECK_LT(index, t.pages.size());
  KV_CHECK_NE(mask, 0u);
  t.pages[index].generation ^= mask;
  ++counts_.flipped;
}

Result<void> FaultInjector::double_free(PageTable& t, size_t index) {
  KV_CHECK_LT(index, t.pages.size());
  const PageRef again = t.pages[index];
  page_table_release(pool_, t);
  ++counts_.double_frees;
  return pool_.release(again);
}

Result<void> FaultInjector::free_while_referenced(PageTable& t, size_t index) {
  KV_CHECK_LT(index, t.pages.size());
  ++counts_.early_frees;
  return pool_.release(t.pages[index]);
}

}  // namespace kvant
