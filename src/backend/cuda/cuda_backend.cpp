// The CUDA backend's host side (cuda_backend.h): weights uploaded at prepare
// time, the step plan turned into device tables once per step, host memory
// staged per operation, and the operations without a device kernel run by
// the CPU backend after a device synchronization.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_math.h"
#include "kernels/cpu/kernels.h"

namespace kvant::backend {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "kvant cuda backend: %s: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

// Managed allocations this process's CUDA backends made (alloc), by start:
// a pointer inside one needs no driver query.
std::mutex g_ranges_mu;
std::map<uintptr_t, size_t> g_ranges;

// Memory a kernel can read: device or managed (or host memory registered
// and mapped, which reports a device pointer).
bool device_accessible(const void* p) {
  if (!p) return true;
  {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(g_ranges_mu);
    auto it = g_ranges.upper_bound(a);
    if (it != g_ranges.begin() && a < std::prev(it)->first + std::prev(it)->second) return true;
  }
  cudaPointerAttributes at{};
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

// log2 of a power-of-two group size, else -1 (the products then take the
// general kernel).
int32_t group_shift(int64_t group) {
  for (int32_t b = 0; b < 40; ++b)
    if (int64_t(1) << b == group) return b;
  return -1;
}

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  ck(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}

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

// Host memory staged through device memory for one operation: get() returns
// a device pointer for n elements at p (p itself when the device can read
// it); those marked write-back are copied home when the stager ends.
class Stager {
 public:
  ~Stager() {
    for (auto& s : items_) {
      if (s.back) ck(cudaMemcpy(s.host, s.dev, s.bytes, cudaMemcpyDeviceToHost), "stage back");
      cudaFree(s.dev);
    }
  }
  template <class T>
  T* get(T* p, size_t n, bool write_back) {
    if (!p || n == 0 || device_accessible(p)) return p;
    using U = std::remove_const_t<T>;
    void* d = dev_alloc(n * sizeof(U));
    ck(cudaMemcpy(d, p, n * sizeof(U), cudaMemcpyHostToDevice), "stage in");
    items_.push_back({d, const_cast<U*>(p), n * sizeof(U), write_back});
    return static_cast<T*>(d);
  }
  template <class T>
  View<T> view(View<T> v, bool write_back) {
    const size_t n = v.rows > 0 ? size_t((v.rows - 1) * v.ld + v.cols) : 0;
    return {get(v.data, n, write_back), v.rows, v.cols, v.ld};
  }
  bool any() const { return !items_.empty(); }

 private:
  struct Item {
    void* dev;
    void* host;
    size_t bytes;
    bool back;
  };
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

  // Without a device kernel: the CPU backend, once the device is idle.
  void moe_route(const RouterConfig& rc, CF32 logits, const float* bias, int32_t* ids,
                 float* weights) override {
    sync();
    cpu_.moe_route(rc, logits, bias, ids, weights);
  }
  void moe_permute(const int32_t* ids, int64_t k, int64_t experts, CF32 x, F32 xs,
                   const MoeSort& sort) override {
    sync();
    cpu_.moe_permute(ids, k, experts, x, xs, sort);
  }
  void moe_combine(CF32 ys, const float* weights, const int64_t* slot, int64_t k,
                   F32 out) override {
    sync();
    cpu_.moe_combine(ys, weights, slot, k, out);
  }
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
  // Step tables built by begin_step (device-resident pages only).
  const StepPlan* plan_ = nullptr;
  int64_t step_ = 0, built_step_ = -1;
  Step cached_{};
  std::vector<uint8_t> host_meta_;
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

Matrix CudaBackend::prepare_bf16(const uint16_t* w, int64_t rows, int64_t cols) const {
  Matrix m = cpu_.prepare_bf16(w, rows, cols);
  Resident r;
  const size_t bytes = size_t(rows * cols) * 2;
  void* d = dev_alloc(bytes);
  ck(cudaMemcpy(d, w, bytes, cudaMemcpyHostToDevice), "upload bf16 weights");
  r.bufs.push_back(d);
  r.w.kind = cuda::WKind::kBf16;
  r.w.n = rows;
  r.w.k = cols;
  r.w.bf16 = static_cast<const uint16_t*>(d);
  keep(m.packed.data(), std::move(r));
  return m;
}

Q4Matrix CudaBackend::prepare_int4(const int8_t* q, const float* scale, const int8_t* zero,
                                   int64_t rows, int64_t cols, int64_t group) const {
  Q4Matrix m = cpu_.prepare_int4(q, scale, zero, rows, cols, group);
  const int64_t G = (cols + group - 1) / group;
  std::vector<uint8_t> nib(size_t(rows * ((cols + 1) / 2)), 0x88);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint8_t& b = nib[size_t(r * ((cols + 1) / 2) + c / 2)];
      const uint8_t v = uint8_t(q[r * cols + c] + 8) & 0xf;
      b = (c & 1) ? uint8_t((b & 0x0f) | (v << 4)) : uint8_t((b & 0xf0) | v);
    }
  std::vector<float> sc(size_t(rows * G));
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = cuda_math::round_bf16(scale[i]);  // as the CPU keeps them
  Resident r;
  auto up = [&](const void* src, size_t bytes) {
    void* d = dev_alloc(bytes);
    ck(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice), "upload int4 weights");
    r.bufs.push_back(d);
    return d;
  };
  r.w.kind = cuda::WKind::kInt4;
  r.w.n = rows;
  r.w.k = cols;
  r.w.group = group;
  r.w.gshift = group_shift(group);
  r.w.q = static_cast<const uint8_t*>(up(nib.data(), nib.size()));
  r.w.scales = static_cast<const float*>(up(sc.data(), sc.size() * 4));
  if (zero) r.w.zeros = static_cast<const int8_t*>(up(zero, size_t(rows * G)));
  keep(m.w.data(), std::move(r));
  return m;
}

F8Matrix CudaBackend::prepare_fp8(const uint8_t* codes, const float* scale, int64_t rows,
                                  int64_t cols, int64_t group) const {
  F8Matrix m = cpu_.prepare_fp8(codes, scale, rows, cols, group);
  const int64_t G = (cols + group - 1) / group;
  Resident r;
  void* dq = dev_alloc(size_t(rows * cols));
  void* ds = dev_alloc(size_t(rows * G) * 4);
  ck(cudaMemcpy(dq, codes, size_t(rows * cols), cudaMemcpyHostToDevice), "upload fp8 codes");
  ck(cudaMemcpy(ds, scale, size_t(rows * G) * 4, cudaMemcpyHostToDevice), "upload fp8 scales");
  r.bufs = {dq, ds};
  r.w.kind = cuda::WKind::kFp8;
  r.w.n = rows;
  r.w.k = cols;
  r.w.group = group;
  r.w.gshift = group_shift(group);
  r.w.nan_codes = m.nan_codes ? 1 : 0;
  r.w.q = static_cast<const uint8_t*>(dq);
  r.w.scales = static_cast<const float*>(ds);
  keep(m.w.data(), std::move(r));
  return m;
}

DeviceBuffer CudaBackend::alloc(size_t bytes) {
  if (bytes == 0) return {};
  void* p = nullptr;
  ck(cudaMallocManaged(&p, bytes), "cudaMallocManaged");
  int dev = 0;
  cudaGetDevice(&dev);
#if CUDART_VERSION >= 13000
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = dev;
  cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, loc);
#else
  cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, dev);
#endif
  cudaGetLastError();  // the advice is a hint
  ck(cudaMemset(p, 0, bytes), "cudaMemset");
  ck(cudaDeviceSynchronize(), "alloc");
  {
    std::lock_guard<std::mutex> lock(g_ranges_mu);
    g_ranges[reinterpret_cast<uintptr_t>(p)] = bytes;
  }
  return DeviceBuffer(p, bytes, [](void* q) {
    cudaDeviceSynchronize();
    {
      std::lock_guard<std::mutex> lock(g_ranges_mu);
      g_ranges.erase(reinterpret_cast<uintptr_t>(q));
    }
    cudaFree(q);
  });
}

void CudaBackend::begin_step(const StepPlan& plan) {
  ++step_;
  plan_ = &plan;
  built_step_ = -1;
}

CudaBackend::Step CudaBackend::step_tables(const StepPlan& plan, int64_t layer) {
  Step out;
  staged_.clear();
  if (plan.chunks.empty()) return out;
  const KvFormat& f = *plan.chunks[0].kv->format;
  for (const auto& c : plan.chunks)
    if (c.kv->format != &f && (c.kv->format->layer_bytes != f.layer_bytes ||
                               c.kv->format->elem != f.elem || c.kv->format->dynamic_scales != f.dynamic_scales))
      return out;
  // A pool's pages are all of one kind: each chunk's first page tells.
  bool host_pages = false;
  for (const auto& c : plan.chunks)
    if (c.kv->n_pages > 0 && !device_accessible(c.kv->pages[0])) host_pages = true;
  const bool reuse = !host_pages && &plan == plan_ && built_step_ == step_;
  if (!reuse) {
    // Pack every table into one host buffer, then one upload.
    std::vector<cuda::DevChunk> chunks;
    std::vector<uint8_t*> pages;
    std::vector<int32_t> tok_chunk;
    std::vector<int64_t> tok_pos, gather, tasks;
    std::unordered_map<uint8_t*, uint8_t*> seen;
    if (host_pages) {
      int64_t n = 0;
      for (const auto& c : plan.chunks) n += c.kv->n_pages;
      staged_bytes_ = n * f.layer_bytes;
    }
    auto* blocks = host_pages ? static_cast<uint8_t*>(staged_pages_.get(size_t(staged_bytes_))) : nullptr;
    int64_t next_block = 0;
    for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
      const StepChunk& c = plan.chunks[ci];
      cuda::DevChunk d{c.pos0, c.n_tokens, c.t0, c.gather_off, c.gather_j0, int64_t(pages.size()), c.kv->n_pages};
      for (int64_t p = 0; p < c.kv->n_pages; ++p) {
        uint8_t* pg = c.kv->pages[p];
        if (!host_pages) {
          pages.push_back(pg);
          continue;
        }
        auto it = seen.find(pg);
        if (it == seen.end()) {
          uint8_t* dst = blocks + next_block++ * f.layer_bytes;
          ck(cudaMemcpy(dst, pg + layer * f.layer_bytes, size_t(f.layer_bytes), cudaMemcpyHostToDevice),
             "stage page");
          it = seen.emplace(pg, dst).first;
          staged_.push_back({pg + layer * f.layer_bytes, dst});
        }
        pages.push_back(it->second);
      }
      chunks.push_back(d);
      if (!c.decodes()) {
        for (int64_t j = c.gather_j0; j < c.pos0 + c.n_tokens; ++j) gather.push_back(int64_t(ci) << 40 | j);
        for (int64_t t = c.t0; t < c.t0 + c.n_tokens; t += cuda::kPrefillQ) tasks.push_back(int64_t(ci) << 40 | t);
      }
    }
    for (const auto& t : plan.tokens) {
      tok_chunk.push_back(t.chunk);
      tok_pos.push_back(t.pos);
    }
    // Two tokens of one step writing one slot (only in tests that share a
    // span between chunks): the later one stores, as on the CPU.
    std::vector<uint8_t> tok_writes(plan.tokens.size(), 1);
    {
      std::unordered_map<const uint8_t*, size_t> last;
      for (size_t t = 0; t < plan.tokens.size(); ++t) {
        const StepChunk& c = plan.chunks[size_t(plan.tokens[t].chunk)];
        const int64_t pos = plan.tokens[t].pos;
        const uint8_t* key = c.kv->pages[pos / f.page_tokens] + (pos % f.page_tokens);
        auto [it, fresh] = last.emplace(key, t);
        if (!fresh) {
          tok_writes[it->second] = 0;
          it->second = t;
        }
      }
    }
    size_t off = 0;
    auto place = [&](size_t bytes) {
      const size_t o = off;
      off += (bytes + 15) / 16 * 16;
      return o;
    };
    const size_t o_chunks = place(chunks.size() * sizeof(cuda::DevChunk));
    const size_t o_pages = place(pages.size() * sizeof(uint8_t*));
    const size_t o_tc = place(tok_chunk.size() * 4), o_tp = place(tok_pos.size() * 8);
    const size_t o_dc = place(plan.decode_chunks.size() * 8), o_g = place(gather.size() * 8);
    const size_t o_t = place(tasks.size() * 8), o_w = place(tok_writes.size());
    host_meta_.assign(off, 0);
    auto put = [&](size_t o, const void* src, size_t bytes) {
      if (bytes) std::memcpy(host_meta_.data() + o, src, bytes);
    };
    put(o_chunks, chunks.data(), chunks.size() * sizeof(cuda::DevChunk));
    put(o_pages, pages.data(), pages.size() * sizeof(uint8_t*));
    put(o_tc, tok_chunk.data(), tok_chunk.size() * 4);
    put(o_tp, tok_pos.data(), tok_pos.size() * 8);
    put(o_dc, plan.decode_chunks.data(), plan.decode_chunks.size() * 8);
    put(o_g, gather.data(), gather.size() * 8);
    put(o_t, tasks.data(), tasks.size() * 8);
    put(o_w, tok_writes.data(), tok_writes.size());
    // The previous step's kernels may still read the tables: wait for them.
    sync();
    auto* dm = static_cast<uint8_t*>(meta_.get(off));
    ck(cudaMemcpy(dm, host_meta_.data(), off, cudaMemcpyHostToDevice), "step tables");
    cuda::DevStep& st = cached_.st;
    st.chunks = reinterpret_cast<const cuda::DevChunk*>(dm + o_chunks);
    st.pages = reinterpret_cast<uint8_t* const*>(dm + o_pages);
    st.tok_chunk = reinterpret_cast<const int32_t*>(dm + o_tc);
    st.tok_pos = reinterpret_cast<const int64_t*>(dm + o_tp);
    st.decode_chunks = reinterpret_cast<const int64_t*>(dm + o_dc);
    st.gather_rows = reinterpret_cast<const int64_t*>(dm + o_g);
    st.tok_writes = dm + o_w;
    st.n_tokens = plan.n_tokens();
    st.n_decode = int64_t(plan.decode_chunks.size());
    st.n_gather = int64_t(gather.size());
    st.max_ctx = plan.max_ctx;
    cached_.prefill_tasks = reinterpret_cast<const int64_t*>(dm + o_t);
    cached_.n_prefill_tasks = int64_t(tasks.size());
    if (!host_pages && &plan == plan_) built_step_ = step_;
  }
  out = cached_;
  out.ok = true;
  cuda::DevKvFormat& d = out.f;
  d.elem = int32_t(f.elem);
  d.kv_heads = int32_t(f.kv_heads);
  d.head_dim = int32_t(f.head_dim);
  d.page_tokens = int32_t(f.page_tokens);
  d.dynamic = f.dynamic_scales ? 1 : 0;
  d.layer_off = host_pages ? 0 : layer * f.layer_bytes;
  d.k_offset = f.k_offset;
  d.v_offset = f.v_offset;
  d.k_scale_offset = f.k_scale_offset;
  d.v_scale_offset = f.v_scale_offset;
  d.row_bytes = f.row_bytes();
  d.index_offset = f.index_offset;
  d.index_dim = f.index_dim;
  d.layer_bytes = f.layer_bytes;
  if (!f.static_k.empty()) {
    d.static_k = constant(f.static_k.data(), f.static_k.size()) + layer * f.kv_heads;
    d.static_v = f.shared_kv() || f.static_v.empty() ? d.static_k
                                    : constant(f.static_v.data(), f.static_v.size()) + layer * f.kv_heads;
  }
  return out;
}

void CudaBackend::pages_back(const StepPlan& plan, int64_t) {
  if (staged_.empty()) return;
  const int64_t lb = plan.chunks[0].kv->format->layer_bytes;
  for (auto& [host, dev] : staged_)
    ck(cudaMemcpy(host, dev, size_t(lb), cudaMemcpyDeviceToHost), "page back");
  staged_.clear();
}

void CudaBackend::embed(const Matrix& table, int64_t row0, const int32_t* tokens, float scale,
                        F32 out) {
  auto it = weights_.find(table.packed.data());
  if (it == weights_.end()) {
    sync();
    return cpu_.embed(table, row0, tokens, scale, out);
  }
  Stager st;
  const F32 o = st.view(out, true);
  const int32_t* tk = st.get(tokens, size_t(out.rows), false);
  cuda::embed(it->second.w.bf16, table.rows, table.cols, row0, tk, scale, o.data, o.ld, o.rows, s_);
}

void CudaBackend::rmsnorm(CF32 x, const float* w, float eps, F32 y) {
  const float* wd = constant(w, size_t(x.cols));
  Stager st;
  if (y.data == x.data) {  // in place
    const F32 yd = st.view(y, true);
    cuda::rmsnorm(yd.data, yd.ld, wd, eps, yd.data, yd.ld, x.rows, x.cols, 1, s_);
    return;
  }
  const CF32 xd = st.view(x, false);
  const F32 yd = st.view(y, true);
  cuda::rmsnorm(xd.data, xd.ld, wd, eps, yd.data, yd.ld, x.rows, x.cols, 1, s_);
}

void CudaBackend::rmsnorm_heads(F32 x, int64_t heads, int64_t hd, const float* w, float eps) {
  const float* wd = constant(w, size_t(hd));
  Stager st;
  const F32 xd = st.view(x, true);
  cuda::rmsnorm(xd.data, xd.ld, wd, eps, xd.data, xd.ld, x.rows, heads * hd, heads, s_);
}

void CudaBackend::layernorm(F32 x, const float* w, const float* b, double eps) {
  const float* wd = constant(w, size_t(x.cols));
  const float* bd = constant(b, size_t(x.cols));
  Stager st;
  const F32 xd = st.view(x, true);
  cuda::layernorm(xd.data, xd.ld, wd, bd, eps, x.rows, x.cols, s_);
}

void CudaBackend::add(F32 x, CF32 y) {
  Stager st;
  const F32 xd = st.view(x, true);
  const CF32 yd = st.view(y, false);
  cuda::add(xd.data, xd.ld, yd.data, yd.ld, nullptr, x.rows, x.cols, s_);
}

void CudaBackend::add_bias(F32 x, const float* b) {
  const float* bd = constant(b, size_t(x.cols));
  Stager st;
  const F32 xd = st.view(x, true);
  cuda::add(xd.data, xd.ld, nullptr, 0, bd, x.rows, x.cols, s_);
}

void CudaBackend::gated_act(GateAct act, CF32 gu, F32 out) {
  Stager st;
  const CF32 g = st.view(gu, false);
  const F32 o = st.view(out, true);
  cuda::gated_act(act == GateAct::kGeluTanh ? 1 : 0, g.data, g.ld, o.data, o.ld, out.rows, out.cols, s_);
}

void CudaBackend::softcap(F32 x, float cap) {
  Stager st;
  const F32 xd = st.view(x, true);
  cuda::softcap(xd.data, xd.ld, cap, x.rows, x.cols, s_);
}

void CudaBackend::copy_rows(CF32 src, const int64_t* src_rows, F32 dst, const int64_t* dst_rows,
                            int64_t n) {
  if (n == 0) return;
  Stager st;
  // The views' whole extent: rows may be addressed in any order.
  const CF32 s = st.view(src, false);
  const F32 d = st.view(dst, true);
  const int64_t* sr = st.get(src_rows, size_t(n), false);
  const int64_t* dr = st.get(dst_rows, size_t(n), false);
  cuda::copy_rows(s.data, s.ld, sr, d.data, d.ld, dr, n, src.cols, s_);
}

void CudaBackend::linear(CF32 x, LinearRef w, F32 y) {
  const cuda::DevWeights* dw = resident(w);
  if (!dw) {
    sync();
    return cpu_.linear(x, w, y);
  }
  Stager st;
  const CF32 xd = st.view(x, false);
  const F32 yd = st.view(y, true);
  auto* xb = static_cast<uint16_t*>(xb_.get(size_t(cuda::linear_scratch_bytes(x.rows, *dw))));
  cuda::linear(xd.data, xd.ld, x.rows, *dw, yd.data, yd.ld, xb, s_);
}

void CudaBackend::rope_table(const StepPlan& plan, const float* inv_freq, int64_t n,
                             float attn_factor, F32 cos, F32 sin) {
  // The CPU's own cos/sin (bitwise the reference tables), then one upload.
  const int64_t T = plan.n_tokens();
  std::vector<float> c(size_t(T * n)), s(size_t(T * n));
  for (int64_t t = 0; t < T; ++t) {
    const float pos = float(plan.tokens[size_t(t)].pos);
    for (int64_t j = 0; j < n; ++j) {
      const float a = pos * inv_freq[j];
      c[size_t(t * n + j)] = std::cos(a) * attn_factor;
      s[size_t(t * n + j)] = std::sin(a) * attn_factor;
    }
  }
  if (T == 0 || n == 0) return;
  sync();
  ck(cudaMemcpy2D(cos.data, size_t(cos.ld) * 4, c.data(), size_t(n) * 4, size_t(n) * 4, size_t(T),
                  cudaMemcpyDefault), "rope table");
  ck(cudaMemcpy2D(sin.data, size_t(sin.ld) * 4, s.data(), size_t(n) * 4, size_t(n) * 4, size_t(T),
                  cudaMemcpyDefault), "rope table");
}

void CudaBackend::rope(F32 x, int64_t heads, int64_t stride, int64_t dim, CF32 cos, CF32 sin,
                       bool interleave) {
  Stager st;
  const F32 xd = st.view(x, true);
  const CF32 c = st.view(cos, false), s = st.view(sin, false);
  cuda::rope(xd.data, xd.ld, x.rows, heads, stride, dim, c.data, c.ld, s.data, s.ld, interleave ? 1 : 0, s_);
}

void CudaBackend::kv_store(const StepPlan& plan, int64_t layer, CF32 k, CF32 v) {
  Stager st;
  const Step s = step_tables(plan, layer);
  if (!s.ok || (s.f.elem != 0 && !s.f.dynamic && !s.f.static_k)) {
    sync();
    return cpu_.kv_store(plan, layer, k, v);
  }
  const CF32 kd = st.view(k, false);
  const CF32 vd = st.view(v, false);
  cuda::kv_store(s.st, s.f, kd.data, kd.ld, vd.data, vd.ld, s_);
  pages_back(plan, layer);
}

void CudaBackend::kv_store_index(const StepPlan& plan, int64_t layer, CF32 k) {
  Stager st;
  const Step s = step_tables(plan, layer);
  if (!s.ok) {
    sync();
    return cpu_.kv_store_index(plan, layer, k);
  }
  const CF32 kd = st.view(k, false);
  cuda::kv_store_index(s.st, s.f, kd.data, kd.ld, s_);
  pages_back(plan, layer);
}

void CudaBackend::kv_gather(const StepPlan& plan, int64_t layer, CF32 k_new, CF32 v_new, BF16 k,
                            BF16 v) {
  if (!plan.any_prefill) return;
  Stager st;
  const Step s = step_tables(plan, layer);
  if (!s.ok) {
    sync();
    cpu_.begin_step(plan);
    return cpu_.kv_gather(plan, layer, k_new, v_new, k, v);
  }
  const CF32 kn = st.view(k_new, false), vn = st.view(v_new, false);
  const BF16 gk = st.view(k, true);
  const BF16 gv = v_new.data ? st.view(v, true) : BF16{};
  cuda::kv_gather(s.st, s.f, kn.data, kn.ld, vn.data, vn.ld, gk.data, gk.ld, gv.data, gv.ld, s_);
  staged_.clear();
}

void CudaBackend::attention_decode(const StepPlan& plan, const DecodeAttn& a) {
  if (plan.decode_chunks.empty()) return;
  const bool fits = a.head_dim <= cuda::kMaxAttnDim && a.head_dim % 2 == 0;
  Stager st;
  const Step s = fits ? step_tables(plan, a.layer) : Step{};
  if (!s.ok) {
    sync();
    cpu_.begin_step(plan);
    return cpu_.attention_decode(plan, a);
  }
  cuda::DecodeArgs d;
  const CF32 q = st.view(a.q, false);
  const F32 o = st.view(a.out, true);
  d.q = q.data;
  d.ldq = q.ld;
  d.out = o.data;
  d.ldo = o.ld;
  d.rows_by_token = a.rows_by_token ? 1 : 0;
  d.heads = int32_t(a.heads);
  d.kv_heads = int32_t(a.kv_heads);
  d.head_dim = int32_t(a.head_dim);
  d.scale = a.scale;
  d.window = a.window;
  d.topk = a.topk;
  if (a.topk > 0) {
    const size_t rows = size_t(plan.n_tokens());
    d.sel = st.get(a.sel, rows * size_t(a.topk), false);
    d.sparse = st.get(a.sparse, rows, false);
  }
  const int64_t nf = cuda::decode_partial_floats(s.st.n_decode, a.heads, a.head_dim, plan.max_ctx);
  auto* part = static_cast<float*>(partial_.get(size_t(nf) * 4));
  cuda::attention_decode(s.st, s.f, d, part, s_);
  staged_.clear();
}

void CudaBackend::attention_prefill(const StepPlan& plan, const PrefillAttn& a) {
  if (!plan.any_prefill) return;
  const bool fits = a.head_dim <= cuda::kMaxAttnDim && a.v_dim <= cuda::kMaxAttnDim;
  Stager st;
  const Step s = fits ? step_tables(plan, 0) : Step{};
  if (!s.ok) {
    sync();
    cpu_.begin_step(plan);
    return cpu_.attention_prefill(plan, a);
  }
  cuda::PrefillArgs p;
  const CF32 q = st.view(a.q, false);
  const CBF16 k = st.view(a.k, false), v = st.view(a.v, false);
  const F32 o = st.view(a.out, true);
  p.q = q.data;
  p.ldq = q.ld;
  p.q_head_stride = a.q_head_stride;
  p.k = k.data;
  p.ldk = k.ld;
  p.k_head_stride = a.k_head_stride;
  p.v = v.data;
  p.ldv = v.ld;
  p.v_head_stride = a.v_head_stride;
  p.out = o.data;
  p.ldo = o.ld;
  p.heads = int32_t(a.heads);
  p.group = int32_t(a.group);
  p.head_dim = int32_t(a.head_dim);
  p.v_dim = int32_t(a.v_dim);
  p.scale = a.scale;
  p.softcap = a.softcap;
  p.window = a.window;
  p.topk = a.topk;
  if (a.topk > 0) {
    const size_t rows = size_t(plan.n_tokens());
    p.sel = st.get(a.sel, rows * size_t(a.topk), false);
    p.sparse = st.get(a.sparse, rows, false);
  }
  cuda::attention_prefill(s.st, p, s.prefill_tasks, s.n_prefill_tasks, s_);
  staged_.clear();
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  if (cuda_device_count() == 0) {
    if (why) *why = "no CUDA device (driver or GPU missing)";
    return nullptr;
  }
  return std::make_unique<CudaBackend>();
}

}  // namespace kvant::backend
