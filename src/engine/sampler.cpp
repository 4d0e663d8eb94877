// How the sampler avoids O(V log V) per step, V up to 262,144:
// - greedy is one argmax pass;
// - top-k keeps a k-entry heap while scanning the row once (almost every
//   logit loses the first comparison against the heap's worst), then sorts k;
// - without top-k, the row goes through the vectorised softmax kernel into
//   scratch; with no truncation the draw walks it in id order (order does not
//   matter to inverse-CDF sampling); min-p is a threshold, no order needed;
//   top-p's boundary comes from a histogram of mass over value bins, so only
//   the tokens of the one bin the boundary falls in are sorted.
// The generator is SplitMix64: a 64-bit state, a fixed bit-exact sequence on
// every platform (std::uniform_real_distribution's is not), and one draw per
// sampled token, so a request's tokens depend only on its seed and logits.
#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/check.h"
#include "backend/host.h"

namespace kvant {
namespace {

// Sort order of candidates: larger value first, ties to the lower id.
bool before(float va, int32_t ta, float vb, int32_t tb) { return va > vb || (va == vb && ta < tb); }

size_t slot_of(int32_t token, size_t mask) {
  uint32_t x = uint32_t(token) * 0x9E3779B1u;  // Fibonacci hashing spreads consecutive ids
  x ^= x >> 15;
  return size_t(x) & mask;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

Result<void> check_sampling_params(const SamplingParams& p) {
  const auto bad = [](const char* field, const char* rule, double got) {
    return make_error(std::string(field) + " must be " + rule + ", got " + num(got));
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0.f)
    return bad("temperature", "a finite number >= 0", p.temperature);
  if (p.top_k < -1) return bad("top_k", ">= 0 (0 or -1 = off)", p.top_k);
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) return bad("top_p", "in (0, 1]", p.top_p);
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) return bad("min_p", "in [0, 1]", p.min_p);
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.f)
    return bad("repetition_penalty", "a finite number > 0", p.repetition_penalty);
  if (!(p.presence_penalty >= -2.f && p.presence_penalty <= 2.f))
    return bad("presence_penalty", "in [-2, 2]", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.f && p.frequency_penalty <= 2.f))
    return bad("frequency_penalty", "in [-2, 2]", p.frequency_penalty);
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs)
    return bad("top_logprobs", "in [0, 20]", p.top_logprobs);
  if (p.logit_bias.size() > kMaxLogitBias)
    return make_error("logit_bias has " + std::to_string(p.logit_bias.size()) +
                      " entries; at most " + std::to_string(kMaxLogitBias));
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto [t, b] = p.logit_bias[i];
    if (t < 0) return bad("a logit_bias token id", ">= 0", t);
    if (!(b >= -100.f && b <= 100.f)) return bad("a logit_bias value", "in [-100, 100]", b);
    for (size_t j = 0; j < i; ++j)
      if (p.logit_bias[j].first == t)
        return make_error("logit_bias names token " + std::to_string(t) + " twice");
  }
  return {};
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_state_(p.seed) {}

int32_t Sampler::argmax(std::span<const float> l) {
  // The whole cost of a greedy step: the host's SIMD kernel (its index is
  // the scalar first-maximum loop's).
  return int32_t(backend::host_argmax(l.data(), int64_t(l.size())));
}

double Sampler::uniform() {
  uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

// ---------------------------------------------------------------- penalties

bool Sampler::penalised() const {
  return p_.repetition_penalty != 1.f || p_.presence_penalty != 0.f || p_.frequency_penalty != 0.f;
}

void Sampler::rehash(size_t min_entries) {
  size_t cap = std::max<size_t>(16, slots_.size());
  while (cap < 2 * min_entries) cap *= 2;
  if (cap != slots_.size()) slots_.assign(cap, -1);
  std::fill(slots_.begin(), slots_.end(), -1);
  const size_t mask = cap - 1;
  for (size_t i = 0; i < seen_.size(); ++i) {
    size_t h = slot_of(seen_[i].token, mask);
    while (slots_[h] >= 0) h = (h + 1) & mask;
    slots_[h] = int32_t(i);
  }
  seen_.reserve(cap / 2);
}

Sampler::Seen& Sampler::find_or_insert(int32_t token) {
  if (2 * (seen_.size() + 1) > slots_.size()) rehash(seen_.size() + 1);
  const size_t mask = slots_.size() - 1;
  for (size_t h = slot_of(token, mask);; h = (h + 1) & mask) {
    const int32_t s = slots_[h];
    if (s < 0) {
      slots_[h] = int32_t(seen_.size());
      seen_.push_back({token, 0, false});
      return seen_.back();
    }
    if (seen_[size_t(s)].token == token) return seen_[size_t(s)];
  }
}

void Sampler::set_prompt(std::span<const int32_t> prompt, int32_t max_new_tokens) {
  seen_.clear();
  std::fill(slots_.begin(), slots_.end(), -1);
  history_len_ = -1;
  if (!penalised()) return;
  // Presence and frequency ignore the prompt, so without a repetition penalty
  // the prompt's tokens would only lengthen the per-step loop.
  const bool count_prompt = p_.repetition_penalty != 1.f;
  rehash((count_prompt ? prompt.size() : 0) + size_t(std::max(0, max_new_tokens)));
  if (!count_prompt) return;
  for (int32_t t : prompt)
    if (t >= 0) find_or_insert(t).in_prompt = true;
}

void Sampler::accept(int32_t token) {
  if (!penalised() || token < 0) return;
  ++find_or_insert(token).generated;
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const float rep = p_.repetition_penalty;
  const float presence = p_.presence_penalty, frequency = p_.frequency_penalty;
  for (const Seen& s : seen_) {
    if (size_t(s.token) >= logits.size()) continue;
    float& x = logits[size_t(s.token)];
    if (rep != 1.f) x = x > 0.f ? x / rep : x * rep;
    if (s.generated > 0) x -= presence + frequency * float(s.generated);
  }
}

// ---------------------------------------------------------------- sampling

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const bool continues = history_len_ >= 0 && int64_t(history.size()) >= history_len_ &&
                         (history_len_ == 0 || history[size_t(history_len_ - 1)] == history_last_);
  if (!continues) {
    set_prompt(history);
  } else {
    for (size_t i = size_t(history_len_); i < history.size(); ++i) accept(history[i]);
  }
  history_len_ = int64_t(history.size());
  history_last_ = history.empty() ? -1 : history.back();
  return sample(logits);
}

int32_t Sampler::sample(std::span<float> logits, StepLogprobs* logprobs) {
  KV_CHECK(!logits.empty());
  apply_penalties(logits);
  for (const auto& [t, b] : p_.logit_bias)
    if (size_t(t) < logits.size()) logits[size_t(t)] += b;
  const size_t vocab = logits.size();
  int32_t token;
  // Below kGreedyBelow, logits / temperature can overflow FP32; the
  // distribution is a point mass on the top token anyway.
  if (p_.temperature < kGreedyBelow || p_.top_k == 1) {
    token = argmax(logits);
  } else if (p_.top_k > 0 && size_t(p_.top_k) < vocab) {
    token = sample_top_k(logits);
  } else {
    token = sample_softmax(logits);
  }
  if (logprobs) {
    probs_.resize(vocab);
    compute_logprobs(logits, token, p_.top_logprobs, probs_, *logprobs);
  }
  return token;
}

int32_t Sampler::sample_top_k(std::span<const float> logits) {
  const size_t k = size_t(p_.top_k);
  // The heap's front is its worst entry (last in sort order), the one a
  // better logit replaces.
  const auto heap_order = [](const Cand& a, const Cand& b) {
    return before(a.value, a.token, b.value, b.token);
  };
  cand_.clear();
  size_t i = 0;
  for (; i < logits.size() && cand_.size() < k; ++i) {
    const float x = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
    cand_.push_back({x, int32_t(i)});
    std::push_heap(cand_.begin(), cand_.end(), heap_order);
  }
  float worst = cand_.front().value;
  for (; i < logits.size(); ++i) {
    // Strictly greater: an equal logit has a higher id than every entry, so
    // it loses the tie. NaN fails the comparison and is never taken.
    if (!(logits[i] > worst)) continue;
    std::pop_heap(cand_.begin(), cand_.end(), heap_order);
    cand_.back() = {logits[i], int32_t(i)};
    std::push_heap(cand_.begin(), cand_.end(), heap_order);
    worst = cand_.front().value;
  }
  std::sort_heap(cand_.begin(), cand_.end(), heap_order);

  const float mx = cand_[0].value;
  if (!std::isfinite(mx)) return cand_[0].token;  // all masked, or one certain token
  const float inv_t = 1.f / p_.temperature;
  double total = 0;
  for (Cand& c : cand_) {
    c.value = std::exp((c.value - mx) * inv_t);
    total += c.value;
  }
  return truncate_and_draw(cand_.size(), total);
}

int32_t Sampler::sample_softmax(std::span<const float> logits) {
  const size_t vocab = logits.size();
  probs_.resize(vocab);
  float* __restrict pr = probs_.data();
  const float* __restrict lg = logits.data();
  const float inv_t = 1.f / p_.temperature;
  for (size_t i = 0; i < vocab; ++i) pr[i] = lg[i] * inv_t;
  backend::host_softmax(pr, int64_t(vocab));

  // Per-block sums give z and let the untruncated draw find its block
  // without a second pass over the row; four accumulators keep the sums off
  // one serial chain of additions.
  const size_t nblocks = (vocab + kBlock - 1) / kBlock;
  blocks_.resize(nblocks);
  double z = 0;
  float pmax = 0.f;
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t lo = b * kBlock, hi = std::min(vocab, lo + kBlock);
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    float m0 = 0.f, m1 = 0.f;
    size_t i = lo;
    for (; i + 4 <= hi; i += 4) {
      s0 += pr[i];
      s1 += pr[i + 1];
      s2 += pr[i + 2];
      s3 += pr[i + 3];
      m0 = std::max(m0, std::max(pr[i], pr[i + 1]));
      m1 = std::max(m1, std::max(pr[i + 2], pr[i + 3]));
    }
    for (; i < hi; ++i) {
      s0 += pr[i];
      m0 = std::max(m0, pr[i]);
    }
    blocks_[b] = (s0 + s1) + (s2 + s3);
    z += blocks_[b];
    pmax = std::max(pmax, std::max(m0, m1));
  }
  if (!(pmax > 0.f)) return argmax(logits);  // every logit -inf (or NaN)

  if (p_.top_p >= 1.f && p_.min_p <= 0.f) {
    const double r = uniform() * z;
    double acc = 0;
    size_t b = 0;
    while (b + 1 < nblocks && acc + blocks_[b] <= r) acc += blocks_[b++];
    const size_t lo = b * kBlock, hi = std::min(vocab, lo + kBlock);
    for (size_t i = lo; i < hi; ++i) {
      acc += pr[i];
      if (r < acc && pr[i] > 0.f) return int32_t(i);
    }
    // Rounding between the block sum and this sequential one: the block's
    // (or failing that the row's) last token with weight.
    for (size_t i = hi; i-- > 0;)
      if (pr[i] > 0.f) return int32_t(i);
    return argmax(logits);
  }

  // Min-p keeps what reaches a threshold; no order is needed for that.
  const float floor = p_.min_p > 0.f ? p_.min_p * pmax : 0.f;
  if (p_.top_p >= 1.f) {
    cand_.clear();
    for (size_t i = 0; i < vocab; ++i)
      if (pr[i] >= floor && pr[i] > 0.f) cand_.push_back({pr[i], int32_t(i)});
    return draw(cand_.size());
  }
  return draw(nucleus(probs_, floor, double(p_.top_p) * z));
}

size_t Sampler::nucleus(std::span<const float> probs, float floor, double target) {
  // A histogram of probability mass by value, the bins being the top bits of
  // the float (a positive float's bits order like its value): walking down
  // from the top bin finds the bin the boundary falls in. Tokens in higher
  // bins are all kept, tokens in lower bins all dropped, and only the
  // boundary bin (values within 2^(1/8) of each other) needs sorting.
  // hist_ is all zeros between calls; only the bins used are walked and
  // cleared again, which matters for small vocabularies.
  hist_.resize(kBins, 0.0);
  const auto bin = [](float p) { return std::bit_cast<uint32_t>(p) >> kBinShift; };
  uint32_t lo = kBins, hi = 0;
  for (float p : probs) {
    if (p >= floor && p > 0.f) {
      const uint32_t b = bin(p);
      hist_[b] += p;
      lo = std::min(lo, b);
      hi = std::max(hi, b);
    }
  }
  uint32_t edge = lo;
  double above = 0;  // mass of the bins over `edge`
  for (uint32_t b = hi + 1; b-- > lo;) {
    if (above + hist_[b] >= target) {
      edge = b;
      break;
    }
    above += hist_[b];
  }
  if (lo <= hi) std::fill(hist_.begin() + lo, hist_.begin() + hi + 1, 0.0);
  cand_.clear();
  for (size_t i = 0; i < probs.size(); ++i) {
    const float p = probs[i];
    if (p >= floor && p > 0.f && bin(p) >= edge) cand_.push_back({p, int32_t(i)});
  }
  const auto split = std::partition(cand_.begin(), cand_.end(),
                                    [&](const Cand& c) { return bin(c.value) > edge; });
  std::sort(split, cand_.end(), [](const Cand& a, const Cand& b) {
    return before(a.value, a.token, b.value, b.token);
  });
  double acc = above;
  for (auto it = split; it != cand_.end(); ++it) {
    acc += it->value;
    if (acc >= target) return size_t(it - cand_.begin()) + 1;
  }
  // Rounding between the bin sums and this one, or less mass above min-p's
  // floor than top_p asks for: everything gathered.
  return cand_.size();
}

int32_t Sampler::truncate_and_draw(size_t n, double total) {
  if (p_.top_p < 1.f) {
    const double target = double(p_.top_p) * total;
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += cand_[i].value;
      if (acc >= target) {
        n = i + 1;
        break;
      }
    }
  }
  if (p_.min_p > 0.f) {
    const float floor = p_.min_p * cand_[0].value;
    size_t m = 1;
    while (m < n && cand_[m].value >= floor) ++m;
    n = m;
  }
  return draw(n);
}

int32_t Sampler::draw(size_t n) {
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += cand_[i].value;
  const double r = uniform() * total;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += cand_[i].value;
    if (r < acc) return cand_[i].token;
  }
  // Only reached when every weight is 0 (cannot happen after the checks
  // above) or rounding left r at the very end: the last token with weight.
  for (size_t i = n; i-- > 0;)
    if (cand_[i].value > 0.f) return cand_[i].token;
  return cand_[0].token;
}

}  // namespace kvant
