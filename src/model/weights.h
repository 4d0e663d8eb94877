// In-memory weights of a decoder: every linear product prepared by the
// backend (backend/prepared.h) from the logical weights the loader reads,
// FP32 norms and biases. Projections that read the same input are fused at
// load (q|k|v, gate|up) so each needs one matrix product per step.
// for_each_linear visits every product of a set, so sizes and precision
// reports list nothing by hand.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/prepared.h"

namespace kvant {

// One weight set: every linear layer is either BF16 (Matrix) or INT4 / FP8
// (QMatrix, when its *_q field is non-empty); embeddings and norms are
// always BF16/FP32. A model may hold two sets, one per phase (model.h).
// One routed expert's gated MLP: BF16, INT4 or FP8 like the dense products.
struct ExpertWeights {
  Matrix gate_up;  // [2*moe_ffn, hidden]
  Matrix down;     // [hidden, moe_ffn]
  QMatrix gate_up_q, down_q;
};

struct LayerWeights {
  std::vector<float> attn_norm;       // [hidden]
  Matrix wqkv;                        // [q_dim + 2*kv_dim, hidden]
  QMatrix wqkv_q, wo_q, w_gate_up_q, w_down_q;  // INT4 or FP8 forms of the four products
  std::vector<float> bqkv;            // [q_dim + 2*kv_dim] or empty
  std::vector<float> q_norm, k_norm;  // [head_dim] or empty
  Matrix wo;                          // [hidden, q_dim]
  std::vector<float> post_attn_norm;  // [hidden] or empty (Gemma)
  std::vector<float> ffn_norm;        // [hidden]
  Matrix w_gate_up;                   // [2*ffn, hidden]: gate rows, then up rows
  Matrix w_down;                      // [hidden, ffn]
  std::vector<float> post_ffn_norm;   // [hidden] or empty (Gemma)
  // MoE layers (config.moe_layer): the router stays BF16; w_gate_up and
  // w_down are then empty.
  Matrix router;                      // [n_experts, hidden]
  std::vector<float> router_bias;     // [n_experts] score-correction bias, or empty
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;               // shared experts (gate_up empty when none)
  // Multi-head latent attention (config.mla()). wqkv then holds the products
  // that read the normed input, [q_a or q (q_lora_rank or heads*qk) ;
  // kv_a (kv_lora_rank + qk_rope_dim)], and wo is [hidden, heads*v_head_dim].
  std::vector<float> q_a_norm, kv_a_norm;  // [q_lora_rank] (empty without), [kv_lora_rank]
  Matrix wq_b;                             // [heads*qk, q_lora_rank]
  QMatrix wq_b_q;
  Matrix wkv_b;                            // [heads*(qk_nope+v), kv_lora_rank]: prefill expands K, V
  // Decode with the up-projections absorbed: per head, k_nope's W_uk
  // transposed [kv_lora_rank, qk_nope] (query -> latent space) and v's W_uv
  // [v_head_dim, kv_lora_rank] (latent output -> head output).
  std::vector<Matrix> w_uk_t, w_uv;
  // GLM-5 sparse-attention indexer (layers that run their own): its key and
  // head-weight products ride in wqkv after kv_a; the query product reads the
  // normed q_a; LayerNorm on the key.
  Matrix idx_wq_b;                          // [index_heads*index_head_dim, q_lora_rank]
  std::vector<float> idx_k_norm, idx_k_bias;  // [index_head_dim]
};

// A multi-token-prediction layer's own parts (its decoder layer is
// ModelWeights::layers[layers + k]): the norms of the next token's embedding
// and of the main hidden state, the projection of the two concatenated
// [hidden, 2*hidden], and the norm before the output head. The embedding
// and the head are the main model's (the checkpoints' copies are the same
// tensors).
struct MtpWeights {
  std::vector<float> enorm, hnorm, head_norm;  // [hidden]
  Matrix eh_proj;                              // [hidden, 2*hidden]: [embedding ; hidden] inputs
};

struct ModelWeights {
  Matrix embed;                  // [vocab, hidden]
  Matrix output;                 // [vocab, hidden]; empty when tied to embed
  QMatrix output_q;             // INT4 or FP8 lm_head, when quantized
  std::vector<float> out_norm;   // [hidden]
  std::vector<float> rope_freq_factors;  // [head_dim/2] divisors (Llama 3 GGUF), or empty
  std::vector<LayerWeights> layers;  // the main layers, then the MTP layers' decoder layers
  std::vector<MtpWeights> mtp;
  const Matrix& lm_head() const { return output.rows ? output : embed; }
};

// One linear product of a set, as for_each_linear visits it.
struct LinearInfo {
  std::string name;             // e.g. "layers.3.experts.17.down"
  const Matrix* bf16 = nullptr;
  const QMatrix* q = nullptr;  // nullptr: a product that is always BF16 (router, MLA's W_kv_b, ...)
  bool head = false;             // the embedding or the output projection
};
// Calls fn for every linear product of a set, the embedding and the output
// head included.
void for_each_linear(const ModelWeights& w, const std::function<void(const LinearInfo&)>& fn);

// What a set holds, from for_each_linear: "bf16", "int4" or "fp8" (every
// product of the layers that can take a quantized form holds that one; the
// output head is reported on its own, --int4-lm-head) or "mixed"; and its
// bytes in memory.
std::string weights_precision(const ModelWeights& w);
size_t weights_bytes(const ModelWeights& w);

}  // namespace kvant
