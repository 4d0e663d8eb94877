// The shared calibration pass (calibration.h).
#include "quant/calibration.h"

#include <algorithm>
#include <string>
#include <vector>

#include "model/seq_kv.h"

namespace kvant {

Result<int64_t> run_calibration(Model& model, std::span<const int32_t> tokens, int64_t chunk,
                                const char* what, Model::LinearObserver observe,
                                const std::function<void(int64_t k, int64_t chunk)>& before_chunk) {
  const ModelConfig& c = model.config();
  chunk = std::min<int64_t>(chunk, c.max_positions);
  const int64_t n_chunks = chunk > 0 ? int64_t(tokens.size()) / chunk : 0;
  if (n_chunks <= 0)
    return make_error(std::string(what) + ": the calibration text has " +
                      std::to_string(tokens.size()) + " tokens, fewer than one chunk of " +
                      std::to_string(chunk));
  model.set_observer(std::move(observe));
  std::vector<float> logits(size_t(c.vocab));
  for (int64_t k = 0; k < n_chunks; ++k) {
    SeqKv kv(c, chunk);
    Batch b;
    b.tokens.assign(tokens.begin() + k * chunk, tokens.begin() + (k + 1) * chunk);
    b.seqs.push_back({&kv, 0, chunk, false});
    if (before_chunk) before_chunk(k, chunk);
    auto r = model.forward(b, logits);
    if (!r) {
      model.set_observer({});
      return r.error();
    }
  }
  model.set_observer({});
  return n_chunks * chunk;
}

}  // namespace kvant
