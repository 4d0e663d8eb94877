#include "quant/quantize_pipeline.h"

#include "model/model.h"
#include "numerics/int4_rtn.h"
#include "quant/awq_plan.h"
#include "quant/gptq_plan.h"

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

GptqOptions gptq_options(const QuantizePipelineOptions& o) {
  GptqOptions g;
  g.group = o.checkpoint.group_size;
  g.asym = o.checkpoint.asymmetric;
  g.damp = o.gptq_damp;
  g.act_order = o.gptq_act_order;
  g.sink_weight = o.gptq_sink_weight;
  g.clip = o.clip;
  return g;
}

// Hessians from the BF16 model on the calibration tokens.
Result<GptqPlan> plan_gptq(const QuantizePipelineOptions& o) {
  auto m = Model::load(o.checkpoint.in, {WeightPrecision::kBf16, WeightPrecision::kBf16});
  if (!m) return m.error();
  if (o.log)
    o.log("gptq: " + std::to_string(o.calib_tokens.size()) + " calibration tokens from " +
          o.calib_source + ", accumulating Hessians...");
  return gptq_plan(**m, o.calib_tokens, o.calib_chunk, gptq_options(o));
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
  GptqPlan gplan;
  if (o.gptq) {
    auto p = plan_gptq(o);
    if (!p) return p.error();
    gplan = std::move(*p);
    if (o.awq) gplan.col_mul = &plan.col_mul;
    q.quantize_int4 = [&gplan, &o](const std::string& name, const std::vector<int64_t>& shape,
                                   const std::vector<float>& v) {
      auto r = gplan.quantize(name, shape, v);
      if (r && *r && o.log) o.log("gptq: " + gplan.report.back());
      return r;
    };
  }
  if (o.clip && !o.gptq)
    q.quantize_int4 = [&plan, group = q.group_size, asym = q.asymmetric](const std::string& name, const std::vector<int64_t>& shape,
                              const std::vector<float>& v) -> Result<std::optional<Int4Weight>> {
      if (shape.size() != 2) return std::optional<Int4Weight>();
      const auto e = plan.col_energy.find(name);
      const float* h = e != plan.col_energy.end() && int64_t(e->second.size()) == shape[1]
                           ? e->second.data()
                           : nullptr;
      return std::optional<Int4Weight>(rtn_quantize_clipped(
          v.data(), shape[0], shape[1], group, asym, h));
    };
  return quantize_checkpoint(q);
}

}  // namespace kvant
