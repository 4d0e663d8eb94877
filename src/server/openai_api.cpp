// Request parsing and response JSON for the OpenAI API (see openai_api.h).
// Ranges follow OpenAI's documentation where it gives one (temperature
// [0, 2], top_p (0, 1], penalties [-2, 2], top_logprobs [0, 20]) and the
// engine's limits elsewhere (stop strings, top_k, min_p).
#include "server/openai_api.h"

#include <cmath>
#include <limits>
#include <set>

#include "server/openai_chat.h"

namespace kvant::server {
namespace {

using nlohmann::json;

ApiError bad(std::string message, std::string param = "", int status = 400, std::string code = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

// Field readers: nullopt when absent or null; an error when of the wrong type
// or out of range.
struct Reader {
  const json& body;
  std::optional<ApiError> err;

  const json* field(const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void type_error(const char* name, const char* want, const json& v) {
    if (!err)
      err = bad(std::string("'") + name + "' must be " + want + ", got " + type_name(v), name);
  }
  std::optional<double> number(const char* name, double lo, double hi, bool lo_open = false) {
    const json* v = field(name);
    if (!v || err) return std::nullopt;
    if (!v->is_number()) {
      type_error(name, "a number", *v);
      return std::nullopt;
    }
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x <= lo)) {
      err = bad(std::string("'") + name + "' must be in " + (lo_open ? "(" : "[") + fmt(lo) + ", " +
                    fmt(hi) + "], got " + v->dump(),
                name);
      return std::nullopt;
    }
    return x;
  }
  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) {
    const json* v = field(name);
    if (!v || err) return std::nullopt;
    if (!v->is_number_integer()) {
      type_error(name, "an integer", *v);
      return std::nullopt;
    }
    // Unsigned values above int64 are out of range anyway.
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi)) {
      err = bad(std::string("'") + name + "' must be at most " + std::to_string(hi) + ", got " +
                    v->dump(),
                name);
      return std::nullopt;
    }
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) {
      err = bad(std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "], got " + v->dump(),
                name);
      return std::nullopt;
    }
    return x;
  }
  std::optional<bool> boolean(const char* name) {
    const json* v = field(name);
    if (!v || err) return std::nullopt;
    if (!v->is_boolean()) {
      type_error(name, "a boolean", *v);
      return std::nullopt;
    }
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* name) {
    const json* v = field(name);
    if (!v || err) return std::nullopt;
    if (!v->is_string()) {
      type_error(name, "a string", *v);
      return std::nullopt;
    }
    return v->get<std::string>();
  }
  static std::string fmt(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return b;
  }
};

// Not OpenAI's: speculative decoding, per request. true: prompt lookup with
// the defaults; false: off; an object {"method": "ngram" | "mtp",
// "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
// (vLLM's names for its server-wide setting), each key optional. "mtp"
// drafts with the model's multi-token-prediction layer (a server started
// with --mtp): one token per step, no lookup lengths.
void read_speculative(Reader& rd, ParsedRequest& r) {
  const json* v = rd.field("speculative");
  if (!v || rd.err) return;
  if (v->is_boolean()) {
    r.speculative = v->get<bool>() ? SpeculativeParams{kDefaultSpeculativeTokens, 2, 4}
                                   : SpeculativeParams{};
    return;
  }
  if (!v->is_object()) return rd.type_error("speculative", "a boolean or an object", *v);
  SpeculativeParams p{kDefaultSpeculativeTokens, 2, 4};
  bool tokens_given = false;
  std::string lookup_given;
  for (auto it = v->begin(); it != v->end() && !rd.err; ++it) {
    const std::string& k = it.key();
    const std::string name = "speculative." + k;
    if (it->is_null()) continue;
    if (k == "method") {
      if (it->is_string() && *it == "mtp") {
        p.method = SpecMethod::kMtp;
        if (!tokens_given) p.num_tokens = 1;
      } else if (!it->is_string() || *it != "ngram") {
        rd.err = bad("'" + name + "' must be \"ngram\" (prompt lookup) or \"mtp\" (the model's "
                     "multi-token-prediction layer), got " + it->dump(), name);
      }
      continue;
    }
    if (k == "num_speculative_tokens") tokens_given = true;
    if (k == "prompt_lookup_min" || k == "prompt_lookup_max") lookup_given = name;
    int32_t* dst = k == "num_speculative_tokens" ? &p.num_tokens
                   : k == "prompt_lookup_min"    ? &p.min_ngram
                   : k == "prompt_lookup_max"    ? &p.max_ngram
                                                 : nullptr;
    if (dst == nullptr) {
      rd.err = bad("'" + name + "' is not supported by this server", name, 400,
                   "unsupported_parameter");
    } else if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 16) {
      rd.err = bad("'" + name + "' must be an integer in [0, 16], got " + it->dump(), name);
    } else {
      *dst = int32_t(it->get<int64_t>());
    }
  }
  if (rd.err) return;
  if (p.method == SpecMethod::kMtp && !lookup_given.empty()) {
    rd.err = bad("'" + lookup_given + "' applies to method ngram, not mtp", lookup_given);
    return;
  }
  if (auto ok = check_speculative_params(p); !ok.ok())
    rd.err = bad(ok.error().message, "speculative");
  else
    r.speculative = p;
}

// A prompt given as token ids: each an integer in int32's range.
std::optional<ApiError> read_prompt_ids(const json& a, ParsedRequest& r) {
  for (const json& t : a) {
    if (!t.is_number_integer()) return bad("'prompt' token ids must be integers", "prompt");
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      return bad("'prompt' token id " + t.dump() + " is out of range", "prompt");
    r.prompt_ids.push_back(int32_t(v));
  }
  r.prompt_is_ids = true;
  return std::nullopt;
}

// Completions: 'prompt' (text, token ids or a list of one of those) and the fields only they take.
std::optional<ApiError> read_prompt(Reader& rd, ParsedRequest& r) {
  const json* p = rd.field("prompt");
  if (!p) return bad("'prompt' is required", "prompt");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) return bad("'prompt' must not be empty", "prompt");
    const json& first = (*p)[0];
    if (first.is_string() || first.is_array()) {
      if (p->size() != 1)
        return bad("only one prompt per request is supported, got " + std::to_string(p->size()),
                   "prompt");
      if (first.is_string())
        r.prompt = first.get<std::string>();
      else if (auto e = read_prompt_ids(first, r))
        return *e;
    } else if (auto e = read_prompt_ids(*p, r)) {
      return *e;
    }
  } else {
    return bad(std::string("'prompt' must be a string, a list of token ids or a "
                           "list of one of those, got ") +
                   type_name(*p),
               "prompt");
  }
  if (!r.prompt_is_ids && r.prompt.empty()) return bad("'prompt' must not be empty", "prompt");
  if (r.prompt_is_ids && r.prompt_ids.empty()) return bad("'prompt' must not be empty", "prompt");
  if (auto echo = rd.boolean("echo")) r.echo = *echo;
  if (auto f = rd.integer("prompt_logprobs_from", 1, std::numeric_limits<int32_t>::max()))
    r.prompt_logprobs_from = *f;
  if (auto t = rd.boolean("return_tokens_as_token_ids")) r.tokens_as_ids = *t;
  if (rd.err) return rd.err;
  if (auto s = rd.string("suffix"); s && !s->empty())
    return bad("'suffix' is not supported", "suffix");
  if (auto b = rd.integer("best_of", 1, kMaxChoices)) r.best_of = int32_t(*b);
  if (rd.err) return rd.err;
  return std::nullopt;
}

// 'stop': a string or a list of strings, within the engine's limits; errors go to rd.err.
void read_stop(Reader& rd, ParsedRequest& r) {
  const json* st = rd.field("stop");
  if (!st || rd.err) return;
  auto add = [&](const json& s) {
    if (!s.is_string()) {
      rd.err = bad("'stop' must be a string or a list of strings", "stop");
      return;
    }
    r.stop.stop.push_back(s.get<std::string>());
  };
  if (st->is_string()) {
    add(*st);
  } else if (st->is_array()) {
    if (st->size() > kMaxStopStrings)
      rd.err = bad("'stop' takes at most " + std::to_string(kMaxStopStrings) + " strings, got " +
                       std::to_string(st->size()),
                   "stop");
    for (const json& s : *st)
      if (!rd.err) add(s);
  } else {
    rd.type_error("stop", "a string or a list of strings", *st);
  }
  for (const auto& s : r.stop.stop) {
    if (rd.err) break;
    if (s.empty())
      rd.err = bad("'stop' strings must not be empty", "stop");
    else if (s.size() > kMaxStopStringBytes)
      rd.err = bad("'stop' strings are at most " + std::to_string(kMaxStopStringBytes) +
                       " bytes, got one of " + std::to_string(s.size()),
                   "stop");
  }
}

// logit_bias: {"token id": bias in [-100, 100], ...}; the ids are checked
// against the vocabulary when the request is submitted.
void read_logit_bias(Reader& rd, ParsedRequest& r) {
  const json* lb = rd.field("logit_bias");
  if (!lb || rd.err) return;
  if (!lb->is_object()) return rd.type_error("logit_bias", "an object of token id: bias", *lb);
  if (lb->size() > kMaxLogitBias) {
    rd.err = bad("'logit_bias' takes at most " + std::to_string(kMaxLogitBias) + " tokens, got " +
                     std::to_string(lb->size()),
                 "logit_bias");
    return;
  }
  auto& out = r.sampling.logit_bias;
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 &&
        key.find_first_not_of("0123456789") == std::string::npos)
      id = std::stoll(key);
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      rd.err = bad("'logit_bias' keys must be token ids (decimal integers), got '" + key + "'",
                   "logit_bias");
      return;
    }
    const json& v = it.value();
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 ||
        v.get<double>() > 100) {
      rd.err = bad("'logit_bias' values must be numbers in [-100, 100], got " + v.dump() +
                       " for token " + key,
                   "logit_bias");
      return;
    }
    for (const auto& [t, b] : out)
      if (t == int32_t(id)) {
        rd.err = bad("'logit_bias' names token " + key + " twice", "logit_bias");
        return;
      }
    out.emplace_back(int32_t(id), float(v.get<double>()));
  }
}

}  // namespace

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return dump_json(json{{"error", err}});
}

namespace {

// Whether an unread field only asks for what happens anyway: no tools, no
// bias, plain text, nothing stored. Such values are accepted; any other
// value of a field this server does not read is refused.
bool asks_for_nothing(const std::string& k, const json& v) {
  if (k == "tools" || k == "functions") return v.is_array() && v.empty();
  if (k == "tool_choice" || k == "function_call")
    return v.is_string() && (v == "none" || v == "auto");
  if (k == "parallel_tool_calls") return v.is_boolean();
  if (k == "response_format")
    return v.is_object() && v.size() == 1 && v.value("type", json()) == "text";
  if (k == "store") return v.is_boolean() && !v.get<bool>();
  if (k == "service_tier") return v.is_string() && (v == "auto" || v == "default");
  if (k == "modalities") return v == json::array({"text"});
  return false;
}

// Every top-level field is one this server reads, null, or asks for
// nothing (above): a field the API does not support is refused with its
// name, never silently ignored.
std::optional<ApiError> refuse_unread(Endpoint endpoint, const json& j) {
  static const std::set<std::string, std::less<>> common = {
      "model", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "top_k",
      "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stream",
      "stream_options", "stop", "user", "ignore_eos", "logprobs", "logit_bias",
      "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
      "speculative"};
  static const std::set<std::string, std::less<>> chat_only = {
      "messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
      "chat_template_kwargs"};
  static const std::set<std::string, std::less<>> completion_only = {
      "prompt", "echo", "prompt_logprobs_from", "return_tokens_as_token_ids", "suffix", "best_of"};
  const auto& own = endpoint == Endpoint::Chat ? chat_only : completion_only;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (common.count(k) || own.count(k) || it->is_null() || asks_for_nothing(k, *it)) continue;
    std::string what = "'" + k + "' is not supported by this server";
    if (k == "functions" || k == "function_call")
      what += " (the deprecated function-calling fields; use 'tools' and 'tool_choice')";
    else if ((endpoint == Endpoint::Chat ? completion_only : chat_only).count(k))
      what += std::string(" on ") +
              (endpoint == Endpoint::Chat ? "/v1/chat/completions" : "/v1/completions");
    return bad(what, k, 400, "unsupported_parameter");
  }
  return std::nullopt;
}

ParseOutcome parse_request_body(Endpoint endpoint, std::string_view body,
                                const std::string& model_name, int32_t max_logprobs) {
  ParseOutcome out;
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos)
      out.error = bad("the request body is not valid UTF-8: " + what);
    else
      out.error = bad("the request body is not valid JSON: " + what);
    return out;
  }
  if (!j.is_object()) {
    out.error = bad(std::string("the request body must be a JSON object, got ") + type_name(j));
    return out;
  }
  ParsedRequest r;
  r.endpoint = endpoint;
  Reader rd{j, std::nullopt};

  auto model = rd.string("model");
  if (rd.err) return {std::nullopt, *rd.err};
  if (!model) return {std::nullopt, bad("'model' is required", "model")};
  if (*model != model_name)
    return {std::nullopt, bad("the model '" + *model + "' does not exist; this server serves '" +
                                  model_name + "'",
                              "model", 404, "model_not_found")};
  r.model = *model;

  // Messages, tools and schemas keep their key order (templates print
  // them; a schema's properties come out in the order it lists them).
  nlohmann::ordered_json oj = nlohmann::ordered_json::parse(body, nullptr, false);
  if (endpoint == Endpoint::Chat) {
    if (auto e = read_chat_messages(oj, r)) return {std::nullopt, *e};
    if (auto e = read_tools(oj, r)) return {std::nullopt, *e};
  } else if (auto e = read_prompt(rd, r)) {
    return {std::nullopt, *e};
  }
  if (auto e = read_output_format(oj, r)) return {std::nullopt, *e};
  if (r.output && !r.chat.tools.is_null())
    return {std::nullopt, bad("'" + r.output_param + "' cannot be combined with 'tools' (unless "
                              "'tool_choice' is \"none\")", r.output_param)};

  constexpr int64_t kMaxTokens = int64_t(1) << 30;
  // 0 only with echo: the prompt is scored and nothing generated.
  auto mt = rd.integer("max_tokens", r.echo ? 0 : 1, kMaxTokens);
  auto mct = rd.integer("max_completion_tokens", r.echo ? 0 : 1, kMaxTokens);
  if (mct) mt = mct;
  if (mt && *mt == 0) r.prompt_only = true;
  else if (mt) r.max_tokens = int32_t(*mt);
  if (auto n = rd.integer("n", 1, kMaxChoices)) r.n = int32_t(*n);
  // best_of > n would rank the candidates by likelihood and return the
  // best n: not done here, so only best_of == n (or absent) is accepted.
  if (r.best_of > 0 && r.best_of != r.n && !rd.err)
    rd.err = bad("'best_of' must equal 'n' (" + std::to_string(r.n) +
                     "): choosing the best of more candidates is not supported, got " +
                     std::to_string(r.best_of),
                 "best_of");
  if (r.n > 1 && r.echo && !rd.err)
    rd.err = bad("'echo' is not supported together with 'n' > 1", "echo");
  if (auto t = rd.number("temperature", 0, 2))
    r.sampling.temperature = float(*t);
  else if (!rd.err && !rd.field("temperature"))
    r.sampling.temperature = 1.f;  // OpenAI's default
  if (auto t = rd.number("top_p", 0, 1, /*lo_open=*/true)) r.sampling.top_p = float(*t);
  if (auto t = rd.integer("top_k", -1, 1 << 24)) r.sampling.top_k = int32_t(*t);
  if (auto t = rd.number("min_p", 0, 1)) r.sampling.min_p = float(*t);
  if (auto t = rd.number("presence_penalty", -2, 2)) r.sampling.presence_penalty = float(*t);
  if (auto t = rd.number("frequency_penalty", -2, 2)) r.sampling.frequency_penalty = float(*t);
  if (auto t = rd.number("repetition_penalty", 0, 100, true))
    r.sampling.repetition_penalty = float(*t);
  if (auto s = rd.integer("seed", std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max())) {
    // The engine reads seed 0 as "pick one"; a client's 0 must stay fixed.
    r.sampling.seed = *s == 0 ? 0x9e3779b97f4a7c15ull : uint64_t(*s);
  }
  read_logit_bias(rd, r);
  if (auto s = rd.boolean("stream")) r.stream = *s;
  if (const json* so = rd.field("stream_options"); so && !rd.err) {
    if (!so->is_object()) {
      rd.type_error("stream_options", "an object", *so);
    } else if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean())
        rd.err =
            bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage");
      else
        r.include_usage = iu->get<bool>();
    }
    if (so->is_object())
      for (auto it = so->begin(); it != so->end() && !rd.err; ++it)
        if (it.key() != "include_usage" && !it->is_null())
          rd.err = bad("'stream_options." + it.key() + "' is not supported by this server",
                       "stream_options." + it.key(), 400, "unsupported_parameter");
    if (!rd.err && !r.stream)
      rd.err = bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
  }
  if (endpoint == Endpoint::Chat) {
    if (auto l = rd.boolean("logprobs")) r.logprobs = *l;
    if (auto t = rd.integer("top_logprobs", 0, kMaxTopLogprobs)) {
      if (!r.logprobs && !rd.err)
        rd.err = bad("'top_logprobs' needs 'logprobs' to be true", "top_logprobs");
      r.top_logprobs = int32_t(*t);
    }
  } else if (auto l = rd.integer("logprobs", 0, std::max(max_logprobs, 0))) {
    r.logprobs = true;
    r.top_logprobs = int32_t(*l);
    if (r.top_logprobs > kMaxTopLogprobs && !r.prompt_only && !rd.err)
      rd.err = bad("'logprobs' above " + std::to_string(kMaxTopLogprobs) +
                       " is only for prompt tokens ('echo' with 'max_tokens' 0)",
                   "logprobs");
  }
  r.sampling.top_logprobs = std::min(r.top_logprobs, kMaxTopLogprobs);
  read_stop(rd, r);
  if (auto u = rd.string("user")) r.user = *u;
  // Not OpenAI's: keeps generating past end-of-generation tokens (benchmarks).
  if (auto ie = rd.boolean("ignore_eos")) r.stop.ignore_eos = *ie;
  read_speculative(rd, r);
  if (!rd.err) rd.err = refuse_unread(endpoint, j);
  if (rd.err) return {std::nullopt, *rd.err};
  r.stop.max_tokens = r.max_tokens;
  out.request = std::move(r);
  return out;
}

}  // namespace

// Any JSON exception left (a number out of range, a value of an unexpected
// type deep inside) is the client's error, not the server's.
ParseOutcome parse_request(Endpoint endpoint, std::string_view body,
                           const std::string& model_name, int32_t max_logprobs) {
  try {
    return parse_request_body(endpoint, body, model_name, max_logprobs);
  } catch (const json::exception& e) {
    ParseOutcome out;
    out.error = bad(std::string("the request could not be read: ") + e.what());
    return out;
  }
}

namespace {

TokenizeOutcome tokenize_body(std::string_view body, const std::string& model_name,
                              const Tokenizer& tok, int64_t max_model_len) {
  TokenizeOutcome out;
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    out.error = bad(std::string("the request body is not valid JSON: ") + e.what());
    return out;
  }
  if (!j.is_object()) {
    out.error = bad("the request body must be a JSON object");
    return out;
  }
  Reader rd{j, std::nullopt};
  auto model = rd.string("model");
  auto prompt = rd.string("prompt");
  auto special = rd.boolean("add_special_tokens");
  // Not vLLM's: false reads special-token text ("<|im_end|>") as plain text.
  auto parse_special = rd.boolean("parse_special");
  if (rd.err) {
    out.error = *rd.err;
    return out;
  }
  if (model && *model != model_name) {
    out.error = bad("the model '" + *model + "' does not exist; this server serves '" + model_name +
                        "'",
                    "model", 404, "model_not_found");
    return out;
  }
  if (!prompt) {
    out.error = bad("'prompt' is required and must be a string", "prompt");
    return out;
  }
  const auto ids = tok.encode(*prompt, special.value_or(true), parse_special.value_or(true));
  out.response = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", max_model_len}};
  return out;
}

}  // namespace

TokenizeOutcome tokenize_request(std::string_view body, const std::string& model_name,
                                 const Tokenizer& tok, int64_t max_model_len) {
  try {
    return tokenize_body(body, model_name, tok, max_model_len);
  } catch (const json::exception& e) {
    TokenizeOutcome out;
    out.error = bad(std::string("the request could not be read: ") + e.what());
    return out;
  }
}

nlohmann::json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}
}  // namespace

nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobText>& tokens,
                             int64_t text_offset) {
  if (endpoint == Endpoint::Chat) {
    json content = json::array();
    for (const auto& t : tokens) {
      json top = json::array();
      for (const auto& [s, lp] : t.top)
        top.push_back({{"token", s}, {"logprob", lp}, {"bytes", bytes_of(s)}});
      content.push_back({{"token", t.token},
                         {"logprob", t.logprob},
                         {"bytes", bytes_of(t.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const auto& t : tokens) {
    toks.push_back(t.token);
    if (t.has_logprob) {
      lps.push_back(t.logprob);
      json top = json::object();
      for (const auto& [s, lp] : t.top) top[s] = lp;
      tops.push_back(top);
    } else {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
    }
    offs.push_back(text_offset);
    text_offset += int64_t(t.token.size());
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

namespace {
json choice_error(std::string_view error, std::string_view code) {
  return {{"message", std::string(error)},
          {"type", "server_error"},
          {"code", code.empty() ? json(nullptr) : json(std::string(code))}};
}
}  // namespace

namespace {

json choice_json(Endpoint endpoint, int32_t index, const ChoiceResult& c, bool with_logprobs) {
  json choice = {{"index", index}, {"finish_reason", c.finish}};
  if (endpoint == Endpoint::Chat && c.parsed) {
    json msg = {{"role", "assistant"}};
    msg["content"] = c.text.empty() && !c.tool_calls.empty() ? json(nullptr) : json(c.text);
    if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      msg["tool_calls"] = json::array();
      for (const ToolCall& t : c.tool_calls) msg["tool_calls"].push_back(tool_call_json(t));
    }
    choice["message"] = std::move(msg);
  } else if (endpoint == Endpoint::Chat)
    choice["message"] = {{"role", "assistant"}, {"content", c.text}};
  else
    choice["text"] = c.text;
  choice["logprobs"] = with_logprobs ? logprobs_json(endpoint, c.logprobs, 0) : json(nullptr);
  if (!c.error.empty()) choice["error"] = choice_error(c.error, c.error_code);
  return choice;
}

}  // namespace

nlohmann::json full_response(Endpoint endpoint, const ResponseMeta& meta,
                             std::span<const ChoiceResult> choices, bool with_logprobs,
                             const Usage& usage) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i)
    list.push_back(choice_json(endpoint, int32_t(i), choices[i], with_logprobs));
  return {{"id", meta.id},
          {"object", endpoint == Endpoint::Chat ? "chat.completion" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(list)},
          {"usage", usage_json(usage)}};
}

nlohmann::json full_response(Endpoint endpoint, const ResponseMeta& meta, const std::string& text,
                             const std::vector<TokenLogprobText>* logprobs,
                             std::string_view finish_reason, std::string_view error,
                             const Usage& usage, std::string_view error_code) {
  ChoiceResult c;
  c.text = text;
  if (logprobs) c.logprobs = *logprobs;
  c.finish = std::string(finish_reason);
  c.error = std::string(error);
  c.error_code = std::string(error_code);
  return full_response(endpoint, meta, std::span<const ChoiceResult>(&c, 1), logprobs != nullptr,
                       usage);
}

uint64_t choice_seed(uint64_t seed, int32_t choice) {
  if (seed == 0 || choice == 0) return seed;  // 0: every choice picks its own
  const uint64_t s = seed + uint64_t(choice) * 0x9e3779b97f4a7c15ull;
  return s == 0 ? 1 : s;
}

nlohmann::json stream_chunk(Endpoint endpoint, const ResponseMeta& meta, bool first,
                            const std::string& text, const std::vector<TokenLogprobText>* logprobs,
                            int64_t text_offset, std::string_view finish_reason,
                            std::string_view error, std::string_view error_code,
                            int32_t index, const ChatOutputDelta* parsed) {
  json choice = {{"index", index}};
  if (endpoint == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    if (parsed && !parsed->reasoning.empty()) delta["reasoning_content"] = parsed->reasoning;
    if (parsed && !parsed->tool_calls.empty()) {
      delta["tool_calls"] = json::array();
      for (const auto& [i, t] : parsed->tool_calls) delta["tool_calls"].push_back(tool_call_json(t, i));
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs && !logprobs->empty()
                           ? logprobs_json(endpoint, *logprobs, text_offset)
                           : json(nullptr);
  choice["finish_reason"] =
      finish_reason.empty() ? json(nullptr) : json(std::string(finish_reason));
  if (!error.empty()) choice["error"] = choice_error(error, error_code);
  return {{"id", meta.id},
          {"object", endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({choice})}};
}

nlohmann::json tool_call_json(const ToolCall& c, int index) {
  json out = json::object();
  if (index >= 0) out["index"] = index;
  out["id"] = c.id;
  out["type"] = "function";
  out["function"] = {{"name", c.name}, {"arguments", c.arguments}};
  return out;
}

nlohmann::json usage_chunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage) {
  return {{"id", meta.id},
          {"object", endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array()},
          {"usage", usage_json(usage)}};
}

}  // namespace kvant::server
