// The model's activations for one step (private to model/ and its blocks):
// allocated by the backend (Backend::alloc, where it computes), planned by
// Model::reserve, grown by a larger step, never touched by the model except
// through backend operations. Shapes are per step: T tokens,
// H hidden, the gathered prefill context `rows`.
#pragma once

#include <cstdint>
#include <vector>

#include <chrono>

#include "model/model.h"

namespace kvant {

struct Model::Workspace {
  int64_t tokens = 0, ctx = 0, gather_rows = 0;
  backend::Buffer<float> x, h, out;    // [T, H]: residual stream, normed input, block output
  backend::Buffer<float> qkv;          // [T, q|k|v] (MLA: the fused first product)
  backend::Buffer<float> attn;         // [T, heads * v_dim]
  backend::Buffer<float> gu, act;      // [T, 2 * ffn], [T, ffn]
  backend::Buffer<float> cos_g, sin_g, cos_l, sin_l;  // [T, head_dim/2] RoPE tables
  backend::Buffer<uint16_t> gk, gv;    // [rows, kv_dim] BF16 context rows (MLA: latent rows in gk)
  // MoE: router logits [T, E], choices and weights [T, k], the expert-sorted
  // rows [T*k, H], their gate|up [T*k, 2F], act [T*k, F] and outputs [T*k, H].
  backend::Buffer<float> moe_logits, moe_w, moe_x, moe_gu, moe_act, moe_y;
  std::vector<int32_t> moe_ids;
  std::vector<int64_t> moe_slot, moe_off, moe_fill;
  // MLA: queries [T, heads*qk]; latent rows [T, D]; decode tokens' q_nope
  // [Td, heads*nope], absorbed queries and latent outputs [Td, heads*D],
  // head outputs [Td, heads*v]; prefill's expanded K [rows, heads*qk] and V
  // [rows, heads*v] (BF16).
  backend::Buffer<float> mq, lat, mdq, mql, mol, mdv;
  backend::Buffer<uint16_t> ek, ev;
  // DSA: indexer queries [T, index_heads*index_head_dim]; each token's chosen
  // positions [T, index_topk] and whether it has a choice.
  backend::Buffer<float> iq;
  // Tensor parallelism: this rank's logit columns [rows, vocab_per_rank] and
  // every rank's, gathered. Expert parallelism: expert output rows sent to
  // and received from each rank, each rank's combined token rows, and the
  // all-gather of them ([ranks * rows_per_rank, H]).
  backend::Buffer<float> lg_local, lg_all, ep_send, ep_recv, ep_own, ep_all;
  std::vector<int64_t> ep_src_rows, ep_recv_slot, ep_fill, ep_base;
  std::vector<size_t> ep_send_bytes, ep_recv_bytes;
  // MTP: the main hidden rows it reads [T, H] and its joined input [T, 2H].
  backend::Buffer<float> mtp_h, mtp_cat;
  std::vector<int64_t> mtp_src;
  std::vector<int32_t> sel;
  std::vector<uint8_t> sparse;
};

template <class F>
void Model::collective(F&& call) {
  const auto t0 = std::chrono::steady_clock::now();
  if (comm_split_) {
    if (auto r = comm_->barrier(); !r) comm_failed(r.error());
    const double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    comm_wait_seconds_ += w;
    comm_seconds_ += w;
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (auto r = call(); !r) comm_failed(r.error());
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

}  // namespace kvant
