// Statistics for `kvant eval`: 95% confidence intervals of accuracies and
// means, paired and unpaired differences, and the KL-divergence summary
// llama.cpp's `llama-perplexity --kl-divergence` prints (mean, median, 99th
// percentile and max KL, same-top-1 rate, RMS of the change in the actual
// next token's probability).
#pragma once

#include <cstdint>
#include <vector>

namespace kvant::eval {

inline constexpr double kZ95 = 1.959963984540054;

struct Estimate {
  double value = 0, se = 0, lo = 0, hi = 0;  // lo/hi: the 95% interval
  int64_t n = 0;
};

// The mean of 0/1 outcomes: se = sqrt(p(1-p)/(n-1)) (the harness's
// standard error), interval by Wilson's score method (stays inside [0, 1]).
Estimate proportion(int64_t k, int64_t n);
// The mean of arbitrary values; normal interval mean +- z * sd / sqrt(n).
Estimate mean_of(const std::vector<double>& x);
// exp() of the per-token mean NLL, from per-window NLL sums and token counts:
// the interval is exp() of the interval of the token-weighted mean NLL, its
// standard error taken over windows (a ratio estimator).
Estimate perplexity(const std::vector<double>& nll_sum, const std::vector<double>& tokens);

// b - a over the same items (per-item values in the same order): normal
// interval of the mean difference; significant when it excludes 0.
struct Difference {
  double diff = 0, se = 0, lo = 0, hi = 0;
  int64_t n = 0;
  bool paired = false;
  bool significant = false;
};
Difference paired_difference(const std::vector<double>& a, const std::vector<double>& b);
// b - a from two independent estimates.
Difference unpaired_difference(const Estimate& a, const Estimate& b);

// Linear interpolation between order statistics at fraction*(n-1), as
// llama-perplexity does; `sorted` ascending and non-empty.
double percentile(const std::vector<double>& sorted, double fraction);

struct KlSummary {
  Estimate mean_kl;  // mean +- se over positions
  double median_kl = 0, p99_kl = 0, p90_kl = 0, max_kl = 0, min_kl = 0;
  Estimate same_top1;  // share of positions whose top-1 token agrees
  Estimate rms_dp;     // sqrt(mean dp^2); se by the delta method
  int64_t positions = 0;
};
// kl, dp (candidate minus reference probability of the actual next token)
// and same (1 when the top-1 tokens agree) per position.
KlSummary kl_summary(const std::vector<double>& kl, const std::vector<double>& dp,
                     const std::vector<double>& same);

// KL(P || Q) from the reference's top-K log-probabilities (most likely
// first) and the candidate's log-probabilities of the same tokens: the K
// tokens plus one bucket for the rest of each distribution. With K = the
// whole vocabulary this is the exact KL; otherwise a lower bound (merging
// outcomes never raises KL), tight when the reference's mass sits in its top K.
double kl_topk(const float* ref_lp, const double* cand_lp_same_ids, int64_t k);

}  // namespace kvant::eval
