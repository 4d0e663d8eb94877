// The CUDA backend's host side, shared by its two files (cuda_backend.cpp:
// weights, memory, rows, products, MoE; cuda_backend_kv.cpp: the step's
// device tables, KV pages and attention). Internal to src/backend/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace kvant::backend::cuda_impl {

// Aborts with the CUDA error's text (a failed device call leaves nothing to
// recover in this process).
void ck(cudaError_t e, const char* what);
// Memory a kernel can read: device or managed.
bool device_accessible(const void* p);
void* dev_alloc(size_t bytes);
// log2 of a power-of-two group size, else -1.
int32_t group_shift(int64_t group);

// Grow-only device scratch.
class Scratch {
 public:
  ~Scratch() { cudaFree(p_); }
  void* get(size_t bytes) {
    if (bytes > n_) {
      cudaFree(p_);
      n_ = std::max(bytes, n_ * 3 / 2);
      p_ = dev_alloc(n_);
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Device memory that staged host data lives in: blocks taken in order during
// one operation and reused by the next (the legacy stream orders a later
// upload after the kernels that read the earlier one). When an operation
// needed more than one block, they are merged into one before the next.
class StagePool {
 public:
  ~StagePool() { release(); }
  void* take(size_t bytes) {
    bytes = (bytes + 255) / 256 * 256;
    if (blocks_.empty() || used_ + bytes > blocks_.back().second) {
      const size_t size = std::max(bytes, blocks_.empty() ? size_t(1) << 20 : 2 * blocks_.back().second);
      blocks_.push_back({dev_alloc(size), size});
      used_ = 0;
    }
    void* p = static_cast<uint8_t*>(blocks_.back().first) + used_;
    used_ += bytes;
    return p;
  }
  // The operation is over (its write-backs done, so its kernels finished).
  void reset() {
    if (blocks_.size() > 1) {
      size_t total = 0;
      for (auto& b : blocks_) total += b.second;
      release();
      blocks_.push_back({dev_alloc(total), total});
    }
    used_ = 0;
  }

 private:
  void release() {
    for (auto& b : blocks_) cudaFree(b.first);
    blocks_.clear();
  }
  std::vector<std::pair<void*, size_t>> blocks_;
  size_t used_ = 0;
};

// Host memory staged through device memory for one operation: get() returns
// a device pointer for n elements at p (p itself when the device can read
// it); those marked write-back are copied home when the stager ends. One
// stager at a time per backend (it resets the pool when it ends).
class Stager {
 public:
  explicit Stager(StagePool& pool) : pool_(pool) {}
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;
  ~Stager() {
    for (auto& s : items_)
      if (s.back) ck(cudaMemcpy(s.host, s.dev, s.bytes, cudaMemcpyDeviceToHost), "stage back");
    pool_.reset();
  }
  template <class T>
  T* get(T* p, size_t n, bool write_back) {
    if (!p || n == 0 || device_accessible(p)) return p;
    using U = std::remove_const_t<T>;
    void* d = pool_.take(n * sizeof(U));
    ck(cudaMemcpy(d, p, n * sizeof(U), cudaMemcpyHostToDevice), "stage in");
    items_.push_back({d, const_cast<U*>(p), n * sizeof(U), write_back});
    return static_cast<T*>(d);
  }
  template <class T>
  View<T> view(View<T> v, bool write_back) {
    const size_t n = v.rows > 0 ? size_t((v.rows - 1) * v.ld + v.cols) : 0;
    return {get(v.data, n, write_back), v.rows, v.cols, v.ld};
  }

 private:
  struct Item {
    void* dev;
    void* host;
    size_t bytes;
    bool back;
  };
  StagePool& pool_;
  std::vector<Item> items_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() : cpu_(kernels::active(), 0, "cpu") {
    cudaDeviceProp p{};
    ck(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    char buf[640];
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
                  double(p.totalGlobalMem) / double(1 << 30));
    device_ = buf;
  }
  ~CudaBackend() override {
    cudaDeviceSynchronize();
    for (auto& [k, w] : weights_) free_weights(w);
    for (auto& [k, c] : consts_) cudaFree(c.dev);
  }
  const char* name() const override { return "cuda"; }
  std::string device() const override { return device_; }
  bool host_memory() const override { return false; }
  int64_t free_memory() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
    return int64_t(free);
  }

  Matrix prepare_bf16(const uint16_t* w, int64_t rows, int64_t cols) const override;
  Q4Matrix prepare_int4(const int8_t* q, const float* scale, const int8_t* zero, int64_t rows,
                        int64_t cols, int64_t group) const override;
  F8Matrix prepare_fp8(const uint8_t* codes, const float* scale, int64_t rows, int64_t cols,
                       int64_t group) const override;

  DeviceBuffer alloc(size_t bytes) override;
  void reserve(const WorkspaceSize& size) override { cpu_.reserve(size); }
  void begin_step(const StepPlan& plan) override;

  void embed(const Matrix& table, int64_t row0, const int32_t* tokens, float scale,
             F32 out) override;
  void rmsnorm(CF32 x, const float* w, float eps, F32 y) override;
  void rmsnorm_heads(F32 x, int64_t heads, int64_t head_dim, const float* w, float eps) override;
  void layernorm(F32 x, const float* w, const float* b, double eps) override;
  void add(F32 x, CF32 y) override;
  void add_bias(F32 x, const float* b) override;
  void gated_act(GateAct act, CF32 gate_up, F32 out) override;
  void softcap(F32 x, float cap) override;
  void copy_rows(CF32 src, const int64_t* src_rows, F32 dst, const int64_t* dst_rows,
                 int64_t n) override;
  void linear(CF32 x, LinearRef w, F32 y) override;
  void rope_table(const StepPlan& plan, const float* inv_freq, int64_t n, float attn_factor,
                  F32 cos, F32 sin) override;
  void rope(F32 x, int64_t heads, int64_t head_stride, int64_t dim, CF32 cos, CF32 sin,
            bool interleave) override;
  void kv_store(const StepPlan& plan, int64_t layer, CF32 k, CF32 v) override;
  void kv_store_index(const StepPlan& plan, int64_t layer, CF32 k) override;
  void kv_gather(const StepPlan& plan, int64_t layer, CF32 k_new, CF32 v_new, BF16 k,
                 BF16 v) override;
  void attention_decode(const StepPlan& plan, const DecodeAttn& a) override;
  void attention_prefill(const StepPlan& plan, const PrefillAttn& a) override;

  // Without a device kernel: the CPU backend, once the device is idle
  // (routing reads T x E logits and writes T x k choices: little to move).
  void moe_route(const RouterConfig& rc, CF32 logits, const float* bias, int32_t* ids,
                 float* weights) override;
  void moe_permute(const int32_t* ids, int64_t k, int64_t experts, CF32 x, F32 xs,
                   const MoeSort& sort) override;
  void moe_combine(CF32 ys, const float* weights, const int64_t* slot, int64_t k,
                   F32 out) override;
  void mla_expand(const MlaExpand& a) override {
    sync();
    cpu_.mla_expand(a);
  }
  void dsa_select(const StepPlan& plan, int64_t layer, CF32 q, CF32 head_w, int64_t heads,
                  int64_t head_dim, int64_t topk, int32_t* sel, uint8_t* sparse) override {
    sync();
    cpu_.begin_step(plan);
    cpu_.dsa_select(plan, layer, q, head_w, heads, head_dim, topk, sel, sparse);
  }

 private:
  struct Resident {
    cuda::DevWeights w;
    std::vector<void*> bufs;
  };
  struct Const {
    std::vector<uint8_t> host;
    void* dev = nullptr;
  };
  // The step's tables on the device, for one layer's page offset.
  struct Step {
    cuda::DevStep st;
    cuda::DevKvFormat f;
    const int64_t* prefill_tasks = nullptr;
    int64_t n_prefill_tasks = 0;
    bool ok = false;  // false: the pages' format differs between chunks (CPU path)
  };

  void sync() { ck(cudaStreamSynchronize(s_), "synchronize"); }
  static void free_weights(Resident& r) {
    for (void* p : r.bufs) cudaFree(p);
  }
  void keep(const void* key, Resident r) const {
    auto it = weights_.find(key);
    if (it != weights_.end()) free_weights(it->second);
    weights_[key] = std::move(r);
  }
  const cuda::DevWeights* resident(LinearRef w) const {
    const void* key = w.is_int4() ? static_cast<const void*>(w.q->q4.w.data())
                      : w.is_fp8() ? static_cast<const void*>(w.q->f8.w.data())
                                   : static_cast<const void*>(w.bf16->packed.data());
    auto it = weights_.find(key);
    return it == weights_.end() ? nullptr : &it->second.w;
  }
  // A small constant array (norm weights, biases, scales) on the device:
  // cached by address and checked against the host bytes at each use.
  template <class T>
  const T* constant(const T* p, size_t n);
  // The plan's tables for one layer; pages in host memory are staged (their
  // layer block) and listed in staged_ for pages_back.
  Step step_tables(const StepPlan& plan, int64_t layer);
  void pages_back(const StepPlan& plan, int64_t layer);

  CpuBackend cpu_;
  std::string device_;
  cudaStream_t s_ = nullptr;  // the legacy default stream
  mutable std::unordered_map<const void*, Resident> weights_;
  std::unordered_map<const void*, Const> consts_;
  Scratch meta_, partial_, staged_pages_, xb_;
  StagePool stage_;
  // Step tables built by begin_step (device-resident pages only).
  const StepPlan* plan_ = nullptr;
  int64_t step_ = 0, built_step_ = -1;
  Step cached_{};
  std::vector<uint8_t> host_meta_;
  // The step tables as step_tables packs them (kept: no allocation per step).
  struct HostTables {
    std::vector<cuda::DevChunk> chunks;
    std::vector<uint8_t*> pages;
    std::vector<int32_t> tok_chunk;
    std::vector<int64_t> tok_pos, gather, tasks;
    std::vector<uint8_t> tok_writes;
  } host_tables_;
  std::vector<int64_t> src_rows_;  // moe_permute's source rows
  // moe_route's logits and choices on the host.
  std::vector<float> route_logits_, route_w_;
  std::vector<int32_t> route_ids_;
  // Host pages staged for the current operation: (host page, device copy).
  std::vector<std::pair<uint8_t*, uint8_t*>> staged_;
  int64_t staged_bytes_ = 0;
};


template <class T>
const T* CudaBackend::constant(const T* p, size_t n) {
  if (!p || device_accessible(p)) return p;
  const size_t bytes = n * sizeof(T);
  Const& c = consts_[p];
  if (c.host.size() != bytes || std::memcmp(c.host.data(), p, bytes) != 0) {
    cudaFree(c.dev);
    c.host.assign(reinterpret_cast<const uint8_t*>(p), reinterpret_cast<const uint8_t*>(p) + bytes);
    c.dev = dev_alloc(bytes);
    ck(cudaMemcpy(c.dev, p, bytes, cudaMemcpyHostToDevice), "constant upload");
  }
  return static_cast<const T*>(c.dev);
}

}  // namespace kvant::backend::cuda_impl
