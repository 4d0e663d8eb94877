#include "eval/stats.h"

#include <algorithm>
#include <cmath>

namespace kvant::eval {

Estimate proportion(int64_t k, int64_t n) {
  Estimate e;
  e.n = n;
  if (n <= 0) return e;
  const double p = double(k) / double(n);
  e.value = p;
  e.se = n > 1 ? std::sqrt(p * (1 - p) / double(n - 1)) : 0;
  const double z = kZ95, z2 = z * z, nn = double(n);
  const double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / (1 + z2 / nn);
  e.lo = std::max(0.0, centre - half);
  e.hi = std::min(1.0, centre + half);
  return e;
}

Estimate mean_of(const std::vector<double>& x) {
  Estimate e;
  e.n = int64_t(x.size());
  if (x.empty()) return e;
  double s = 0;
  for (double v : x) s += v;
  e.value = s / double(x.size());
  if (x.size() > 1) {
    double ss = 0;
    for (double v : x) ss += (v - e.value) * (v - e.value);
    e.se = std::sqrt(ss / double(x.size() - 1) / double(x.size()));
  }
  e.lo = e.value - kZ95 * e.se;
  e.hi = e.value + kZ95 * e.se;
  return e;
}

Estimate perplexity(const std::vector<double>& nll, const std::vector<double>& tok) {
  Estimate e;
  const size_t w = std::min(nll.size(), tok.size());
  double sn = 0, st = 0;
  for (size_t i = 0; i < w; ++i) sn += nll[i], st += tok[i];
  e.n = int64_t(st);
  if (st <= 0) return e;
  const double m = sn / st;
  double se = 0;
  if (w > 1) {
    // Ratio estimator: residuals nll_i - m * tok_i over windows.
    const double tbar = st / double(w);
    double ss = 0;
    for (size_t i = 0; i < w; ++i) ss += (nll[i] - m * tok[i]) * (nll[i] - m * tok[i]);
    se = std::sqrt(ss / double(w - 1) / double(w)) / tbar;
  }
  e.value = std::exp(m);
  e.se = e.value * se;
  e.lo = std::exp(m - kZ95 * se);
  e.hi = std::exp(m + kZ95 * se);
  return e;
}

Difference paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  Difference d;
  d.paired = true;
  const size_t n = std::min(a.size(), b.size());
  std::vector<double> diff(n);
  for (size_t i = 0; i < n; ++i) diff[i] = b[i] - a[i];
  const Estimate e = mean_of(diff);
  d.n = int64_t(n);
  d.diff = e.value;
  d.se = e.se;
  d.lo = e.lo;
  d.hi = e.hi;
  d.significant = n > 1 && (d.lo > 0 || d.hi < 0);
  return d;
}

Difference unpaired_difference(const Estimate& a, const Estimate& b) {
  Difference d;
  d.n = std::min(a.n, b.n);
  d.diff = b.value - a.value;
  d.se = std::sqrt(a.se * a.se + b.se * b.se);
  d.lo = d.diff - kZ95 * d.se;
  d.hi = d.diff + kZ95 * d.se;
  d.significant = d.se > 0 && (d.lo > 0 || d.hi < 0);
  return d;
}

double percentile(const std::vector<double>& v, double f) {
  if (f <= 0) return v.front();
  if (f >= 1) return v.back();
  const double p = f * double(v.size() - 1);
  const size_t i = size_t(p);
  const double t = p - double(i);
  return (1 - t) * v[i] + t * v[std::min(i + 1, v.size() - 1)];
}

KlSummary kl_summary(const std::vector<double>& kl, const std::vector<double>& dp,
                     const std::vector<double>& same) {
  KlSummary s;
  s.positions = int64_t(kl.size());
  if (kl.empty()) return s;
  s.mean_kl = mean_of(kl);
  std::vector<double> k = kl;
  std::sort(k.begin(), k.end());
  s.median_kl = percentile(k, 0.5);
  s.p90_kl = percentile(k, 0.9);
  s.p99_kl = percentile(k, 0.99);
  s.max_kl = k.back();
  s.min_kl = k.front();
  int64_t agree = 0;
  for (double x : same) agree += x > 0.5;
  s.same_top1 = proportion(agree, int64_t(same.size()));
  std::vector<double> d2(dp.size());
  for (size_t i = 0; i < dp.size(); ++i) d2[i] = dp[i] * dp[i];
  const Estimate m2 = mean_of(d2);
  s.rms_dp.n = m2.n;
  s.rms_dp.value = std::sqrt(m2.value);
  s.rms_dp.se = s.rms_dp.value > 0 ? m2.se / (2 * s.rms_dp.value) : 0;
  s.rms_dp.lo = std::max(0.0, s.rms_dp.value - kZ95 * s.rms_dp.se);
  s.rms_dp.hi = s.rms_dp.value + kZ95 * s.rms_dp.se;
  return s;
}

double kl_topk(const float* ref_lp, const double* cand, int64_t k) {
  double kl = 0, pr = 0, qr = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double lp = ref_lp[i];
    const double p = std::exp(lp);
    kl += p * (lp - cand[i]);
    pr += p;
    qr += std::exp(cand[i]);
  }
  const double p_rest = 1 - pr, q_rest = 1 - qr;
  if (p_rest > 1e-12) kl += p_rest * (std::log(p_rest) - std::log(std::max(q_rest, 1e-30)));
  return std::max(0.0, kl);
}

}  // namespace kvant::eval
