// GGUF tensors are stored row-major with whole quant blocks per row (the
// parser rejects a row length that is not a multiple of the block), so a row
// range is a contiguous, block-aligned byte range and decodes independently.
#include "io/gguf_source.h"

#include "io/dequant.h"

namespace kvant {
namespace {

class GgufSource final : public TensorSource {
 public:
  explicit GgufSource(GgufFile f) : file_(std::move(f)) {
    refs_.reserve(file_.tensors().size());
    for (const auto& t : file_.tensors())
      refs_.push_back(TensorRef{t.name, t.shape, t.dtype, file_.tensor_bytes(t)});
  }
  const std::string& path() const override { return file_.path(); }
  const std::vector<TensorRef>& tensors() const override { return refs_; }
  const GgufFile* gguf() const override { return &file_; }
  const TensorRef* find(const std::string& name) const override {
    const GgufTensor* t = file_.find_tensor(name);
    return t ? &refs_[size_t(t - file_.tensors().data())] : nullptr;
  }
  Result<void> read_f32_rows(const TensorRef& t, int64_t begin, int64_t end,
                             std::span<float> out) const override {
    const std::string what = file_.path() + ": tensor " + t.name;
    const int64_t rows = num_rows(t), len = row_length(t);
    if (begin < 0 || end < begin || end > rows)
      return make_error(what + ": row range [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") outside its " + std::to_string(rows) + " rows");
    if (out.size() != uint64_t((end - begin) * len))
      return make_error(what + ": output holds " + std::to_string(out.size()) + " values, " +
                        std::to_string((end - begin) * len) + " needed");
    return dequantize_range(t.dtype, t.data, begin * len, end * len, out, what);
  }

 private:
  GgufFile file_;
  std::vector<TensorRef> refs_;
};

}  // namespace

std::unique_ptr<TensorSource> make_gguf_source(GgufFile file) {
  return std::make_unique<GgufSource>(std::move(file));
}

Result<std::unique_ptr<TensorSource>> open_gguf_source(const std::string& path) {
  auto f = GgufFile::open(path);
  if (!f) return f.error();
  return make_gguf_source(std::move(*f));
}

}  // namespace kvant
