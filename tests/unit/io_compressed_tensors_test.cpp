// compressed-tensors pack-quantized INT4 tensors and the safetensors writer:
// layouts checked word by word, read/write round trips (symmetric,
// asymmetric with zero points packed along rows, row counts not a multiple
// of 8, padded columns), malformed files refused with the tensor named, and
// quantization_config parsing (kvant's own, Kimi K2's, unsupported schemes).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "io/compressed_tensors.h"
#include "numerics/int4_rtn.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "numerics/bf16.h"

namespace kvant {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("kvant_ct_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::unique_ptr<TensorSource> write_and_open(const std::string& dir, const std::vector<TensorData>& ts,
                                             uint64_t max_shard = kDefaultMaxShardBytes) {
  std::vector<TensorSpec> specs;
  for (auto& t : ts) specs.push_back(t.spec);
  auto w = SafetensorsWriter::create(dir, specs, max_shard);
  EXPECT_TRUE(w.ok()) << w.error().message;
  for (auto& t : ts) {
    auto r = w->write(t.spec.name, t.bytes);
    EXPECT_TRUE(r.ok()) << r.error().message;
  }
  auto f = w->finish();
  EXPECT_TRUE(f.ok()) << f.error().message;
  auto s = open_safetensors_source(dir);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return s.ok() ? std::move(*s) : nullptr;
}

Int4Weight random_weight(int64_t rows, int64_t cols, int64_t group, bool asym, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> qd(-8, 7);
  std::normal_distribution<float> sd(0.f, 0.01f);
  Int4Weight w;
  w.rows = rows;
  w.cols = cols;
  w.group = group;
  for (int64_t i = 0; i < rows * cols; ++i) w.q.push_back(int8_t(qd(rng)));
  for (int64_t i = 0; i < rows * cols / group; ++i) {
    w.scale.push_back(bf16_to_f32(f32_to_bf16(sd(rng))));
    if (asym) w.zero.push_back(int8_t(qd(rng)));
  }
  return w;
}

template <class T>
std::vector<uint8_t> raw(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(CompressedTensors, LayoutWordByWord) {
  Int4Weight w = random_weight(11, 20, 4, true, 1);
  auto ts = int4_weight_tensors("m.l", w);
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_EQ(ts[0].spec.name, "m.l.weight_packed");
  EXPECT_EQ(ts[0].spec.shape, (std::vector<int64_t>{11, 3}));
  EXPECT_EQ(ts[1].spec.dtype, DType::BF16);
  EXPECT_EQ(ts[1].spec.shape, (std::vector<int64_t>{11, 5}));
  EXPECT_EQ(ts[3].spec.shape, (std::vector<int64_t>{2, 5}));  // ceil(11 / 8) rows of words
  std::vector<uint32_t> p(ts[0].bytes.size() / 4), z(ts[3].bytes.size() / 4);
  std::memcpy(p.data(), ts[0].bytes.data(), ts[0].bytes.size());
  std::memcpy(z.data(), ts[3].bytes.data(), ts[3].bytes.size());
  for (int64_t r = 0; r < 11; ++r)
    for (int64_t c = 0; c < 20; ++c)
      EXPECT_EQ(int((p[size_t(r * 3 + c / 8)] >> (4 * (c % 8))) & 15) - 8, w.q[size_t(r * 20 + c)]);
  for (int64_t r = 0; r < 11; ++r)
    for (int64_t g = 0; g < 5; ++g)
      EXPECT_EQ(int((z[size_t((r / 8) * 5 + g)] >> (4 * (r % 8))) & 15) - 8, w.zero[size_t(r * 5 + g)]);
  // Padding: columns 20..23 of each row and rows 11..15 of the zero points are 0 nibbles.
  EXPECT_EQ(p[2] >> 16, 0u);
  EXPECT_EQ(z[5] >> 12, 0u);
  EXPECT_EQ(int4_weight_bytes(11, 20, 4, true), ts[0].bytes.size() + ts[1].bytes.size() + 8 + ts[3].bytes.size());
}

TEST(CompressedTensors, RoundTripSymmetricAndAsymmetric) {
  for (bool asym : {false, true})
    for (auto [rows, cols, group] : {std::tuple{13, 36, 12}, {8, 64, 32}, {1, 8, 8}, {17, 128, 128}}) {
      const Int4Weight w = random_weight(rows, cols, group, asym, uint32_t(rows * cols));
      auto src = write_and_open(temp_dir("rt"), int4_weight_tensors("model.layers.0.mlp.down_proj", w));
      ASSERT_TRUE(src);
      EXPECT_TRUE(has_int4_weight(*src, "model.layers.0.mlp.down_proj"));
      EXPECT_FALSE(has_int4_weight(*src, "model.layers.0.mlp.up_proj"));
      auto r = read_int4_weight(*src, "model.layers.0.mlp.down_proj");
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r->rows, rows);
      EXPECT_EQ(r->cols, cols);
      EXPECT_EQ(r->group, group);
      EXPECT_EQ(r->q, w.q);
      EXPECT_EQ(r->scale, w.scale);
      EXPECT_EQ(r->zero, w.zero);
    }
}

// A group size that does not divide the columns: ceil(cols / group) scales
// per row, the last group short (576 = 4 x 128 + 64), as compressed-tensors
// writes it; the reader recovers the group size from the scale count.
TEST(CompressedTensors, ShortLastGroupRoundTrips) {
  for (bool asym : {false, true}) {
    std::vector<float> m(size_t(5 * 576));
    for (size_t i = 0; i < m.size(); ++i) m[i] = float(int(i * 37 % 101) - 50) * 0.01f;
    const Int4Weight w = rtn_quantize(m.data(), 5, 576, 128, asym);
    ASSERT_EQ(w.scale.size(), size_t(5 * 5));
    auto src = write_and_open(temp_dir("short"), int4_weight_tensors("x", w));
    ASSERT_TRUE(src);
    auto r = read_int4_weight(*src, "x");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->group, 128);
    EXPECT_EQ(r->q, w.q);
    EXPECT_EQ(r->scale, w.scale);
    EXPECT_EQ(r->zero, w.zero);
    std::vector<float> back(m.size());
    dequantize(*r, back.data());
    for (size_t i = 0; i < m.size(); ++i) ASSERT_NEAR(back[i], m[i], 0.08) << i;
  }
}

// Replaces one tensor of a valid weight's files and expects `needle` in the error.
void expect_refused(const std::function<void(std::vector<TensorData>&)>& edit, const std::string& needle) {
  std::vector<TensorData> ts = int4_weight_tensors("x", random_weight(9, 24, 8, true, 7));
  edit(ts);
  auto src = write_and_open(temp_dir("bad"), ts);
  ASSERT_TRUE(src);
  auto r = read_int4_weight(*src, "x");
  ASSERT_FALSE(r.ok()) << "accepted a file with: " << needle;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
}

TEST(CompressedTensors, MalformedFilesAreClearErrors) {
  expect_refused([](auto& ts) { ts.erase(ts.begin() + 1); }, "missing tensor x.weight_scale");
  expect_refused([](auto& ts) { ts.erase(ts.begin() + 2); }, "missing tensor x.weight_shape");
  expect_refused([](auto& ts) { ts[0].spec.dtype = DType::F32; }, "x.weight_packed has dtype F32");
  expect_refused([](auto& ts) { ts[1].spec.dtype = DType::I16; }, "x.weight_scale has dtype I16");
  expect_refused([](auto& ts) { ts[0].spec.shape = {3, 9}; ts[0].bytes.resize(108); }, "x.weight_packed has shape [3, 9]");
  expect_refused([](auto& ts) { ts[1].spec.shape = {9, 5}; ts[1].bytes.resize(90); }, "fits no group size for 24 columns");
  expect_refused([](auto& ts) { ts[1].spec.shape = {8, 3}; ts[1].bytes.resize(48); }, "x.weight_scale has shape [8, 3]");
  expect_refused([](auto& ts) { ts[3].spec.shape = {1, 3}; ts[3].bytes.resize(12); }, "x.weight_zero_point has shape [1, 3]");
  expect_refused([](auto& ts) { ts[2].bytes = raw(std::vector<int32_t>{9, 25}); }, "x.weight_packed has shape [9, 3]");
  expect_refused([](auto& ts) { ts[2].bytes = raw(std::vector<int32_t>{9, -1}); }, "not a valid matrix shape");
  expect_refused([](auto& ts) { ts[2].spec.shape = {3}; ts[2].bytes.resize(12); }, "x.weight_shape has shape [3]");
  // Rows 9..15 of the zero-point words are padding and must be 0 nibbles.
  expect_refused([](auto& ts) { ts[3].bytes[3 * 4 + 2] |= 0x10; }, "non-zero padding");
  // A column count that leaves padding in the packed words.
  std::vector<TensorData> ts = int4_weight_tensors("y", random_weight(2, 12, 4, false, 3));
  ts[0].bytes[7] |= 0x80;  // row 0, word 1, nibble 7 (column 15 > 11)
  auto src = write_and_open(temp_dir("pad"), ts);
  auto r = read_int4_weight(*src, "y");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("y.weight_packed row 0 has non-zero padding"), std::string::npos) << r.error().message;
}

TEST(CompressedTensors, AcceptsI64ShapeAndF32OrF16Scales) {
  const Int4Weight w = random_weight(5, 16, 8, false, 11);
  std::vector<TensorData> ts = int4_weight_tensors("z", w);
  ts[2].spec.dtype = DType::I64;
  ts[2].bytes = raw(std::vector<int64_t>{5, 16});
  ts[1].spec.dtype = DType::F32;
  ts[1].bytes = raw(w.scale);
  auto src = write_and_open(temp_dir("i64"), ts);
  auto r = read_int4_weight(*src, "z");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->scale, w.scale);
  EXPECT_EQ(r->q, w.q);
}

TEST(SafetensorsWriter, ShardsIndexAlignmentAndReadBack) {
  const std::string dir = temp_dir("shards");
  std::vector<TensorData> ts;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> v(size_t(100 + i));
    for (size_t k = 0; k < v.size(); ++k) v[k] = float(i * 1000 + int(k));
    ts.push_back({{"t" + std::to_string(i), DType::F32, {int64_t(v.size())}}, raw(v)});
  }
  auto src = write_and_open(dir, ts, 900);  // two tensors per shard at most
  ASSERT_TRUE(src);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "model-00003-of-00003.safetensors"));
  for (auto& t : ts) {
    const TensorRef* r = src->find(t.spec.name);
    ASSERT_TRUE(r) << t.spec.name;
    EXPECT_EQ(r->shape, t.spec.shape);
    std::vector<float> out(size_t(r->numel()));
    ASSERT_TRUE(src->read_f32(*r, out).ok());
    EXPECT_EQ(std::memcmp(out.data(), t.bytes.data(), t.bytes.size()), 0);
  }
  for (int k = 1; k <= 3; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-00003.safetensors", k);
    auto f = SafetensorsFile::open((fs::path(dir) / name).string());
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_EQ(f->data_offset() % 8, 0u);
    EXPECT_EQ(f->metadata().at("format"), "pt");
  }
  // One shard when everything fits.
  const std::string one = temp_dir("one");
  ASSERT_TRUE(write_and_open(one, ts));
  EXPECT_TRUE(fs::exists(fs::path(one) / "model.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(one) / "model.safetensors.index.json"));
}

TEST(SafetensorsWriter, RefusesOutOfOrderWrongSizeAndMissing) {
  auto w = SafetensorsWriter::create(temp_dir("order"), {{"a", DType::F32, {2}}, {"b", DType::BF16, {3}}});
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> eight(8), six(6);
  EXPECT_FALSE(w->write("b", six).ok());
  EXPECT_FALSE(w->write("a", six).ok());
  EXPECT_TRUE(w->write("a", eight).ok());
  auto f = w->finish();
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("b was declared but not written"), std::string::npos);
  EXPECT_FALSE(SafetensorsWriter::create(temp_dir("dup"), {{"a", DType::F32, {2}}, {"a", DType::F32, {2}}}).ok());
  EXPECT_FALSE(SafetensorsWriter::create(temp_dir("q4"), {{"a", DType::Q4_0, {32}}}).ok());
}

TEST(QuantizationConfig, OwnObjectRoundTrips) {
  Int4Scheme s;
  s.group_size = 64;
  s.symmetric = false;
  s.ignore = {"lm_head", "re:.*mlp.gate$"};
  nlohmann::json cfg = {{"quantization_config", quantization_config_json(s)}};
  auto r = parse_quantization_config(cfg);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->group_size, 64);
  EXPECT_FALSE((*r)->symmetric);
  EXPECT_EQ((*r)->ignore, s.ignore);
  const auto& q = cfg["quantization_config"];
  EXPECT_EQ(q["format"], "pack-quantized");
  EXPECT_EQ(q["config_groups"]["group_0"]["weights"]["strategy"], "group");
  EXPECT_TRUE(q["kv_cache_scheme"].is_null());
  auto none = parse_quantization_config(nlohmann::json{{"hidden_size", 8}});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(QuantizationConfig, KimiK2StyleIsAccepted) {
  auto cfg = nlohmann::json::parse(R"({"quantization_config": {
    "config_groups": {"group_0": {"input_activations": null, "output_activations": null,
      "targets": ["Linear"], "weights": {"actorder": null, "block_structure": null,
      "dynamic": false, "group_size": 32, "num_bits": 4, "observer": "minmax",
      "observer_kwargs": {}, "strategy": "group", "symmetric": true, "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null, "quant_method": "compressed-tensors", "quantization_status": "compressed"}})");
  auto r = parse_quantization_config(cfg);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->group_size, 32);
  EXPECT_TRUE((*r)->symmetric);
  ASSERT_EQ((*r)->ignore.size(), 4u);
  EXPECT_EQ((*r)->ignore[3], "re:.*mlp\\.(gate|up|gate_up|down)_proj.*");
}

TEST(QuantizationConfig, UnsupportedSchemesSayWhatTheyAre) {
  auto base = [] {
    Int4Scheme s;
    return nlohmann::json{{"quantization_config", quantization_config_json(s)}};
  };
  auto expect_err = [](const nlohmann::json& cfg, const std::string& needle) {
    auto r = parse_quantization_config(cfg);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  expect_err({{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}}, "\"fp8\"");
  auto c = base();
  c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  expect_err(c, "8-bit int");
  c = base();
  c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  expect_err(c, "input_activations are quantized");
  c = base();
  c["quantization_config"]["format"] = "float-quantized";
  expect_err(c, "\"float-quantized\"");
  c = base();
  c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "channel";
  expect_err(c, "\"channel\"");
  c = base();
  c["quantization_config"]["quantization_status"] = "frozen";
  expect_err(c, "\"frozen\"");
}

}  // namespace
}  // namespace kvant
