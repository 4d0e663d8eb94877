// Mixture-of-Experts routing: from a token's router logits to the experts
// it is sent to and their weights, for the router kinds of the models kvant
// targets:
//  - softmax top-k (Qwen3-MoE): weights are the softmax probabilities of the
//    chosen experts, renormalised to sum 1 when norm_topk_prob;
//  - sigmoid with a score-correction bias and group-limited top-k
//    (DeepSeek-V3 / Kimi K2 "noaux_tc", GLM-4.5 and GLM-5): the bias only
//    steers the choice; experts are chosen among the topk_group groups whose
//    two best biased scores sum highest; weights are the unbiased sigmoid
//    scores, renormalised when norm_topk_prob, times routed_scaling_factor.
// Owns the arithmetic only (FP32, as the reference routers run); the router
// projection and the expert products belong to the MoE block.
#pragma once

#include <cstdint>

namespace kvant {

enum class RouterScoring : uint8_t { kSoftmax, kSigmoid };

struct RouterConfig {
  RouterScoring scoring = RouterScoring::kSoftmax;
  int n_experts = 0;
  int top_k = 0;
  int n_group = 1;     // experts split into n_group equal groups
  int topk_group = 1;  // groups the choice may use
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.f;
};

// Scratch floats route_tokens needs.
inline int64_t router_scratch_size(const RouterConfig& c) { return 2 * int64_t(c.n_experts) + c.n_group; }

// logits: [T, n_experts]; bias: [n_experts] (e_score_correction_bias) or
// nullptr. Writes ids [T, top_k] and weights [T, top_k], each token's experts
// in ascending id order. Ties in a choice go to the lower index.
void route_tokens(const RouterConfig& c, const float* logits, const float* bias, int64_t T,
                  int32_t* ids, float* weights, float* scratch);

}  // namespace kvant
