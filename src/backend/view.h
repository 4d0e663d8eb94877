// Plain views over activation memory, the only form in which the backend's
// operations take tensors: a pointer, a shape and a row stride, the element
// type given by T (float for FP32 activations, uint16_t for BF16 rows).
// Views own nothing and never allocate; a backend may place the memory
// wherever it computes (host memory for the CPU backend).
#pragma once

#include <cstdint>

namespace kvant::backend {

// A row-major matrix [rows, cols] whose row r starts at data + r * ld.
template <class T>
struct View {
  T* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;

  T* row(int64_t r) const { return data + r * ld; }
  // Rows [r0, r0 + n).
  View sub_rows(int64_t r0, int64_t n) const { return {data + r0 * ld, n, cols, ld}; }
  // Columns [c0, c0 + n) of every row.
  View sub_cols(int64_t c0, int64_t n) const { return {data + c0, rows, n, ld}; }
  operator View<const T>() const { return {data, rows, cols, ld}; }
};

using F32 = View<float>;
using CF32 = View<const float>;
using BF16 = View<uint16_t>;
using CBF16 = View<const uint16_t>;

// A dense [rows, cols] view (ld = cols).
template <class T>
View<T> dense(T* p, int64_t rows, int64_t cols) {
  return {p, rows, cols, cols};
}

}  // namespace kvant::backend
