// `kvant quantize`: writes a GGUF or Hugging Face checkpoint out as a Hugging
// Face directory with compressed-tensors pack-quantized INT4 linears, or
// float-quantized FP8 ones (--format fp8). Option
// parsing, the calibration text's tokens, progress and the size report only;
// the work is quant/ (quantize_pipeline.h: AWQ scales, then checkpoint.h).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "quant/quantize_pipeline.h"

namespace kvant::cli {
namespace {

struct QuantizeCliOpts {
  std::string in, out, method = "rtn", format = "int4";
  std::vector<std::string> calib;  // texts, their tokens in the order given
  int group_size = 128;
  bool asym = false, quantize_lm_head = false, json = false, strict_groups = false,
       act_order = false, clip = false;
  double damp = 0.01, sink_weight = 1.0;
  int64_t calib_tokens = 0, calib_rows = 256;  // calib_tokens 0: the method's default
  std::vector<std::string> keep;
  int threads = 0;
};

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvant quantize: %s\n", msg.c_str());
  return 1;
}

std::string mb(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", double(b) / 1e6);
  return buf;
}

int run_quantize(const QuantizeCliOpts& c) {
  if (c.method != "rtn" && c.method != "awq" && c.method != "gptq" && c.method != "awq+gptq")
    return fail("--method must be rtn, awq, gptq or awq+gptq, got '" + c.method + "'");
  const bool awq = c.method == "awq" || c.method == "awq+gptq";
  const bool gptq = c.method == "gptq" || c.method == "awq+gptq";
  if ((awq || gptq) && c.calib.empty())
    return fail("--method " + c.method + " needs --calib TEXTFILE");
  if (c.act_order && !gptq) return fail("--act-order is a GPTQ option (--method gptq)");
  if (c.sink_weight != 1.0 && !gptq) return fail("--sink-weight is a GPTQ option (--method gptq)");
  const bool fp8 = c.format == "fp8";
  if (fp8 && (c.method != "rtn" || c.asym || c.strict_groups || c.clip))
    return fail("--format fp8 takes 128x128 block scales (amax / 448): --method, --asym, --clip "
                "and --strict-groups are INT4 options");
  if (c.clip && !awq && !gptq)
    return fail("--clip weighs each column by calibration statistics (--method awq or gptq); "
                "unweighted, it measured worse than plain RTN");
  set_num_threads(c.threads);
  QuantizePipelineOptions p;
  if (awq || gptq) {
    // The calibration text's tokens; the scales and Hessians come from the
    // BF16 model on them (quant/awq_plan.h, quant/gptq_plan.h).
    // Each file is tokenized on its own (no token spans two files). Every
    // path is opened before the tokenizer loads, so a typo fails at once, and
    // files past the cap are not tokenized at all.
    std::vector<std::string> texts;
    for (const std::string& path : c.calib) {
      std::ifstream f(path, std::ios::binary);
      if (!f) return fail("cannot open " + path);
      std::stringstream ss;
      ss << f.rdbuf();
      texts.push_back(ss.str());
    }
    // GPTQ's Hessians keep gaining from more and more varied rows where AWQ's
    // scales do not (docs/BENCHMARKS.md, "More varied calibration text"):
    // 262,144 holds all three shipped files (about 183,000 SmolLM2 tokens).
    const int64_t want = c.calib_tokens > 0 ? c.calib_tokens : gptq ? 262144 : 4096;
    auto tok = load_tokenizer_for(c.in, nullptr);
    if (!tok) return fail(tok.error().message);
    std::vector<int32_t> ids;
    std::string source;
    for (size_t i = 0; i < texts.size() && int64_t(ids.size()) < want; ++i) {
      const auto part = (*tok)->encode(texts[i], false, false);
      ids.insert(ids.end(), part.begin(), part.end());
      source += (source.empty() ? "" : " + ") + c.calib[i];
      std::string().swap(texts[i]);
    }
    if (int64_t(ids.size()) > want) ids.resize(size_t(want));
    p.awq = awq;
    p.gptq = gptq;
    p.gptq_damp = c.damp;
    p.gptq_act_order = c.act_order;
    p.gptq_sink_weight = c.sink_weight;
    p.calib_tokens = std::move(ids);
    p.calib_source = source;
    p.calib_rows = c.calib_rows;
    p.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
  p.clip = c.clip;
  QuantizeOptions& o = p.checkpoint;
  o.format = fp8 ? QuantFormat::kFp8 : QuantFormat::kInt4;
  o.in = c.in;
  o.out = c.out;
  o.group_size = c.group_size;
  o.asymmetric = c.asym;
  o.keep = c.keep;
  o.quantize_lm_head = c.quantize_lm_head;
  o.strict_groups = c.strict_groups;
  o.progress = [](size_t i, size_t n, const std::string& name, bool q) {
    std::fprintf(stderr, "[%zu/%zu] %s %s\n", i, n, name.c_str(), q ? "quantize" : "keep");
  };
  o.warn = [](const std::string& m) { std::fprintf(stderr, "kvant quantize: warning: %s\n", m.c_str()); };
  auto r = quantize_model(p);
  if (!r) return fail(r.error().message);
  const auto& s = *r;
  if (c.json) {
    auto j = s.to_json();
    j["in"] = c.in;
    j["out"] = c.out;
    if (!fp8) {
      j["group_size"] = c.group_size;
      j["symmetric"] = !c.asym;
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (fp8)
    std::printf("wrote %s (%lld tensors quantized to FP8 e4m3, 128x128 block scales; %lld kept)\n",
                c.out.c_str(), (long long)s.quantized_tensors, (long long)s.kept_tensors);
  else
    std::printf("wrote %s (%lld tensors quantized to INT4, %s, group %d, %s; %lld kept)\n",
                c.out.c_str(), (long long)s.quantized_tensors, c.method.c_str(), c.group_size,
                c.asym ? "asymmetric" : "symmetric", (long long)s.kept_tensors);
  std::printf("input size:  %s\noutput size: %s\n", mb(s.input_bytes).c_str(), mb(s.output_bytes).c_str());
  std::printf("quantized linears: %s as BF16 -> %s as %s, %.2fx smaller\n",
              mb(s.quantized_bf16_bytes).c_str(), mb(s.quantized_int4_bytes).c_str(),
              fp8 ? "FP8 (codes + block scales)" : "INT4 (packed + scales + zeros)",
              s.quantized_int4_bytes ? double(s.quantized_bf16_bytes) / double(s.quantized_int4_bytes) : 0.0);
  if (s.quantized_tensors > 0)
    std::printf("relative RMS error of the quantized linears: mean %.4f, worst %.4f\n", s.mean_rel_rms,
                s.max_rel_rms);
  return 0;
}

}  // namespace

void register_quantize(CLI::App& app) {
  static QuantizeCliOpts o;
  auto* cmd = app.add_subcommand(
      "quantize",
      "Write a checkpoint with INT4 (W4A16, compressed-tensors pack-quantized) or FP8 (e4m3, "
      "128x128 blocks, compressed-tensors float-quantized) linears");
  cmd->add_option("--format", o.format, "int4 (default) or fp8")->check(CLI::IsMember({"int4", "fp8"}));
  cmd->add_option("--in", o.in, "GGUF file, .safetensors, or Hugging Face directory")->required();
  cmd->add_option("--out", o.out, "output directory (Hugging Face layout)")->required();
  cmd->add_option("--group-size", o.group_size, "weights per scale: 32, 64 or 128")
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_flag("--asym", o.asym, "asymmetric groups (a zero point per group)");
  cmd->add_option("--method", o.method,
                  "rtn (default), awq (activation-aware scales), gptq (error-compensating "
                  "rounding against calibration Hessians) or awq+gptq");
  cmd->add_option("--calib", o.calib, "calibration text file (awq, gptq); repeatable: the files' tokens in the order given");
  cmd->add_option("--damp", o.damp, "gptq: dampening, a share of the Hessian's mean diagonal")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--sink-weight", o.sink_weight,
                  "gptq: weight of each calibration chunk's first position (the attention sink) "
                  "in the Hessian (default 1)")
      ->check(CLI::Range(1.0, 1e6));
  cmd->add_flag("--act-order", o.act_order,
                "gptq: columns in order of decreasing activation energy (group scales from the "
                "original weights, so the checkpoint needs no group index)");
  cmd->add_flag("--clip", o.clip,
                "each group's range shrunk where that lowers its rounding error, weighted by "
                "the Hessian diagonal (gptq) or the input's mean square (awq)");
  cmd->add_option("--calib-tokens", o.calib_tokens, "calibration tokens taken from the start of the --calib files "
                  "in order (default: 4096 for awq, 262144 with gptq)")
      ->check(CLI::Range(64, 1 << 24));
  cmd->add_option("--calib-rows", o.calib_rows, "input rows per product in the scale search (awq)")
      ->check(CLI::Range(16, 1 << 16));
  cmd->add_flag("--strict-groups", o.strict_groups,
                "keep linears whose input size the group does not divide in BF16 (default: a "
                "short last group)");
  cmd->add_option("--keep", o.keep, "regex: matching tensors stay BF16 (repeatable)");
  cmd->add_flag("--quantize-lm-head", o.quantize_lm_head, "quantize lm_head too (unties tied embeddings)");
  cmd->add_option("--threads", o.threads, "threads (default: all cores)")->check(CLI::Range(1, 4096));
  cmd->add_flag("--json", o.json, "print one JSON object");
  cmd->callback([] { set_exit_code(run_quantize(o)); });
}

}  // namespace kvant::cli
