// Heap allocation counting for tests that check a steady state allocates
// nothing. The counter and the replaced global operator new/delete (and
// aligned_alloc, which AlignedBuffer uses) are defined once, in
// engine_sampler_test.cpp; this header only declares them.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/aligned.h"

namespace kvant::testing {

extern std::atomic<bool> g_count_allocs;
extern std::atomic<int64_t> g_allocs;

// Counts the allocations made while it is alive.
class AllocCounter {
 public:
  AllocCounter() : mapped0_(detail::mapped_allocs.load()) {
    g_allocs = 0;
    g_count_allocs = true;
  }
  ~AllocCounter() { g_count_allocs = false; }
  // Heap allocations plus buffers mapped on their own (core/aligned.h).
  int64_t count() const { return g_allocs.load() + (detail::mapped_allocs.load() - mapped0_); }

 private:
  int64_t mapped0_;
};

}  // namespace kvant::testing
