// PageRef: one page-table entry, the (physical page, expected generation) pair
// a sequence records for each page it holds. Owns only the type and its
// constants; the rules for generations live with the pool (page_pool.h) and
// docs/FORMATS.md.
#pragma once

#include <cstdint>

namespace kvant {

// Layout (8 bytes, little-endian, no padding):
//   bytes [0, 4)  page        physical page index in the pool's arena
//   bytes [4, 8)  generation  the page's generation when this holder got it;
//                             never 0 in a valid reference
struct PageRef {
  uint32_t page = 0;
  uint32_t generation = 0;
  friend bool operator==(const PageRef&, const PageRef&) = default;
};
static_assert(sizeof(PageRef) == 8, "PageRef is two packed uint32");

// A free page's generation. No allocation ever hands it out, so a reference
// carrying it never verifies.
inline constexpr uint32_t kFreeGeneration = 0;

}  // namespace kvant
