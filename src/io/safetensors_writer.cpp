// Shard planning is greedy in declaration order: a tensor starts a new shard
// when the current one holds something and would grow past the limit (a
// tensor larger than the limit gets a shard of its own). Files are written
// under a temporary name and renamed when complete, so a failed run never
// leaves a file that looks finished.
#include "io/safetensors_writer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace kvant {
namespace {

std::string shard_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::F64: case DType::I8:
    case DType::I16: case DType::I32: case DType::I64: case DType::U8: case DType::F8_E4M3:
    case DType::F8_E5M2:
      return dtype_name(t);
    default:
      return nullptr;
  }
}

uint64_t TensorSpec::nbytes() const {
  uint64_t n = 1;
  for (auto d : shape) n *= uint64_t(d);
  return n * dtype_info(dtype).block_bytes;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept { *this = std::move(o); }
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& o) noexcept {
  if (this != &o) {
    if (f_) std::fclose(f_);
    dir_ = std::move(o.dir_);
    specs_ = std::move(o.specs_);
    shard_of_ = std::move(o.shard_of_);
    files_ = std::move(o.files_);
    headers_ = std::move(o.headers_);
    shard_data_bytes_ = std::move(o.shard_data_bytes_);
    next_ = o.next_;
    open_ = o.open_;
    f_ = o.f_;
    finished_ = o.finished_;
    o.f_ = nullptr;
  }
  return *this;
}
SafetensorsWriter::~SafetensorsWriter() {
  if (f_) std::fclose(f_);
}

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& dir,
                                                    std::vector<TensorSpec> specs,
                                                    uint64_t max_shard_bytes) {
  SafetensorsWriter w;
  w.dir_ = dir;
  std::set<std::string> seen;
  uint64_t cur = 0;
  size_t shard = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    if (!seen.insert(s.name).second) return make_error("safetensors writer: duplicate tensor " + s.name);
    if (!safetensors_dtype_name(s.dtype))
      return make_error("safetensors writer: tensor " + s.name + " has dtype " +
                        dtype_name(s.dtype) + ", which safetensors cannot store");
    for (auto d : s.shape)
      if (d < 0) return make_error("safetensors writer: tensor " + s.name + " has a negative dimension");
    const uint64_t nb = s.nbytes();
    if (cur > 0 && cur + nb > max_shard_bytes) {
      ++shard;
      cur = 0;
    }
    w.shard_of_.push_back(shard);
    cur += nb;
  }
  const size_t nshards = specs.empty() ? 1 : shard + 1;
  w.shard_data_bytes_.assign(nshards, 0);
  std::vector<nlohmann::ordered_json> headers(nshards);
  for (auto& h : headers) h["__metadata__"] = {{"format", "pt"}};
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    uint64_t& off = w.shard_data_bytes_[w.shard_of_[i]];
    headers[w.shard_of_[i]][s.name] = {{"dtype", safetensors_dtype_name(s.dtype)},
                                       {"shape", s.shape},
                                       {"data_offsets", {off, off + s.nbytes()}}};
    off += s.nbytes();
  }
  for (size_t k = 0; k < nshards; ++k) {
    w.files_.push_back(shard_name(k, nshards));
    std::string json = headers[k].dump();
    json.append((8 - json.size() % 8) % 8, ' ');
    std::string h(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(h.data(), &n, 8);  // little-endian host (dtype.h)
    w.headers_.push_back(h + json);
  }
  w.specs_ = std::move(specs);
  return w;
}

Result<void> SafetensorsWriter::open_shard(size_t s) {
  KV_TRY(close_shard());
  const std::string tmp = (std::filesystem::path(dir_) / (files_[s] + ".part")).string();
  f_ = std::fopen(tmp.c_str(), "wb");
  if (!f_) return make_error(tmp + ": cannot create: " + std::strerror(errno));
  open_ = s;
  if (std::fwrite(headers_[s].data(), 1, headers_[s].size(), f_) != headers_[s].size())
    return make_error(tmp + ": write failed: " + std::strerror(errno));
  return {};
}

Result<void> SafetensorsWriter::close_shard() {
  if (!f_) return {};
  const auto final_path = std::filesystem::path(dir_) / files_[open_];
  const std::string tmp = final_path.string() + ".part";
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) return make_error(tmp + ": close failed: " + std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) return make_error(tmp + ": cannot rename: " + ec.message());
  return {};
}

Result<void> SafetensorsWriter::write(const std::string& name, std::span<const uint8_t> bytes) {
  if (finished_ || next_ >= specs_.size())
    return make_error("safetensors writer: tensor " + name + " was not declared (or written twice)");
  const auto& s = specs_[next_];
  if (s.name != name)
    return make_error("safetensors writer: got tensor " + name + ", expected " + s.name +
                      " (tensors are written in declaration order)");
  if (bytes.size() != s.nbytes())
    return make_error("safetensors writer: tensor " + name + " has " + std::to_string(bytes.size()) +
                      " bytes, its dtype and shape need " + std::to_string(s.nbytes()));
  if (open_ != shard_of_[next_]) KV_TRY(open_shard(shard_of_[next_]));
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size())
    return make_error(dir_ + "/" + files_[open_] + ": write failed: " + std::strerror(errno));
  ++next_;
  return {};
}

Result<void> SafetensorsWriter::finish() {
  if (finished_) return {};
  if (next_ != specs_.size())
    return make_error("safetensors writer: tensor " + specs_[next_].name + " was declared but not written");
  KV_TRY(close_shard());
  // A shard no write opened (only an empty checkpoint has one) still gets its file.
  if (open_ == SIZE_MAX) {
    KV_TRY(open_shard(0));
    KV_TRY(close_shard());
  }
  finished_ = true;
  if (files_.size() > 1) {
    nlohmann::ordered_json idx;
    uint64_t total = 0;
    for (auto b : shard_data_bytes_) total += b;
    idx["metadata"] = {{"total_size", total}};
    nlohmann::ordered_json wm = nlohmann::ordered_json::object();
    for (size_t i = 0; i < specs_.size(); ++i) wm[specs_[i].name] = files_[shard_of_[i]];
    idx["weight_map"] = wm;
    const auto path = std::filesystem::path(dir_) / "model.safetensors.index.json";
    std::ofstream f(path);
    f << idx.dump(2) << "\n";
    if (!f) return make_error(path.string() + ": write failed");
  }
  return {};
}

uint64_t SafetensorsWriter::total_bytes() const {
  uint64_t n = 0;
  for (size_t s = 0; s < files_.size(); ++s) n += headers_[s].size() + shard_data_bytes_[s];
  return n;
}

}  // namespace kvant
