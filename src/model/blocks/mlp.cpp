// The dense gated MLP: gate|up in one product, act(gate) * up, down.
#include "model/blocks/blocks.h"
#include "model/model_impl.h"

namespace kvant {

void Model::mlp_forward(int64_t l) {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t T = plan_.n_tokens();
  const auto gu = backend::dense(ws.gu.data(), T, 2 * c.ffn);
  const auto act = backend::dense(ws.act.data(), T, c.ffn);
  linear(l, 2, backend::dense(ws.h.data(), T, c.hidden), gu);
  be_->gated_act(gate_act(c.act), gu, act);
  linear(l, 3, act, backend::dense(ws.out.data(), T, c.hidden));
  reduce_tp(backend::dense(ws.out.data(), T, c.hidden));  // each rank's ffn columns' share
}

}  // namespace kvant
