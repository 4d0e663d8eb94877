// The model's activations for one step (private to model/ and its blocks):
// planned by Model::reserve, grown by a larger step, never touched by the
// model except through backend operations. Shapes are per step: T tokens,
// H hidden, the gathered prefill context `rows`.
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "model/model.h"

namespace kvant {

struct Model::Workspace {
  int64_t tokens = 0, ctx = 0, gather_rows = 0;
  AlignedBuffer<float> x, h, out;    // [T, H]: residual stream, normed input, block output
  AlignedBuffer<float> qkv;          // [T, q|k|v] (MLA: the fused first product)
  AlignedBuffer<float> attn;         // [T, heads * v_dim]
  AlignedBuffer<float> gu, act;      // [T, 2 * ffn], [T, ffn]
  AlignedBuffer<float> cos_g, sin_g, cos_l, sin_l;  // [T, head_dim/2] RoPE tables
  AlignedBuffer<uint16_t> gk, gv;    // [rows, kv_dim] BF16 context rows (MLA: latent rows in gk)
  // MoE: router logits [T, E], choices and weights [T, k], the expert-sorted
  // rows [T*k, H], their gate|up [T*k, 2F], act [T*k, F] and outputs [T*k, H].
  AlignedBuffer<float> moe_logits, moe_w, moe_x, moe_gu, moe_act, moe_y;
  std::vector<int32_t> moe_ids;
  std::vector<int64_t> moe_slot, moe_off, moe_fill;
  // MLA: queries [T, heads*qk]; latent rows [T, D]; decode tokens' q_nope
  // [Td, heads*nope], absorbed queries and latent outputs [Td, heads*D],
  // head outputs [Td, heads*v]; prefill's expanded K [rows, heads*qk] and V
  // [rows, heads*v] (BF16).
  AlignedBuffer<float> mq, lat, mdq, mql, mol, mdv;
  AlignedBuffer<uint16_t> ek, ev;
  // DSA: indexer queries [T, index_heads*index_head_dim]; each token's chosen
  // positions [T, index_topk] and whether it has a choice.
  AlignedBuffer<float> iq;
  std::vector<int32_t> sel;
  std::vector<uint8_t> sparse;
};

}  // namespace kvant
