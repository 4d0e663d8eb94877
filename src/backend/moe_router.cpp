// MoE routing arithmetic (moe_router.h).
#include "backend/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvant {
namespace {

// Indices of the k largest values (ties: lower index first), in choice order.
void top_k(const float* v, int n, int k, int32_t* out) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      bool used = false;
      for (int u = 0; u < j && !used; ++u) used = out[u] == i;
      if (used) continue;
      if (best < 0 || v[i] > v[best]) best = i;
    }
    out[j] = best;
  }
}

}  // namespace

void route_tokens(const RouterConfig& c, const float* logits, const float* bias, int64_t T,
                  int32_t* ids, float* weights, float* scratch) {
  const int E = c.n_experts, k = c.top_k, G = std::max(1, c.n_group), per = E / G;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* score = scratch;       // [E] the weights' source
  float* choice = scratch + E;  // [E] what the choice ranks
  float* group = scratch + 2 * E;
  for (int64_t t = 0; t < T; ++t) {
    const float* x = logits + t * E;
    if (c.scoring == RouterScoring::kSoftmax) {
      float mx = kNegInf;
      for (int e = 0; e < E; ++e) mx = std::max(mx, x[e]);
      float sum = 0.f;
      for (int e = 0; e < E; ++e) sum += (score[e] = std::exp(x[e] - mx));
      for (int e = 0; e < E; ++e) score[e] /= sum;
    } else {
      for (int e = 0; e < E; ++e) score[e] = 1.f / (1.f + std::exp(-x[e]));
    }
    for (int e = 0; e < E; ++e) choice[e] = score[e] + (bias ? bias[e] : 0.f);
    if (G > 1 && c.topk_group < G) {
      // A group's score: the sum of its two best biased scores.
      for (int g = 0; g < G; ++g) {
        int32_t two[2];
        top_k(choice + g * per, per, std::min(2, per), two);
        group[g] = choice[g * per + two[0]] + (per > 1 ? choice[g * per + two[1]] : 0.f);
      }
      int32_t keep[64];
      const int kg = std::min(c.topk_group, 64);
      top_k(group, G, kg, keep);
      for (int g = 0; g < G; ++g) {
        if (std::find(keep, keep + kg, g) != keep + kg) continue;
        for (int e = g * per; e < (g + 1) * per; ++e) choice[e] = kNegInf;
      }
    }
    int32_t* id = ids + t * k;
    float* w = weights + t * k;
    top_k(choice, E, k, id);
    std::sort(id, id + k);
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += (w[j] = score[id[j]]);
    // The sigmoid routers add 1e-20 to the sum (a zero-score guard).
    if (c.norm_topk_prob)
      for (int j = 0; j < k; ++j) w[j] /= c.scoring == RouterScoring::kSigmoid ? sum + 1e-20f : sum;
    for (int j = 0; j < k; ++j) w[j] *= c.routed_scaling_factor;
  }
}

}  // namespace kvant
