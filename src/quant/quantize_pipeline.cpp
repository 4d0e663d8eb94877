#include "quant/quantize_pipeline.h"

#include "model/model.h"
#include "quant/awq_plan.h"

namespace kvant {

namespace {

// Scales from the BF16 model on the calibration tokens; the model goes with
// the return.
Result<AwqPlan> plan_awq(const QuantizePipelineOptions& o) {
  auto m = Model::load(o.checkpoint.in, {WeightPrecision::kBf16, WeightPrecision::kBf16});
  if (!m) return m.error();
  if (o.log)
    o.log("awq: " + std::to_string(o.calib_tokens.size()) + " calibration tokens from " +
          o.calib_source + ", searching scales...");
  AwqOptions ao;
  ao.group = o.checkpoint.group_size;
  ao.asym = o.checkpoint.asymmetric;
  auto p = awq_plan(**m, o.calib_tokens, o.calib_chunk, o.calib_rows, ao);
  if (!p) return p.error();
  if (o.log)
    for (const auto& line : p->report) o.log("awq: " + line);
  return p;
}

}  // namespace

Result<QuantizeSummary> quantize_model(const QuantizePipelineOptions& o) {
  QuantizeOptions q = o.checkpoint;
  AwqPlan plan;
  if (o.awq) {
    auto p = plan_awq(o);
    if (!p) return p.error();
    plan = std::move(*p);
    q.adjust = [&plan](const std::string& name, const std::vector<int64_t>& shape,
                       std::vector<float>& v) { plan.apply(name, shape, v); };
  }
  return quantize_checkpoint(q);
}

}  // namespace kvant
