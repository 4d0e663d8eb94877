// The shared tensor-name table (model/archs/tensor_names.h): every dense
// role round-trips through its GGUF name, the family-dependent Hugging Face
// names, and names the table does not know.
#include <gtest/gtest.h>

#include "model/archs/tensor_names.h"

namespace kvant::archs {
namespace {

TEST(TensorNames, RolesRoundTripAndFamiliesDiffer) {
  for (const char* role : {"attn_norm", "wq", "wk", "wv", "bq", "bk", "bv", "q_norm", "k_norm",
                           "wo", "post_attn_norm", "ffn_norm", "w_gate", "w_up", "w_down",
                           "post_ffn_norm"}) {
    const std::string g = layer_tensor(Naming::Gguf, Arch::Llama, 7, role);
    ASSERT_FALSE(g.empty()) << role;
    auto r = tensor_role(Naming::Gguf, g);
    ASSERT_TRUE(r.has_value()) << g;
    EXPECT_EQ(r->role, role);
    EXPECT_EQ(r->layer, 7);
  }
  EXPECT_EQ(layer_tensor(Naming::Hf, Arch::Llama, 3, "ffn_norm"),
            "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(layer_tensor(Naming::Hf, Arch::Gemma3, 3, "ffn_norm"),
            "model.layers.3.pre_feedforward_layernorm.weight");
  EXPECT_EQ(layer_tensor(Naming::Hf, Arch::Gemma3, 3, "post_attn_norm"),
            "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(layer_tensor(Naming::Hf, Arch::Llama, 3, "post_attn_norm"), "");
  EXPECT_EQ(layer_tensor(Naming::Hf, Arch::Qwen2, 0, "bq"), "model.layers.0.self_attn.q_proj.bias");
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

}  // namespace
}  // namespace kvant::archs
