// Structured output and chat output parsing in the server: the constraint
// a request's choices follow (compiled once per output spec and cached),
// and the split of a chat answer into reasoning, content and tool calls,
// streamed or whole.
#include <cstdio>

#include "server/http_internal.h"

namespace kvant::server {

// Output parsing (chat) and the constraint a request's choices follow.
std::optional<ApiError> Server::setup_output(ParsedRequest& pr) const {
  const bool chat = pr.endpoint == Endpoint::Chat;
  const bool tools = chat && !pr.chat.tools.is_null();
  if (chat && (tools || opt_.reasoning_format != ReasoningFormat::None)) {
    pr.parse_output = true;
    pr.output_options.tools = tools ? opt_.tool_format : ToolFormat::None;
    pr.output_options.reasoning = opt_.reasoning_format;
    pr.output_options.tool_schemas = pr.chat.tools;
    // Call ids unique across requests: a random stem, then the index.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    char stem[32];
    std::snprintf(stem, sizeof stem, "call_%012llx_", (unsigned long long)(rng() >> 16));
    pr.output_options.id_prefix = stem;
  }
  grammar::OutputSpec spec;
  std::string param;
  if (pr.output) {
    spec = *pr.output;
    param = pr.output_param;
  } else if (tools && (pr.tool_choice == ParsedRequest::ToolChoice::Required ||
                       pr.tool_choice == ParsedRequest::ToolChoice::Function)) {
    spec.kind = grammar::OutputSpec::Kind::ToolCalls;
    spec.tools = pr.chat.tools;
    spec.function = pr.tool_function;
    spec.parallel = pr.parallel_tool_calls;
    spec.format = opt_.tool_format;
    param = "tool_choice";
  } else {
    return std::nullopt;
  }
  if (chat) {
    // Reasoning may come before the constrained part unless the prompt
    // already closed it.
    spec.reasoning = pr.reasoning_done ? ReasoningFormat::None : opt_.reasoning_format;
    spec.starts_in_reasoning = pr.output_options.starts_in_reasoning;
  }
  auto c = compiled_constraint(spec);
  if (!c) {
    ApiError e = api_error(400, c.error().message, "invalid_request_error");
    e.param = param;
    return e;
  }
  pr.constraint = std::move(*c);
  return std::nullopt;
}

Result<std::shared_ptr<grammar::CompiledConstraint>> Server::compiled_constraint(
    const grammar::OutputSpec& spec) const {
  const std::string key = spec.cache_key();
  std::shared_ptr<const grammar::VocabIndex> vocab;
  {
    std::lock_guard<std::mutex> lk(constraints_mu_);
    for (const auto& [k, c] : constraints_)
      if (k == key) return c;
    if (!vocab_index_) vocab_index_ = grammar::VocabIndex::build(engine_.tokenizer());
    vocab = vocab_index_;
  }
  // Compiled outside the lock: a large schema does not hold up others.
  auto c = grammar::compile_output(spec, std::move(vocab));
  if (!c) return c.error();
  std::lock_guard<std::mutex> lk(constraints_mu_);
  constraints_.emplace_back(key, *c);
  if (constraints_.size() > kMaxCachedConstraints) constraints_.pop_front();
  return c;
}

std::string parsed_sse_events(const ResponseMeta& meta, const ParsedRequest& pr, int32_t i,
                              ChoiceState& c, const std::string& delta,
                              const std::vector<TokenLogprobText>& delta_lps) {
  if (!c.parser) c.parser.emplace(pr.output_options);
  ChatOutputDelta d = c.parser->push(delta);
  if (c.finished) {
    ChatOutputDelta rest = c.parser->finish();
    d.reasoning += rest.reasoning;
    d.content += rest.content;
    for (auto& t : rest.tool_calls) d.tool_calls.push_back(std::move(t));
  }
  // parallel_tool_calls false: the first call only.
  if (!pr.parallel_tool_calls) std::erase_if(d.tool_calls, [](const auto& t) { return t.first > 0; });
  c.any_tool_call |= !d.tool_calls.empty();
  if (c.finished && c.any_tool_call && c.out.finish == "stop") c.out.finish = "tool_calls";
  std::string out;
  if (!d.empty() || !delta_lps.empty() || c.first_chunk || c.finished)
    out = sse_events(Endpoint::Chat, meta, pr, i, c.first_chunk, d.content, delta_lps, c.text_offset,
                     c.finished, c.out.finish, c.out.error, c.out.error_code, &d);
  c.first_chunk = false;
  return out;
}

void parse_choices(const ParsedRequest& pr, std::vector<ChoiceState>& cs) {
  for (ChoiceState& c : cs) {
    ChatOutput o = parse_chat_output(c.out.text, pr.output_options);
    c.out.parsed = true;
    c.out.text = std::move(o.content);
    c.out.reasoning = std::move(o.reasoning);
    c.out.tool_calls = std::move(o.tool_calls);
    if (!pr.parallel_tool_calls && c.out.tool_calls.size() > 1) c.out.tool_calls.resize(1);
    if (!c.out.tool_calls.empty() && c.out.finish == "stop") c.out.finish = "tool_calls";
  }
}

}  // namespace kvant::server
