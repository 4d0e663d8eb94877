// The CPU backend: the backend operations over one CPU kernel table
// (kernels/cpu/kernels.h), with all of the forward pass's threading (OpenMP,
// through core/threads.h) and its scratch. make_cpu_backend() takes the best
// table this machine runs; the op tests also build one over the scalar table
// as the reference every backend is checked against.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/aligned.h"
#include "core/threads.h"
#include "kernels/cpu/kernels.h"

namespace kvant::backend {

class CpuBackend final : public Backend {
 public:
  // threads: 0 = the process's OpenMP thread count; 1 = no parallel regions.
  explicit CpuBackend(const kernels::KernelTable& k, int threads = 0, const char* name = "cpu");
  const char* name() const override { return name_; }
  std::string device() const override { return kernels::isa_name(K_.isa); }
  const kernels::KernelTable& kernels() const { return K_; }

  Matrix prepare_bf16(const uint16_t* w, int64_t rows, int64_t cols) const override;
  Q4Matrix prepare_int4(const int8_t* q, const float* scale, const int8_t* zero, int64_t rows,
                        int64_t cols, int64_t group) const override;
  F8Matrix prepare_fp8(const uint8_t* codes, const float* scale, int64_t rows, int64_t cols,
                       int64_t group) const override;

  DeviceBuffer alloc(size_t bytes) override;
  void reserve(const WorkspaceSize& size) override;
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
  // Decode attention over a long context can split one KV head's work over
  // threads (scores by page-aligned token ranges, the weighted sum by
  // head_dim ranges where the tasks do not go evenly over the threads;
  // bitwise the same result): taken when a step's (sequence, KV head) tasks
  // number fewer than twice the threads and leave some idle (not a multiple
  // of the thread count), and some context holds min_ctx tokens or more;
  // score ranges of at least min_part tokens. force (tests) takes it whenever
  // it applies at all; plan_threads (tests), when positive, stands for the
  // thread count in choosing which tasks' weighted sums go whole. min_ctx 0
  // turns it off. The default, 2,048
  // (KVANT_DECODE_SPLIT_CTX overrides it), is where it measured faster on
  // SmolLM2-135M (3 KV heads, 2 threads): 10-14% at 8,192 and 16,384
  // tokens of context, up to 10% at 4,096, no slower at 1,024
  // (docs/BENCHMARKS.md).
  static constexpr int64_t kDecodeSplitMinCtx = 2048, kDecodeSplitMinPart = 256;
  void tune_decode_split(int64_t min_ctx, int64_t min_part, bool force, int64_t plan_threads = 0) {
    split_min_ctx_ = min_ctx;
    split_min_part_ = min_part;
    split_force_ = force;
    split_plan_threads_ = plan_threads;
  }
  void attention_prefill(const StepPlan& plan, const PrefillAttn& a) override;

  void moe_route(const RouterConfig& rc, CF32 logits, const float* bias, int32_t* ids,
                 float* weights) override;
  void moe_permute(const int32_t* ids, int64_t k, int64_t experts, CF32 x, F32 xs,
                   const MoeSort& sort) override;
  void moe_combine(CF32 ys, const float* weights, const int64_t* slot, int64_t k,
                   F32 out) override;

  void mla_expand(const MlaExpand& a) override;
  void dsa_select(const StepPlan& plan, int64_t layer, CF32 q, CF32 head_w, int64_t heads,
                  int64_t head_dim, int64_t topk, int32_t* sel, uint8_t* sparse) override;

 private:
  // Prefill attention takes this many consecutive tokens of one head (or of
  // a KV head's query group, kGroupScoreBytes) per task, so each K and V row
  // is read once for all of them (attn_*_multi).
  static constexpr int64_t kPrefillQueries = 16;
  // Per-thread score bytes up to which a KV head's query heads share a prefill task.
  static constexpr int64_t kGroupScoreBytes = int64_t(32) << 20;
  // MLA prefill expands cached latent rows this many at a time.
  static constexpr int64_t kExpandRows = 256;

  struct DecodeTask {
    int64_t d;       // index among the step's decoding chunks
    int64_t kvh;     // KV head
    int64_t h0, nh;  // query heads [h0, h0 + nh)
  };
  // One decode task's share of a split step: its scores rows (nh of them,
  // lds apart, from split_scores_ + s_off) and page pointers (4 arrays of
  // np from split_ptrs_ + p_off).
  struct SplitTask {
    int64_t n, np, lds, s_off, p_off;
  };
  struct SplitUnit {
    int64_t task, a0, a1;  // pages [a0, a1), a head a0, or dims [a0, a1)
  };
  struct PrefillTask {
    int64_t chunk, t, h, n;  // n consecutive tokens from activation row t, query head h
    int64_t nh = 1;          // query heads h .. h+nh-1 (one KV head's group) in one task
  };
  struct GatherPiece {
    int64_t chunk, j0, j1;  // positions [j0, j1) of one page
  };

  int threads() const;
  template <class Fn>
  void pfor(int64_t n, int64_t grain, Fn&& fn) const {
    parallel_for_n(threads(), n, grain, fn);
  }
  // Grows per-thread attention scratch to `rows` score rows of `ctx` and
  // `pages` page pointers (allocates only past the largest seen).
  void ensure_attention(int64_t rows, int64_t ctx, int64_t pages);
  float* scores_for(int tid) { return scores_.data() + int64_t(tid) * score_rows_ * ctx_; }
  const uint8_t** ptrs_for(int tid) { return ptrs_.data() + int64_t(tid) * 4 * pages_; }
  bool decode_split_applies(const StepPlan& plan, const DecodeAttn& a) const;
  void attention_decode_split(const StepPlan& plan, const DecodeAttn& a);
  void linear_bf16(CF32 x, const Matrix& w, F32 y);
  void linear_int4(CF32 x, const Q4Matrix& w, F32 y);
  void linear_fp8(CF32 x, const F8Matrix& w, F32 y);
  const uint16_t* rows_bf16(CF32 x, int64_t k);

  const kernels::KernelTable& K_;
  int threads_;
  const char* name_;
  // Linear products: BF16 activations, int8 activation blocks.
  AlignedBuffer<uint16_t> xb_;
  AlignedBuffer<int8_t> q8_;
  AlignedBuffer<float> q8_s_;
  AlignedBuffer<int32_t> q8_sum_;
  // Attention: per thread, score rows and page pointers (K, V, K scales, V scales).
  AlignedBuffer<float> scores_;
  AlignedBuffer<const uint8_t*> ptrs_;
  int64_t score_rows_ = 0, ctx_ = 0, pages_ = 0;
  // Per-step task lists (begin_step, or the first operation that needs them).
  std::vector<GatherPiece> pieces_;
  std::vector<DecodeTask> decode_tasks_;
  std::vector<PrefillTask> prefill_tasks_;
  // The tasks were built for (step, kv_heads, group, head block) and (step, heads).
  int64_t step_ = 0, decode_key_[4] = {-1, 0, 0, 0}, prefill_key_[3] = {-1, 0, 0};
  // Split decode attention (tune_decode_split): tasks, work units, scratch.
  int64_t split_min_ctx_ = kDecodeSplitMinCtx, split_min_part_ = kDecodeSplitMinPart,
          split_plan_threads_ = 0;
  bool split_force_ = false;
  std::vector<SplitTask> split_tasks_;
  std::vector<SplitUnit> split_units_[3];
  AlignedBuffer<float> split_scores_;
  AlignedBuffer<const uint8_t*> split_ptrs_;
  // Router, DSA and MLA scratch.
  std::vector<float> router_;
  std::vector<float> dsa_score_;
  std::vector<int32_t> dsa_order_;
  std::vector<uint8_t> dsa_keep_;
  AlignedBuffer<float> exp_in_, exp_out_;
};

}  // namespace kvant::backend
