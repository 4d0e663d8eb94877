// 64-byte aligned, zero-initialised buffers for weights, activations and
// scratch. No growth after construction: resize means a new buffer.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>

namespace kvant {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) : n_(n) {
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    p_.reset(static_cast<T*>(p));
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
