// 64-byte aligned, zero-initialised buffers for weights, activations and
// scratch. No growth after construction: resize means a new buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvant {

// Buffers of at least kHugeBytes (KV arenas, large weights, scratch at long
// context) are mapped on their own, 2 MiB aligned, and offered to transparent
// huge pages (MADV_HUGEPAGE: honoured where THP is "always" or "madvise").
// The mapping is the buffer's length rounded up to 4 KiB only, so the whole
// 2 MiB stretches inside it can be huge pages and the tail stays in small
// pages: no buffer costs more than 4 KiB beyond its length (rounding each of
// thousands of expert matrices up to 2 MiB would). Decode attention visits a
// KV page block per 16 tokens scattered over the arena; with 4 KiB pages
// nearly every visit is a TLB miss and a page walk (paged_attn_depth in
// kvant_bench_kernels shows it). Smaller buffers come from aligned_alloc as
// before. Either way the memory is zeroed, which also commits it now rather
// than at first use mid-serving.
inline constexpr size_t kHugeBytes = size_t(2) << 20;

namespace detail {
// Buffers mapped so far (tests that check a steady state allocates nothing
// count these beside the heap's).
inline std::atomic<int64_t> mapped_allocs{0};

// Whether a buffer of `bytes` is mapped on its own (and how long the mapping
// is: bytes rounded up to 4 KiB), or 0 for aligned_alloc.
inline size_t mapped_bytes(size_t bytes) {
#if defined(__linux__)
  constexpr size_t kPage = 4096;  // a multiple of the base page on every Linux target
  if (bytes >= kHugeBytes) return (bytes + kPage - 1) / kPage * kPage;
#endif
  return 0;
}
inline void* alloc_zeroed(size_t bytes) {
#if defined(__linux__)
  if (const size_t len = mapped_bytes(bytes)) {
    // Over-map by one huge page and trim to start at a 2 MiB boundary.
    void* raw = mmap(nullptr, len + kHugeBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t b = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t a = (b + kHugeBytes - 1) / kHugeBytes * kHugeBytes;  // b's pages are 4 KiB aligned
    if (a > b) munmap(raw, a - b);
    munmap(reinterpret_cast<void*>(a + len), b + kHugeBytes - a);  // the rest past a + len
    void* p = reinterpret_cast<void*>(a);
    mapped_allocs.fetch_add(1, std::memory_order_relaxed);
    madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP it fails harmlessly
    std::memset(p, 0, bytes);         // commit (fresh anonymous memory reads as zero)
    return p;
  }
#endif
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return p;
}
// Frees what alloc_zeroed(bytes) returned.
inline void free_aligned(void* p, size_t bytes) {
#if defined(__linux__)
  if (const size_t len = mapped_bytes(bytes)) {
    munmap(p, len);
    return;
  }
#endif
  std::free(p);
}
}  // namespace detail

struct AlignedFree {
  size_t bytes = 0;  // as allocated
  void operator()(void* p) const { detail::free_aligned(p, bytes); }
};

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) : n_(n) {
    if (n == 0) return;
    void* p = detail::alloc_zeroed(n * sizeof(T));
    p_ = std::unique_ptr<T, AlignedFree>(static_cast<T*>(p), AlignedFree{n * sizeof(T)});
  }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) { return p_.get()[i]; }
  const T& operator[](size_t i) const { return p_.get()[i]; }
  std::span<T> span() { return {p_.get(), n_}; }
  std::span<const T> span() const { return {p_.get(), n_}; }

 private:
  std::unique_ptr<T, AlignedFree> p_;
  size_t n_ = 0;
};

}  // namespace kvant
