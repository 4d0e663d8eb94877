// Socket-free response pieces of the server (see responses.h).
#include "server/responses.h"

#include <cmath>

namespace kvant::server {

Headers header(std::string name, std::string value) {
  Headers h;
  h.emplace_back(std::move(name), std::move(value));
  return h;
}

nlohmann::json model_json(const std::string& name, int64_t max_context) {
  return {{"id", name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "kvant"},
          {"max_model_len", max_context}};
}

nlohmann::json model_list_json(const nlohmann::json& m) {
  return {{"object", "list"}, {"data", nlohmann::json::array({m})}};
}

ApiError api_error(int status, std::string message, std::string type, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

std::string token_text(const Tokenizer& tok, bool as_ids, int32_t id) {
  return as_ids ? "token_id:" + std::to_string(id) : tok.decode(std::span<const int32_t>(&id, 1));
}

TokenLogprobText token_logprob_text(const Tokenizer& tok, bool as_ids, const StepLogprobs& s) {
  TokenLogprobText t;
  t.token = token_text(tok, as_ids, s.chosen.token);
  t.logprob = s.chosen.logprob;
  // Alternatives a constraint ruled out (logprob -inf) are not alternatives.
  for (const auto& a : s.top_tokens())
    if (std::isfinite(a.logprob)) t.top.emplace_back(token_text(tok, as_ids, a.token), a.logprob);
  return t;
}

std::vector<TokenLogprobText> echo_logprobs(const Tokenizer& tok, bool as_ids,
                                            const std::vector<int32_t>& echo_ids,
                                            const PromptLogprobs* plp) {
  std::vector<TokenLogprobText> lps;
  for (size_t p = 0; p < echo_ids.size(); ++p) {
    TokenLogprobText t;
    t.token = token_text(tok, as_ids, echo_ids[p]);
    const int64_t i = plp ? int64_t(p) - plp->first : -1;
    if (i >= 0 && i < plp->size()) {
      t.logprob = plp->chosen[size_t(i)].logprob;
      for (const auto& a : plp->top_at(i))
        t.top.emplace_back(token_text(tok, as_ids, a.token), a.logprob);
    } else {
      t.has_logprob = false;
    }
    lps.push_back(std::move(t));
  }
  return lps;
}

kvant::Request engine_request(const ParsedRequest& pr, std::vector<int32_t> ids) {
  kvant::Request er;
  er.prompt = std::move(ids);
  er.sampling = pr.sampling;
  er.stop = pr.stop;
  er.logprobs = pr.logprobs && !pr.prompt_only;
  er.prompt_only = pr.prompt_only;
  er.speculative = pr.speculative;
  if (pr.echo && pr.logprobs) {
    er.prompt_logprobs = pr.top_logprobs;
    er.prompt_logprobs_from = std::min<int64_t>(pr.prompt_logprobs_from, int64_t(er.prompt.size()));
  }
  return er;
}

std::string sse_events(Endpoint endpoint, const ResponseMeta& meta, const ParsedRequest& pr,
                       int32_t index, bool first_chunk, const std::string& delta,
                       const std::vector<TokenLogprobText>& delta_lps, int64_t& text_offset,
                       bool finished, const std::string& finish, const std::string& error,
                       const std::string& error_code, const ChatOutputDelta* parsed) {
  std::string out;
  // The finish goes in a chunk of its own after the last text, the way
  // OpenAI's stream ends.
  if (!delta.empty() || !delta_lps.empty() || first_chunk || (parsed && !parsed->empty()))
    out += "data: " +
           dump_json(stream_chunk(endpoint, meta, first_chunk, delta,
                                  pr.logprobs ? &delta_lps : nullptr, text_offset, "", "", "",
                                  index, parsed)) +
           "\n\n";
  text_offset += int64_t(delta.size());
  if (finished)
    out += "data: " +
           dump_json(stream_chunk(endpoint, meta, false, "", nullptr, text_offset, finish, error,
                                  error_code, index)) +
           "\n\n";
  return out;
}

std::string sse_tail(Endpoint endpoint, const ResponseMeta& meta, const ParsedRequest& pr,
                     const Usage& usage) {
  std::string out;
  if (pr.include_usage) out += "data: " + dump_json(usage_chunk(endpoint, meta, usage)) + "\n\n";
  return out + "data: [DONE]\n\n";
}

std::string client_error_text(ErrorCode code, const std::string& engine_message) {
  if (code == ErrorCode::kKvIntegrity)
    return "the KV cache integrity check failed for this request (code kv_integrity_error); it was "
           "aborted rather than answered from memory that changed under it";
  return engine_message;
}

const char* client_error_code(ErrorCode code) {
  switch (code) {
    case ErrorCode::kKvIntegrity: return "kv_integrity_error";
    case ErrorCode::kEngine: return "engine_error";
    case ErrorCode::kConstraint: return "constraint_error";
    case ErrorCode::kNone: break;
  }
  return "";
}

}  // namespace kvant::server
