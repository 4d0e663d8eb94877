// ModelRunner (model_runner.h): the model behind a pimpl, and each forward's
// chunks turned into the model's batch.
#include "engine/model_runner.h"

#include "dist/communicator.h"
#include "engine/weight_options.h"
#include "io/model_files.h"
#include "model/model.h"

namespace kvant {

struct ModelRunner::Impl {
  std::shared_ptr<dist::Communicator> comm;  // outlives the model (declared first)
  std::unique_ptr<Model> model;
  Batch batch;  // reused: repeated forwards allocate nothing once it has grown
};

int64_t logit_rows(std::span<const RunChunk> chunks) {
  int64_t r = 0;
  for (const RunChunk& c : chunks) r += c.logit_count();
  return r;
}

ModelRunner::ModelRunner() : impl_(std::make_unique<Impl>()) {}
ModelRunner::~ModelRunner() = default;

Result<std::unique_ptr<ModelRunner>> ModelRunner::load(const RunnerOptions& o) {
  auto wo = parse_weight_options(o.prefill_weights, o.decode_weights, o.int4_group, o.int4_lm_head);
  if (!wo) return wo.error();
  wo->backend = o.backend;
  auto files = ModelFiles::open(o.model_path);
  if (!files) return files.error();
  Parallelism par;
  par.comm = o.comm.get();
  par.tp = o.tp;
  par.ep = o.ep;
  auto m = Model::load(**files, *wo, par);
  if (!m) return m.error();
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  r->impl_->comm = o.comm;
  r->impl_->model = std::move(*m);
  return r;
}

const ModelConfig& ModelRunner::config() const { return impl_->model->config(); }
const ModelConfig& ModelRunner::full_config() const { return impl_->model->full_config(); }
std::pair<int64_t, int64_t> ModelRunner::kv_heads_held() const {
  const dist::Range r = impl_->model->shard().kv_heads;
  return {r.begin, r.end};
}
int ModelRunner::rank() const { return impl_->comm ? impl_->comm->rank() : 0; }
int ModelRunner::ranks() const { return impl_->comm ? impl_->comm->size() : 1; }
int ModelRunner::prefill_set() const { return impl_->model->prefill_set(); }
int ModelRunner::decode_set() const { return impl_->model->decode_set(); }
std::string ModelRunner::set_precision(int set) const { return impl_->model->set_precision(set); }
size_t ModelRunner::set_bytes(int set) const { return impl_->model->set_bytes(set); }
std::string ModelRunner::backend_name() const { return impl_->model->backend_name(); }
std::string ModelRunner::device() const { return impl_->model->backend().device(); }

std::function<std::shared_ptr<uint8_t>(size_t)> ModelRunner::kv_arena() const {
  return backend::kv_arena(impl_->model->backend());
}
double ModelRunner::comm_seconds() const { return impl_->model->comm_seconds(); }
void ModelRunner::set_comm_split(bool on) { impl_->model->set_comm_split(on); }
double ModelRunner::comm_wait_seconds() const { return impl_->model->comm_wait_seconds(); }

void ModelRunner::reserve(int64_t tokens, int64_t context) {
  impl_->model->reserve(tokens, context);
}

Result<void> ModelRunner::forward(std::span<const RunChunk> chunks, std::span<float> logits) {
  Batch& b = impl_->batch;
  b.tokens.clear();
  b.seqs.clear();
  for (const RunChunk& c : chunks) {
    b.tokens.insert(b.tokens.end(), c.tokens.begin(), c.tokens.end());
    b.seqs.push_back({c.kv, c.pos0, int64_t(c.tokens.size()), c.all_logits, c.logit_skip});
  }
  return impl_->model->forward(b, logits);
}

}  // namespace kvant
