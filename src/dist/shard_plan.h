// Which slice of a model's weights one process holds under tensor
// parallelism (TP) and expert parallelism (EP): plain arithmetic over
// ModelConfig's sizes, shared by the loader (what to read) and the model
// (what to compute, where to all-reduce). It reads no file and knows no
// tensor names.
//
// The split, Megatron-style (the layout vLLM and SGLang use):
//  - Attention: whole KV groups (a KV head and the query heads that read
//    it) per rank: q rows, the output projection's matching input columns.
//      kv_heads >= tp: contiguous KV heads, as evenly as they go (the first
//        kv_heads % tp ranks one more: SmolLM2-135M's 3 over 2 ranks are 2
//        and 1), so models whose head counts tp does not divide still run;
//      kv_heads <  tp: query heads split evenly, each rank holds the one KV
//        head its query heads read, replicated over tp/kv_heads ranks (as
//        vLLM does for GQA models with fewer KV heads than ranks).
//    engine/kv_plan sizes pages for the largest share, ceil(kv_heads/tp).
//  - MLA (DeepSeek-V3, Kimi K2, GLM-5): query heads divided as evenly as
//    they go (q / q_b rows,
//    kv_b's per-head rows, o's columns); the latent row (kv_a, its norm and
//    the cache row kv_lora_rank + qk_rope_dim) is replicated on every rank.
//    Every head reads the whole latent, so splitting it would need a gather
//    per layer; replicating a few hundred values per token is what vLLM and
//    SGLang do for DeepSeek under TP. q_a and the DSA indexer (its heads
//    score tokens for all query heads together) are replicated too.
//  - Dense MLP and shared experts: intermediate columns divided (gate|up
//    rows, down's input columns) in pieces that are multiples of `align`
//    (128: an INT4 group never straddles two ranks), as evenly as blocks of
//    `align` allow; an intermediate size that is not a multiple of align, or
//    has fewer blocks than ranks, is an error.
//  - Vocabulary (embedding rows, output-head rows): tp contiguous pieces of
//    ceil(vocab/tp) ids, the last shorter (or empty); logits gathered from
//    the ranks are vocab_padded wide.
//  - Routed experts: n_experts divided into ep contiguous blocks. With
//    ep > 1 each expert is held whole by the one rank that owns it (not
//    TP-split): a token's expert output is then computed on one rank and
//    only tokens move (all-to-all), never partial sums, and no expert's
//    intermediate size has to split into aligned pieces. With ep == 1 every
//    rank holds every expert, TP-split along moe_ffn like the dense MLP.
//  - Norms, routers and their correction biases: replicated.
// How processes map to (tp_rank, ep_rank) is the launcher's choice; the
// usual one runs EP over the TP ranks (ep == tp, ep_rank == tp_rank).
#pragma once

#include <cstdint>

#include "core/result.h"
#include "model/config.h"

namespace kvant::dist {

// Half-open [begin, end).
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const;
  bool operator==(const Range&) const = default;
};

// One process's share.
struct ShardPlan {
  int tp = 1, tp_rank = 0, ep = 1, ep_rank = 0;
  int64_t align = 128;
  Range q_heads;            // query heads
  Range kv_heads;           // KV heads held; MLA: [0, 1), the one latent row
  int64_t kv_replicas = 1;  // ranks holding each of those KV heads (MLA: tp)
  bool mla_latent_replicated = false;
  // The output projection's input slice (q_heads * head_dim, MLA: * v_head_dim)
  // is a multiple of align: an INT4 o_proj with groups of align can be split.
  bool attn_out_aligned = true;
  Range ffn;         // dense MLP intermediate columns; empty when no layer is dense
  Range shared_ffn;  // shared experts' intermediate columns; empty without
  Range vocab;       // embedding and output-head rows
  int64_t vocab_per_rank = 0, vocab_padded = 0;  // ceil(vocab/tp), tp * that
  Range experts;     // routed experts owned; empty when no layer is routed
  Range moe_ffn;     // each owned expert's intermediate columns: whole when ep > 1
};

// The share of rank (tp_rank, ep_rank). Errors name the numbers that do not
// split: heads % tp, kv_heads vs tp, ffn / moe_shared_ffn / moe_ffn (ep == 1)
// in multiples of align, n_experts % ep, ep > 1 without routed experts,
// ranks out of range, tp or ep below 1.
Result<ShardPlan> make_shard_plan(const ModelConfig& c, int tp, int tp_rank, int ep, int ep_rank,
                                  int64_t align = 128);

// The sizes rank p computes with: heads, kv_heads, ffn, moe_ffn and
// moe_shared_ffn of its share; everything else (vocab, hidden, n_experts,
// the latent, the indexer) as in c. The model runs its forward over these,
// all-reducing after the row-parallel products.
ModelConfig local_config(const ModelConfig& c, const ShardPlan& p);

// Checkpoint parameters (the logical tensors, before any fusion) that a rank
// of plan p holds: every layer's products per the plan, the embedding and an
// untied output head by vocabulary range, norms and routers whole. Summed
// over all ranks it is full_weight_params plus what is replicated. Not
// counted: derived copies (MLA's per-head W_uk/W_uv come from kv_b), GGUF's
// rope_freqs, multi-token-prediction layers.
int64_t shard_weight_params(const ModelConfig& c, const ShardPlan& p);

// The same for one process holding the whole model.
int64_t full_weight_params(const ModelConfig& c);

}  // namespace kvant::dist
