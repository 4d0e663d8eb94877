#include "engine/weight_options.h"

namespace kvant {

namespace {

bool precision(const std::string& s, WeightPrecision* out) {
  if (s == "native" || s.empty())
    *out = WeightPrecision::kNative;
  else if (s == "bf16")
    *out = WeightPrecision::kBf16;
  else if (s == "int4")
    *out = WeightPrecision::kInt4;
  else if (s == "fp8")
    *out = WeightPrecision::kFp8;
  else
    return false;
  return true;
}

}  // namespace

Result<WeightOptions> parse_weight_options(const std::string& prefill, const std::string& decode,
                                           int int4_group, bool int4_lm_head) {
  WeightOptions wo;
  if (!precision(prefill, &wo.prefill) || !precision(decode, &wo.decode))
    return make_error("engine: weight precision must be native, bf16, fp8 or int4 (got prefill '" +
                      prefill + "', decode '" + decode + "')");
  if (int4_group != 32 && int4_group != 64 && int4_group != 128)
    return make_error("engine: --int4-group must be 32, 64 or 128, got " +
                      std::to_string(int4_group));
  wo.int4_group = int4_group;
  wo.int4_lm_head = int4_lm_head;
  return wo;
}

}  // namespace kvant
