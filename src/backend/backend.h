// The backend layer: every operation a model's forward pass is made of, over
// plain views (view.h), filled in once per backend. The model (src/model/)
// says *what* is computed and in which order; a backend says *how*: its
// kernels, its threading, its weight layouts (prepare_*) and its scratch
// memory. The model never touches activation memory itself, so a backend may
// keep it wherever it computes.
//
// Contracts every backend keeps (tests/unit/backend_ops_test.cpp checks each
// operation of each backend against the scalar reference):
//  - An operation on rows treats each row independently: a row's result does
//    not depend on the other rows, on the batch or on the thread count.
//  - Reductions follow the order the CPU kernels document
//    (kernels/cpu/kernels.h), so a backend that keeps it gives the reference
//    bits; one that cannot states its tolerance in the op test.
//  - Scratch grows only when a step is larger than any before (reserve()
//    sizes it up front), so a steady state allocates nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/moe_router.h"
#include "backend/prepared.h"
#include "backend/step_plan.h"
#include "backend/view.h"

namespace kvant::backend {

enum class GateAct : uint8_t { kSilu, kGeluTanh };

// Memory a backend allocated for activations, where it computes (host
// memory for the CPU backend): `bytes` long, 64-byte aligned, zeroed; freed
// by the backend's own release when the buffer goes.
class DeviceBuffer {
 public:
  using Release = void (*)(void* p, size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(void* p, size_t bytes, Release release) : p_(p, Free{release, bytes}), bytes_(bytes) {}
  void* data() const { return p_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    Release release;
    size_t bytes;
    void operator()(void* p) const { release(p, bytes); }
  };
  std::unique_ptr<void, Free> p_{nullptr, Free{nullptr, 0}};
  size_t bytes_ = 0;
};

// A typed view of one (n elements of T).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(DeviceBuffer b) : b_(std::move(b)) {}  // NOLINT: a typed view of it
  T* data() const { return static_cast<T*>(b_.data()); }
  size_t size() const { return b_.bytes() / sizeof(T); }

 private:
  DeviceBuffer b_;
};

// The largest step a backend's scratch is planned for (reserve()).
struct WorkspaceSize {
  int64_t tokens = 0;        // rows of activations in a step
  int64_t context = 0;       // longest context a token attends over
  int64_t pages = 0;         // most pages of one sequence
  int64_t widest_input = 0;  // widest input of any linear product
  int64_t score_rows = 1;    // query rows one attention task scores at once
  int64_t heads = 1;         // query heads (task lists: tokens * heads at most)
  int64_t experts = 0, expert_groups = 1;  // MoE router scratch
};

// Decode attention of every decoding chunk of the step, read straight from
// its pages (FP8 decoded inside the kernel). Query head h of a chunk uses
// q.row(r) + h * head_dim and writes out.row(r) + h * head_dim, with r the
// chunk's activation row (rows_by_token) or its index among the step's
// decoding chunks. Heads h = kvh * group .. go with KV head kvh, group =
// heads / kv_heads, head_block of them per task.
struct DecodeAttn {
  int64_t layer = 0;
  CF32 q;
  F32 out;
  bool rows_by_token = true;
  int64_t heads = 0, kv_heads = 0, head_dim = 0, head_block = 0;
  float scale = 1.f;
  int64_t window = 0;  // sliding window (0: the whole context)
  // Sparse attention (DSA): token t attends only over the topk positions
  // sel[t * topk ..] where sparse[t] is set.
  const int32_t* sel = nullptr;
  const uint8_t* sparse = nullptr;
  int64_t topk = 0;
};

// Causal attention of every prefill chunk over its gathered BF16 rows. Query
// head h of token t: q.row(t) + h * q_head_stride (head_dim values), against
// rows k.row(j) + kvh * k_head_stride and v.row(j) + kvh * v_head_stride,
// kvh = h / group; writes v_dim values at out.row(t) + h * v_dim.
struct PrefillAttn {
  CF32 q;
  CBF16 k, v;
  F32 out;
  int64_t heads = 0, group = 1, head_dim = 0, v_dim = 0;
  int64_t q_head_stride = 0, k_head_stride = 0, v_head_stride = 0;
  float scale = 1.f;
  float softcap = 0.f;  // scores -> tanh(s / cap) * cap before the softmax (0: none)
  int64_t window = 0;
  const int32_t* sel = nullptr;  // as DecodeAttn: other positions are masked out
  const uint8_t* sparse = nullptr;
  int64_t topk = 0;
};

// MLA prefill: cached latent rows [rows, rank + rope] (BF16) into per-head
// K = [W_uk_h c, k_pe] (heads * (nope + rope)) and V = W_uv_h c (heads * v_dim).
struct MlaExpand {
  CBF16 latent;
  const Matrix* wkv_b = nullptr;  // [heads * (nope + v_dim), rank]
  int64_t heads = 0, nope = 0, rope = 0, v_dim = 0, rank = 0;
  BF16 k, v;
};

// MoE rows sorted by expert: offsets[e] .. offsets[e + 1] are expert e's
// rows; slot[i] is where (token i / k, choice i % k) went.
struct MoeSort {
  int64_t* offsets = nullptr;  // [experts + 1]
  int64_t* slot = nullptr;     // [tokens * k]
  int64_t* fill = nullptr;     // [experts] scratch
};

// The stable counting sort every backend's moe_permute makes (host memory):
// offsets and slot of the n = tokens * k choices in ids.
void moe_counting_sort(const int32_t* ids, int64_t n, int64_t experts, const MoeSort& sort);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // What it runs on, for reports: the CPU backend's kernel ISA ("avx512bf16", ...).
  virtual std::string device() const = 0;
  // Whether alloc() gives plain host memory (the CPU backend); a GPU
  // backend's memory is its device's, so the KV arena comes from alloc().
  virtual bool host_memory() const { return true; }
  // Bytes free where it computes (the KV budget's base), or -1: the host's.
  virtual int64_t free_memory() const { return -1; }

  // --- Prepared weights (load time) ---
  // w: row-major BF16 [rows, cols].
  virtual Matrix prepare_bf16(const uint16_t* w, int64_t rows, int64_t cols) const = 0;
  // Logical W4A16: q [rows, cols] in [-8, 7]; scale [rows, groups]; zero
  // likewise or nullptr (symmetric).
  virtual Q4Matrix prepare_int4(const int8_t* q, const float* scale, const int8_t* zero,
                                int64_t rows, int64_t cols, int64_t group) const = 0;
  // FP8 e4m3 codes [rows, cols] (cols even) with FP32 scales [rows,
  // ceil(cols / group)]: w = e4m3(code) * scale of its row and column group.
  // group even, and at most 256 or at least cols (kernels::kF8MaxGroup).
  virtual F8Matrix prepare_fp8(const uint8_t* codes, const float* scale, int64_t rows,
                               int64_t cols, int64_t group) const = 0;

  // --- Memory ---
  // Activation memory for the model's workspace (Model::reserve plans it).
  virtual DeviceBuffer alloc(size_t bytes) = 0;
  virtual void reserve(const WorkspaceSize& size) = 0;
  // Per-forward metadata (task lists) from the step's plan, built once and
  // used by every layer's operations until the next begin_step.
  virtual void begin_step(const StepPlan& plan) = 0;

  // --- Rows ---
  // out.row(i) = table row (tokens[i] - row0) * scale, i < out.rows: the
  // table holds ids [row0, row0 + table.rows) (the whole vocabulary, or one
  // rank's slice under tensor parallelism); a token outside them gets a row
  // of zeros (its rank's peer supplies it, summed by an all-reduce).
  virtual void embed(const Matrix& table, int64_t row0, const int32_t* tokens, float scale,
                     F32 out) = 0;
  // y = x * rsqrt(mean(x^2) + eps) * w per row (y may be x).
  virtual void rmsnorm(CF32 x, const float* w, float eps, F32 y) = 0;
  // The same over `heads` consecutive head_dim slices of every row, in place.
  virtual void rmsnorm_heads(F32 x, int64_t heads, int64_t head_dim, const float* w,
                             float eps) = 0;
  // (x - mean) / sqrt(var + eps) * w + b per row, in place (mean and variance in double).
  virtual void layernorm(F32 x, const float* w, const float* b, double eps) = 0;
  virtual void add(F32 x, CF32 y) = 0;             // x += y
  virtual void add_bias(F32 x, const float* b) = 0;  // x.row(i) += b
  // out = act(gate) * up, gate the first out.cols values of a row of
  // gate_up, up the next out.cols.
  virtual void gated_act(GateAct act, CF32 gate_up, F32 out) = 0;
  virtual void softcap(F32 x, float cap) = 0;  // x = tanh(x / cap) * cap
  // dst.row(dst_rows[i]) = src.row(src_rows[i]) for i < n (nullptr: i).
  virtual void copy_rows(CF32 src, const int64_t* src_rows, F32 dst, const int64_t* dst_rows,
                         int64_t n) = 0;
  // y = x @ W^T (x: [m, W.cols], y: [m, W.rows]).
  virtual void linear(CF32 x, LinearRef w, F32 y) = 0;

  // --- RoPE ---
  // cos.row(t)[j] = cos(pos_t * inv_freq[j]) * attn_factor (sin likewise), j < n.
  virtual void rope_table(const StepPlan& plan, const float* inv_freq, int64_t n,
                          float attn_factor, F32 cos, F32 sin) = 0;
  // Rotates the first dim values of `heads` slices per row (slice h at
  // x.row(t) + h * head_stride) by row t of the table: interleaved pairs
  // (x[2i], x[2i+1]) or the two halves (x[i], x[i + dim/2]).
  virtual void rope(F32 x, int64_t heads, int64_t head_stride, int64_t dim, CF32 cos, CF32 sin,
                    bool interleave) = 0;

  // --- KV pages ---
  // Each token's K (and V, unless v.data is null: shared K/V) row into its
  // page slot in the page dtype (kvcache/kv_codec.h), with its dynamic
  // scales or the static ones.
  virtual void kv_store(const StepPlan& plan, int64_t layer, CF32 k, CF32 v) = 0;
  // The DSA indexer's key of each token into its page's index block (BF16).
  virtual void kv_store_index(const StepPlan& plan, int64_t layer, CF32 k) = 0;
  // BF16 context rows of every prefill chunk (StepChunk::gather_*): earlier
  // positions decoded from the pages, the chunk's own from the fresh FP32
  // rows k_new / v_new (activation rows). v_new.data null: shared K/V.
  virtual void kv_gather(const StepPlan& plan, int64_t layer, CF32 k_new, CF32 v_new, BF16 k,
                         BF16 v) = 0;

  // --- Attention ---
  virtual void attention_decode(const StepPlan& plan, const DecodeAttn& a) = 0;
  virtual void attention_prefill(const StepPlan& plan, const PrefillAttn& a) = 0;

  // --- Mixture of experts ---
  // Each token's experts (ascending) and weights from its router logits.
  virtual void moe_route(const RouterConfig& rc, CF32 logits, const float* bias, int32_t* ids,
                         float* weights) = 0;
  // Rows of x copied into xs grouped by expert (counting sort, stable).
  virtual void moe_permute(const int32_t* ids, int64_t k, int64_t experts, CF32 x, F32 xs,
                           const MoeSort& sort) = 0;
  // out.row(t) = sum over j < k, in order, of weights[t*k+j] * ys.row(slot[t*k+j]).
  virtual void moe_combine(CF32 ys, const float* weights, const int64_t* slot, int64_t k,
                           F32 out) = 0;

  // --- Latent attention (MLA) and sparse attention (DSA) ---
  virtual void mla_expand(const MlaExpand& a) = 0;
  // For every token with a sparse choice (more than topk positions of
  // context): the score of each earlier position j, sum_h w_h * head_scale *
  // relu(q_h . k_j * key_scale) over the keys in the index blocks, and the
  // topk best (ties to the earlier position) into sel ascending.
  virtual void dsa_select(const StepPlan& plan, int64_t layer, CF32 q, CF32 head_w,
                          int64_t heads, int64_t head_dim, int64_t topk, int32_t* sel,
                          uint8_t* sparse) = 0;
};

// Memory for KV pages where `be` computes (PagePoolOptions::arena,
// SeqKvOptions::arena): null for a host-memory backend, else its alloc().
std::function<std::shared_ptr<uint8_t>(size_t)> kv_arena(Backend& be);

// The CPU backend over the best kernel table this machine runs.
std::unique_ptr<Backend> make_cpu_backend();
// Every backend this build and machine can run, by name ("cpu", ...): the
// op tests and the golden tests run once for each.
std::vector<std::string> available_backends();
// One of those by name, or "cpu-scalar" (the CPU backend over the scalar
// kernel table on one thread: the reference the op tests compare against);
// nullptr for an unknown name.
std::unique_ptr<Backend> make_backend(const std::string& name);
// The device string of the backend `name` would make ("" when unknown).
std::string backend_device(const std::string& name);

}  // namespace kvant::backend
