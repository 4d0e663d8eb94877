// The CUDA backend's kernels as plain host-callable launchers (cuda_kernels.cu):
// every pointer here is device-accessible memory (device or managed), every
// launch goes to the given stream and returns without waiting. The structs
// are plain data shared by host and device code. cuda_backend.cpp resolves
// views, pages and step plans into these; the per-element arithmetic is
// device_math.h's, checked on the CPU by tests/unit/cuda_math_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvant::cuda {

// A weight matrix [n, k] as the kernels read it.
enum class WKind : int32_t { kBf16 = 0, kInt4 = 1, kFp8 = 2 };
struct DevWeights {
  WKind kind = WKind::kBf16;
  int64_t n = 0, k = 0, group = 0;
  int32_t gshift = 0;     // log2(group) when group is a power of two, else -1
  int32_t nan_codes = 0;  // FP8: some code is a NaN (the GEMV's bit trick would not keep it)
  const uint16_t* bf16 = nullptr;  // [n, k] row-major BF16
  const uint8_t* q = nullptr;      // INT4: [n, k/2] nibbles (low = even column), q + 8;
                                   // FP8: [n, k] e4m3 codes
  const float* scales = nullptr;   // [n, groups], BF16-rounded for INT4
  const int8_t* zeros = nullptr;   // INT4 zero points [n, groups] or null
};

// The KV page format, with the layer's byte offset folded into `layer_off`.
struct DevKvFormat {
  int32_t elem = 0;  // KvDType: 0 BF16, 1 e4m3, 2 e5m2
  int32_t kv_heads = 0, head_dim = 0, page_tokens = 0;
  int32_t dynamic = 0;
  int64_t layer_off = 0;
  int64_t k_offset = 0, v_offset = 0, k_scale_offset = 0, v_scale_offset = 0, row_bytes = 0;
  int64_t index_offset = 0, index_dim = 0;
  int64_t layer_bytes = 0;  // pages (and staged layer blocks) start at multiples of it
  const float* static_k = nullptr;  // [kv_heads] of this layer (static FP8), else null
  const float* static_v = nullptr;
};

struct DevChunk {
  int64_t pos0 = 0, n_tokens = 0, t0 = 0, gather_off = -1, gather_j0 = 0;
  int64_t page0 = 0, n_pages = 0;  // into the step's flat page table
};

// A step plan on the device.
struct DevStep {
  const DevChunk* chunks = nullptr;
  const int32_t* tok_chunk = nullptr;  // [tokens]
  const int64_t* tok_pos = nullptr;    // [tokens]
  const int64_t* decode_chunks = nullptr;  // [n_decode]
  const int64_t* gather_rows = nullptr;    // [gather_rows]: chunk << 40 | position
  const uint8_t* tok_writes = nullptr;     // [tokens]: 0 when a later token of the step
                                           // writes the same slot (only the last one stores)
  uint8_t* const* pages = nullptr;         // page base pointers, flat
  int64_t n_tokens = 0, n_decode = 0, n_gather = 0, max_ctx = 0;
};

struct DecodeArgs {
  const float* q = nullptr;
  int64_t ldq = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int32_t rows_by_token = 1;
  int32_t heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.f;
  int64_t window = 0;
  const int32_t* sel = nullptr;  // [tokens, topk] or null
  const uint8_t* sparse = nullptr;
  int64_t topk = 0;
};

struct PrefillArgs {
  const float* q = nullptr;
  int64_t ldq = 0, q_head_stride = 0;
  const uint16_t* k = nullptr;
  int64_t ldk = 0, k_head_stride = 0;
  const uint16_t* v = nullptr;
  int64_t ldv = 0, v_head_stride = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int32_t heads = 0, group = 1, head_dim = 0, v_dim = 0;
  float scale = 1.f, softcap = 0.f;
  int64_t window = 0;
  const int32_t* sel = nullptr;
  const uint8_t* sparse = nullptr;
  int64_t topk = 0;
};

// Largest head_dim the attention kernels take (larger: the CPU path).
inline constexpr int64_t kMaxAttnDim = 256;

void embed(const uint16_t* table, int64_t rows, int64_t cols, int64_t row0, const int32_t* tokens,
           float scale, float* out, int64_t ldo, int64_t n, cudaStream_t s);
void rmsnorm(const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy,
             int64_t rows, int64_t cols, int64_t segs, cudaStream_t s);
void layernorm(float* x, int64_t ld, const float* w, const float* b, double eps, int64_t rows,
               int64_t cols, cudaStream_t s);
void add(float* x, int64_t ldx, const float* y, int64_t ldy, const float* bias, int64_t rows,
         int64_t cols, cudaStream_t s);
void gated_act(int act, const float* gu, int64_t ldg, float* out, int64_t ldo, int64_t rows,
               int64_t cols, cudaStream_t s);
void softcap(float* x, int64_t ld, float cap, int64_t rows, int64_t cols, cudaStream_t s);
void copy_rows(const float* src, int64_t lds, const int64_t* src_rows, float* dst, int64_t ldd,
               const int64_t* dst_rows, int64_t n, int64_t cols, cudaStream_t s);
// y[m, n] = bf16(x[m, :]) . W[n, :] in FP32; scratch: linear_scratch_bytes.
int64_t linear_scratch_bytes(int64_t m, const DevWeights& w);
void linear(const float* x, int64_t ldx, int64_t m, const DevWeights& w, float* y, int64_t ldy,
            uint16_t* scratch, cudaStream_t s);
// out.row(t) = sum_j (in order) w[t k + j] * ys.row(slot[t k + j]).
void moe_combine(const float* ys, int64_t ldy, const float* w, const int64_t* slot, int64_t k,
                 float* out, int64_t ldo, int64_t rows, int64_t cols, cudaStream_t s);
void rope(float* x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_stride, int64_t dim,
          const float* cos, int64_t ldc, const float* sin, int64_t lds, int interleave,
          cudaStream_t s);
void kv_store(const DevStep& st, const DevKvFormat& f, const float* k, int64_t ldk, const float* v,
              int64_t ldv, cudaStream_t s);
void kv_store_index(const DevStep& st, const DevKvFormat& f, const float* k, int64_t ldk,
                    cudaStream_t s);
void kv_gather(const DevStep& st, const DevKvFormat& f, const float* k_new, int64_t ldkn,
               const float* v_new, int64_t ldvn, uint16_t* gk, int64_t ldgk, uint16_t* gv,
               int64_t ldgv, cudaStream_t s);
// Split-context paged decode attention; `partial` is scratch of
// decode_partial_floats(...) floats.
int64_t decode_partial_floats(int64_t n_decode, int64_t heads, int64_t head_dim, int64_t max_ctx);
void attention_decode(const DevStep& st, const DevKvFormat& f, const DecodeArgs& a, float* partial,
                      cudaStream_t s);
// prefill_tasks: [n_tasks] of (chunk << 40 | first token row), blocks of kPrefillQ tokens.
inline constexpr int64_t kPrefillQ = 8;
void attention_prefill(const DevStep& st, const PrefillArgs& a, const int64_t* prefill_tasks,
                       int64_t n_tasks, cudaStream_t s);

}  // namespace kvant::cuda
