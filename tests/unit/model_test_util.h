// Helpers for tests that run whole models: the logits of a token sequence
// fed in chunks (all positions), the golden fixtures' token ids, and the mean
// KL divergence between two sets of logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "logit_digest.h"
#include "model/model.h"

namespace kvant::test {

// Logits [ids.size(), vocab] of one sequence fed `chunk` tokens at a time,
// its KV in the page format `kvo` asks for (BF16 by default).
inline std::vector<float> run_chunked(Model& m, const std::vector<int32_t>& ids, int64_t chunk,
                                      const SeqKvOptions& kvo = {}) {
  const auto& c = m.config();
  SeqKv kv(c, int64_t(ids.size()), kvo);
  std::vector<float> out(ids.size() * size_t(c.vocab));
  for (int64_t p = 0; p < int64_t(ids.size()); p += chunk) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(ids.size()) - p);
    Batch b;
    b.tokens.assign(ids.begin() + p, ids.begin() + p + n);
    b.seqs.push_back({&kv, p, n, true});
    auto r = m.forward(b, std::span<float>(out.data() + p * c.vocab, size_t(n * c.vocab)));
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  }
  logit_digest(out.data(), out.size());
  return out;
}

// ids.json of a golden fixture (tests/fixtures/golden/<name>).
inline std::vector<int32_t> golden_ids(const std::string& name) {
  std::ifstream f(std::string(KVANT_FIXTURES) + "/golden/" + name + "/ids.json");
  return nlohmann::json::parse(f)["ids"].get<std::vector<int32_t>>();
}

// n little-endian FP32 values from a fixture file (logits).
inline std::vector<float> read_f32(const std::string& path, size_t n) {
  std::vector<float> v(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
  EXPECT_TRUE(bool(f)) << path;
  return v;
}

// Mean over rows of KL(softmax(ref) || softmax(got)).
inline double mean_kl(const std::vector<float>& ref, const std::vector<float>& got, int64_t vocab) {
  const int64_t rows = int64_t(ref.size()) / vocab;
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = ref.data() + r * vocab;
    const float* q = got.data() + r * vocab;
    double mp = -1e30, mq = -1e30, sp = 0, sq = 0;
    for (int64_t i = 0; i < vocab; ++i) mp = std::max(mp, double(p[i])), mq = std::max(mq, double(q[i]));
    for (int64_t i = 0; i < vocab; ++i) sp += std::exp(p[i] - mp), sq += std::exp(q[i] - mq);
    for (int64_t i = 0; i < vocab; ++i) {
      const double lp = p[i] - mp - std::log(sp), lq = q[i] - mq - std::log(sq);
      total += std::exp(lp) * (lp - lq);
    }
  }
  return total / double(std::max<int64_t>(rows, 1));
}

}  // namespace kvant::test
