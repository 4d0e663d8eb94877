// The shared tensor-name table (model/archs/tensor_names.h): every dense
// role round-trips through its GGUF name, the family-dependent Hugging Face
// names, and names the table does not know. The family registry
// (model/archs/registry.h): lookups by file name, the supported lists, and
// each spec consistent with itself.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "model/archs/registry.h"
#include "model/archs/tensor_names.h"
#include "model/config.h"
#include "model/hf_export.h"

namespace kvant::archs {
namespace {

const ArchSpec& gguf_arch(const char* name) {
  const ArchSpec* a = arch_from_gguf(name);
  EXPECT_NE(a, nullptr) << name;
  return a ? *a : kLlama;
}

TEST(TensorNames, RolesRoundTripAndFamiliesDiffer) {
  const ArchSpec &llama = gguf_arch("llama"), &gemma = gguf_arch("gemma3"),
                 &qwen2 = gguf_arch("qwen2");
  for (const char* role : {"attn_norm", "wq", "wk", "wv", "bq", "bk", "bv", "q_norm", "k_norm",
                           "wo", "post_attn_norm", "ffn_norm", "w_gate", "w_up", "w_down",
                           "post_ffn_norm"}) {
    const std::string g = layer_tensor(Naming::Gguf, llama, 7, role);
    ASSERT_FALSE(g.empty()) << role;
    auto r = tensor_role(Naming::Gguf, g);
    ASSERT_TRUE(r.has_value()) << g;
    EXPECT_EQ(r->role, role);
    EXPECT_EQ(r->layer, 7);
  }
  EXPECT_EQ(layer_tensor(Naming::Hf, llama, 3, "ffn_norm"),
            "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(layer_tensor(Naming::Hf, gemma, 3, "ffn_norm"),
            "model.layers.3.pre_feedforward_layernorm.weight");
  EXPECT_EQ(layer_tensor(Naming::Hf, gemma, 3, "post_attn_norm"),
            "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(layer_tensor(Naming::Hf, llama, 3, "post_attn_norm"), "");
  EXPECT_EQ(layer_tensor(Naming::Hf, qwen2, 0, "bq"), "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(global_tensor(Naming::Gguf, "embed"), "token_embd.weight");
  EXPECT_EQ(global_tensor(Naming::Hf, "output"), "lm_head.weight");
  EXPECT_EQ(global_tensor(Naming::Hf, "rope_freqs"), "");
  EXPECT_TRUE(role_is_norm("out_norm"));
  EXPECT_TRUE(role_is_norm("q_norm"));
  EXPECT_FALSE(role_is_norm("wq"));
  auto e = tensor_role(Naming::Gguf, "output_norm.weight");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->role, "out_norm");
  EXPECT_EQ(e->layer, -1);
  for (const char* bad : {"blk.x.attn_q.weight", "blk..attn_q.weight", "blk.3.attn_qq.weight",
                          "token_embd", "model.layers.2.mlp.experts.0.down_proj.weight"})
    EXPECT_FALSE(tensor_role(Naming::Gguf, bad).has_value()) << bad;
  auto h = tensor_role(Naming::Hf, "model.layers.12.mlp.down_proj.weight");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->role, "w_down");
  EXPECT_EQ(h->layer, 12);
}

TEST(ArchRegistry, LooksUpFamiliesByTheirFileNames) {
  EXPECT_EQ(arch_from_gguf("llama"), &kLlama);
  EXPECT_EQ(arch_from_hf("LlamaForCausalLM"), &kLlama);
  EXPECT_EQ(arch_from_hf("MistralForCausalLM"), &kLlama);
  EXPECT_EQ(arch_from_gguf("qwen3"), arch_from_hf("Qwen3ForCausalLM"));
  EXPECT_EQ(arch_from_gguf("gemma3"), arch_from_hf("Gemma3ForCausalLM"));
  EXPECT_STREQ(arch_from_hf("GlmMoeDsaForCausalLM")->name, "glm_moe_dsa");
  EXPECT_EQ(arch_from_gguf("deepseek2"), nullptr);
  EXPECT_EQ(arch_from_gguf(""), nullptr);
  EXPECT_EQ(arch_from_hf("GPT2LMHeadModel"), nullptr);
  EXPECT_EQ(arch_from_hf("llama"), nullptr);  // a model_type is not a class name
  EXPECT_EQ(gguf_arch_list(), "llama, qwen2, qwen3, gemma3");
  EXPECT_NE(hf_arch_list().find("DeepseekV3ForCausalLM"), std::string::npos);
  EXPECT_EQ(ModelConfig{}.arch, &kLlama);
}

TEST(ArchRegistry, EverySpecIsConsistent) {
  std::set<std::string> names, gguf, hf;
  for (const ArchSpec* a : all_archs()) {
    ASSERT_NE(a, nullptr);
    EXPECT_TRUE(names.insert(a->name).second) << a->name;
    for (const char* n : a->gguf_names) {
      if (!n) continue;
      EXPECT_TRUE(gguf.insert(n).second) << n;
      EXPECT_EQ(arch_from_gguf(n), a) << n;
    }
    for (const char* n : a->hf_classes) {
      if (!n) continue;
      EXPECT_TRUE(hf.insert(n).second) << n;
    }
    EXPECT_NE(a->hf_classes[0], nullptr) << a->name;
    // The exporter writes a class its own family reads back.
    EXPECT_EQ(arch_from_hf(a->hf_class), a) << a->name;
    EXPECT_STRNE(a->hf_model_type, "") << a->name;
    // Every family names its pre-MLP norm in Hugging Face checkpoints.
    EXPECT_NE(layer_tensor(Naming::Hf, *a, 0, "ffn_norm"), "") << a->name;
  }
}

TEST(ArchRegistry, UnsupportedArchitecturesListTheSupportedOnes) {
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}}};
  auto r = config_from_hf(j, "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("unsupported architecture 'GPT2LMHeadModel' (kvant runs "
                                   "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"),
            std::string::npos)
      << r.error().message;
}

TEST(ArchRegistry, ExportedConfigReadsBackAsTheSameFamily) {
  for (const ArchSpec* a : all_archs()) {
    if (!a->gguf_names[0]) continue;  // the exporter writes GGUF models out
    ModelConfig c;
    c.arch = a;
    c.vocab = 64, c.hidden = 32, c.layers = 6, c.heads = 4, c.kv_heads = 2, c.head_dim = 8;
    c.ffn = 48, c.max_positions = 128, c.attn_scale = 1.f / std::sqrt(8.f);
    c.sliding.assign(6, 0);
    auto back = config_from_hf(hf_config_json(c), a->name);
    ASSERT_TRUE(back.ok()) << a->name << ": " << back.error().message;
    EXPECT_EQ(back->arch, a);
    EXPECT_EQ(back->qkv_bias, a->qkv_bias) << a->name;
    EXPECT_EQ(back->qk_norm, a->qk_norm) << a->name;
    EXPECT_EQ(back->post_norms, a->post_norms) << a->name;
  }
}

}  // namespace
}  // namespace kvant::archs
