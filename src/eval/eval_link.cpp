// EvalLink (eval_link.h): each message is a broadcast from rank 0 of a
// header {op, payload length} and then the payload, int32 words.
#include "eval/eval_link.h"

#include <cstddef>
#include <cstdio>

#include "dist/communicator.h"
#include "eval/runner.h"

namespace kvant::eval {

int EvalLink::rank() const { return comm_.rank(); }

Result<void> EvalLink::send(EvalOp op, std::span<const int32_t> payload) {
  int64_t head[2] = {int64_t(op), int64_t(payload.size())};
  KV_TRY(comm_.broadcast(std::as_writable_bytes(std::span<int64_t>(head)), 0));
  if (payload.empty()) return {};
  // broadcast works in place; rank 0's buffer is only read.
  auto* p = const_cast<int32_t*>(payload.data());
  return comm_.broadcast(std::as_writable_bytes(std::span<int32_t>(p, payload.size())), 0);
}

Result<void> EvalLink::send_score(std::span<const int32_t> context,
                                  const std::vector<std::vector<int32_t>>& continuations) {
  std::vector<int32_t> d;
  d.push_back(int32_t(context.size()));
  d.insert(d.end(), context.begin(), context.end());
  d.push_back(int32_t(continuations.size()));
  for (const auto& c : continuations) {
    d.push_back(int32_t(c.size()));
    d.insert(d.end(), c.begin(), c.end());
  }
  return send(EvalOp::kScore, d);
}

Result<void> EvalLink::send_window(std::span<const int32_t> tokens, int64_t first) {
  std::vector<int32_t> d;
  d.push_back(int32_t(first));
  d.insert(d.end(), tokens.begin(), tokens.end());
  return send(EvalOp::kWindow, d);
}

Result<EvalLink::Message> EvalLink::receive() {
  int64_t head[2] = {0, 0};
  KV_TRY(comm_.broadcast(std::as_writable_bytes(std::span<int64_t>(head)), 0));
  if (head[0] < int64_t(EvalOp::kLoad) || head[0] > int64_t(EvalOp::kStop) || head[1] < 0 ||
      head[1] > (int64_t(1) << 31))
    return make_error("eval: rank 0 sent a message this rank does not know (op " +
                      std::to_string(head[0]) + ", " + std::to_string(head[1]) + " words)");
  Message m;
  m.op = EvalOp(head[0]);
  m.data.resize(size_t(head[1]));
  if (!m.data.empty()) KV_TRY(comm_.broadcast(std::as_writable_bytes(std::span<int32_t>(m.data)), 0));
  return m;
}

namespace {
// Reads `n` words from d at `at`, or fails.
bool take(std::span<const int32_t> d, size_t& at, size_t n, std::span<const int32_t>& out) {
  if (at + n > d.size()) return false;
  out = d.subspan(at, n);
  at += n;
  return true;
}
Error malformed(const char* what) {
  return Error{std::string("eval: a malformed ") + what + " message from rank 0"};
}
}  // namespace

Result<void> EvalLink::decode_score(std::span<const int32_t> d, std::vector<int32_t>& context,
                                    std::vector<std::vector<int32_t>>& continuations) {
  size_t at = 0;
  std::span<const int32_t> s;
  if (!take(d, at, 1, s) || s[0] < 0 || !take(d, at, size_t(s[0]), s)) return malformed("score");
  context.assign(s.begin(), s.end());
  if (!take(d, at, 1, s) || s[0] < 0) return malformed("score");
  const size_t n = size_t(s[0]);
  continuations.clear();
  for (size_t i = 0; i < n; ++i) {
    if (!take(d, at, 1, s) || s[0] < 0 || !take(d, at, size_t(s[0]), s)) return malformed("score");
    continuations.emplace_back(s.begin(), s.end());
  }
  if (at != d.size()) return malformed("score");
  return {};
}

Result<void> EvalLink::decode_window(std::span<const int32_t> d, std::vector<int32_t>& tokens,
                                     int64_t& first) {
  if (d.empty()) return malformed("window");
  first = d[0];
  tokens.assign(d.begin() + 1, d.end());
  return {};
}

Result<int> follow_eval(Ctx& c, EvalLink& link) {
  std::vector<int32_t> context, tokens;
  std::vector<std::vector<int32_t>> conts;
  for (;;) {
    auto m = link.receive();
    if (!m) return m.error();
    switch (m->op) {
      case EvalOp::kLoad:
        if (!c.load_model) return make_error("eval: no model to load on this rank");
        KV_TRY(c.load_model(c));
        break;
      case EvalOp::kScore: {
        KV_TRY(EvalLink::decode_score(m->data, context, conts));
        if (!c.scorer) return make_error("eval: rank 0 scored before loading the model");
        // An error here is rank 0's too (the same inputs, the same checks):
        // rank 0 reports it.
        (void)c.scorer->score(context, conts);
        break;
      }
      case EvalOp::kWindow: {
        int64_t first = 0;
        KV_TRY(EvalLink::decode_window(m->data, tokens, first));
        if (!c.scorer) return make_error("eval: rank 0 scored before loading the model");
        (void)c.scorer->window(tokens, first, [](int64_t, std::span<const float>) {});
        break;
      }
      case EvalOp::kEngine: {
        if (!c.make_engine) return make_error("eval: no engine to make on this rank");
        auto e = c.make_engine();
        if (!e) return e.error();
        auto r = (*e)->follow();
        if (!r) return r.error();
        break;
      }
      case EvalOp::kStop:
        return m->data.empty() ? 0 : int(m->data[0]);
    }
  }
}

}  // namespace kvant::eval
