// Every struct is taken apart with a structured binding that names each of
// its fields, on the encoding side and the decoding side alike: a field
// added to StepInputs, Request, SamplingParams or StopParams stops this file
// compiling until the field is given a place in the format (and the version,
// and the layout in request_codec.h, are bumped).
#include "engine/request_codec.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <string>

#include "core/check.h"

namespace kvant {

namespace {

constexpr size_t kHeaderBytes = sizeof(kStepInputsMagic) + 1;

class Writer {
 public:
  std::vector<std::byte>& out() { return out_; }

  void uint(uint64_t v, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) out_.push_back(std::byte((v >> (8 * i)) & 0xFF));
  }
  void u8(uint8_t v) { uint(v, 1); }
  void boolean(bool v) { uint(v ? 1 : 0, 1); }
  void u64(uint64_t v) { uint(v, 8); }
  void i32(int32_t v) { uint(uint32_t(v), 4); }
  void i64(int64_t v) { uint(uint64_t(v), 8); }
  void f32(float v) { uint(std::bit_cast<uint32_t>(v), 4); }
  void count(size_t n) {
    KV_CHECK_LE(n, size_t(std::numeric_limits<uint32_t>::max()));
    uint(n, 4);
  }
  void str(const std::string& s) {
    count(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  void ids(const std::vector<int32_t>& v) {
    count(v.size());
    for (int32_t x : v) i32(x);
  }

 private:
  std::vector<std::byte> out_;
};

// Reads with a sticky error: the first failure is kept, and every read
// after it returns zero, so a decoder can read on and check once.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  size_t left() const { return in_.size() - pos_; }
  size_t pos() const { return pos_; }
  void skip(size_t n) { pos_ += std::min(n, left()); }
  // The submitted request that reads belong to, for error messages; -1 none.
  void set_request(int64_t i) { request_ = i; }

  void fail(size_t at, const char* what, const std::string& why) {
    if (failed()) return;
    error_ = "step inputs: ";
    if (request_ >= 0) error_ += "submitted[" + std::to_string(request_) + "] ";
    error_ += std::string(what) + " at byte " + std::to_string(at) + ": " + why;
  }

  uint64_t uint(size_t bytes, const char* what) {
    if (failed()) return 0;
    if (left() < bytes) {
      fail(pos_, what,
           "truncated (needs " + std::to_string(bytes) + " bytes, " + std::to_string(left()) +
               " left)");
      return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) v |= uint64_t(in_[pos_ + i]) << (8 * i);
    pos_ += bytes;
    return v;
  }
  bool boolean(const char* what) {
    const size_t at = pos_;
    const uint64_t v = uint(1, what);
    if (v > 1) fail(at, what, "bool is " + std::to_string(v) + ", not 0 or 1");
    return v == 1;
  }
  uint64_t u64(const char* what) { return uint(8, what); }
  int32_t i32(const char* what) { return int32_t(uint32_t(uint(4, what))); }
  int64_t i64(const char* what) { return int64_t(uint(8, what)); }
  float f32(const char* what) { return std::bit_cast<float>(uint32_t(uint(4, what))); }

  // A u32 count of elements that take at least `min_bytes` each: one that
  // the bytes left cannot hold is an error, so that nothing is sized from
  // a corrupt count.
  size_t count(const char* what, size_t min_bytes) {
    const size_t at = pos_;
    const uint64_t n = uint(4, what);
    if (n > left() / min_bytes) {
      fail(at, what,
           "count " + std::to_string(n) + " needs at least " + std::to_string(min_bytes) +
               " bytes each, " + std::to_string(left()) + " left");
      return 0;
    }
    return size_t(n);
  }
  std::string str(const char* what) {
    const size_t n = count(what, 1);
    if (failed()) return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void ids(std::vector<int32_t>& v, const char* what) {
    v.resize(count(what, sizeof(int32_t)));
    for (int32_t& x : v) x = i32(what);
  }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  int64_t request_ = -1;
  std::string error_;
};

void put_sampling(Writer& w, const SamplingParams& p) {
  const auto& [temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
               frequency_penalty, seed, top_logprobs, logit_bias] = p;
  w.f32(temperature);
  w.i32(top_k);
  w.f32(top_p);
  w.f32(min_p);
  w.f32(repetition_penalty);
  w.f32(presence_penalty);
  w.f32(frequency_penalty);
  w.u64(seed);
  w.i32(top_logprobs);
  w.count(logit_bias.size());
  for (const auto& [t, b] : logit_bias) {
    w.uint(uint32_t(t), 4);
    w.uint(std::bit_cast<uint32_t>(b), 4);
  }
}

void get_sampling(Reader& r, SamplingParams& p) {
  auto& [temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
         frequency_penalty, seed, top_logprobs, logit_bias] = p;
  temperature = r.f32("sampling.temperature");
  top_k = r.i32("sampling.top_k");
  top_p = r.f32("sampling.top_p");
  min_p = r.f32("sampling.min_p");
  repetition_penalty = r.f32("sampling.repetition_penalty");
  presence_penalty = r.f32("sampling.presence_penalty");
  frequency_penalty = r.f32("sampling.frequency_penalty");
  seed = r.u64("sampling.seed");
  top_logprobs = r.i32("sampling.top_logprobs");
  logit_bias.resize(r.count("sampling.logit_bias", 8));
  for (auto& [t, b] : logit_bias) {
    t = r.i32("sampling.logit_bias token");
    b = r.f32("sampling.logit_bias value");
  }
}

void put_stop(Writer& w, const StopParams& p) {
  const auto& [stop, stop_token_ids, ignore_eos, max_tokens, skip_special_tokens] = p;
  w.count(stop.size());
  for (const std::string& s : stop) w.str(s);
  w.ids(stop_token_ids);
  w.boolean(ignore_eos);
  w.i32(max_tokens);
  w.boolean(skip_special_tokens);
}

void get_stop(Reader& r, StopParams& p) {
  auto& [stop, stop_token_ids, ignore_eos, max_tokens, skip_special_tokens] = p;
  stop.resize(r.count("stop", 4));  // each string takes at least its length
  for (std::string& s : stop) s = r.str("stop string");
  r.ids(stop_token_ids, "stop.stop_token_ids");
  ignore_eos = r.boolean("stop.ignore_eos");
  max_tokens = r.i32("stop.max_tokens");
  skip_special_tokens = r.boolean("stop.skip_special_tokens");
}

void put_request(Writer& w, const Request& q) {
  const auto& [prompt, sampling, stop, logprobs, prompt_logprobs, prompt_logprobs_from,
               prompt_only, handoff, constraint, speculative, on_event] = q;
  (void)on_event;  // stays with the rank that took the request
  // Not carried: Engine::submit refuses constrained requests when
  // distributed, so every request that travels has none.
  (void)constraint;
  w.ids(prompt);
  put_sampling(w, sampling);
  put_stop(w, stop);
  w.boolean(logprobs);
  w.i32(prompt_logprobs);
  w.i64(prompt_logprobs_from);
  w.boolean(prompt_only);
  w.boolean(handoff);
  w.i32(speculative.num_tokens);
  w.i32(speculative.min_ngram);
  w.i32(speculative.max_ngram);
  w.i32(int32_t(speculative.method));
}

void get_request(Reader& r, Request& q) {
  auto& [prompt, sampling, stop, logprobs, prompt_logprobs, prompt_logprobs_from, prompt_only,
         handoff, constraint, speculative, on_event] = q;
  on_event = nullptr;
  constraint = nullptr;
  r.ids(prompt, "prompt");
  get_sampling(r, sampling);
  get_stop(r, stop);
  logprobs = r.boolean("logprobs");
  prompt_logprobs = r.i32("prompt_logprobs");
  prompt_logprobs_from = r.i64("prompt_logprobs_from");
  prompt_only = r.boolean("prompt_only");
  handoff = r.boolean("handoff");
  speculative.num_tokens = r.i32("speculative.num_tokens");
  speculative.min_ngram = r.i32("speculative.min_ngram");
  speculative.max_ngram = r.i32("speculative.max_ngram");
  speculative.method = SpecMethod(r.i32("speculative.method"));
}

// The fewest bytes a submitted entry takes: its id and a request with every
// container empty.
size_t min_entry_bytes() {
  static const size_t n = [] {
    Writer w;
    put_request(w, Request{});
    return sizeof(RequestId) + w.out().size();
  }();
  return n;
}

}  // namespace

std::vector<std::byte> encode_step_inputs(const StepInputs& inputs) {
  const auto& [seq, submitted, cancelled, shutdown] = inputs;
  Writer w;
  size_t guess = kHeaderBytes + 24 + cancelled.size() * sizeof(RequestId);
  for (const auto& [id, q] : submitted) guess += min_entry_bytes() + q.prompt.size() * 4 + 64;
  w.out().reserve(guess);
  for (char c : kStepInputsMagic) w.u8(uint8_t(c));
  w.u8(kStepInputsVersion);
  w.u64(seq);
  w.count(submitted.size());
  for (const auto& [id, q] : submitted) {
    w.u64(id);
    put_request(w, q);
  }
  w.count(cancelled.size());
  for (RequestId id : cancelled) w.u64(id);
  w.boolean(shutdown);
  return std::move(w.out());
}

Result<StepInputs> decode_step_inputs(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderBytes)
    return make_error("step inputs: " + std::to_string(bytes.size()) +
                      " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                      "-byte header");
  for (size_t i = 0; i < sizeof(kStepInputsMagic); ++i)
    if (bytes[i] != std::byte(kStepInputsMagic[i]))
      return make_error("step inputs: bad magic at byte " + std::to_string(i) +
                        " (not a step-inputs message)");
  const auto version = uint8_t(bytes[sizeof(kStepInputsMagic)]);
  if (version != kStepInputsVersion)
    return make_error("step inputs: version " + std::to_string(version) +
                      ", this build reads version " + std::to_string(kStepInputsVersion));

  Reader r(bytes);
  r.skip(kHeaderBytes);
  StepInputs inputs;
  auto& [seq, submitted, cancelled, shutdown] = inputs;
  seq = r.u64("seq");
  const size_t n = r.count("submitted", min_entry_bytes());
  submitted.reserve(n);
  for (size_t i = 0; i < n && !r.failed(); ++i) {
    r.set_request(int64_t(i));
    auto& [id, q] = submitted.emplace_back();
    id = r.u64("id");
    get_request(r, q);
  }
  r.set_request(-1);
  cancelled.resize(r.count("cancelled", sizeof(RequestId)));
  for (RequestId& id : cancelled) id = r.u64("cancelled id");
  shutdown = r.boolean("shutdown");
  if (!r.failed() && r.left() != 0)
    r.fail(r.pos(), "trailing bytes", std::to_string(r.left()) + " after the message's end");
  if (r.failed()) return make_error(r.error());
  return inputs;
}

}  // namespace kvant
