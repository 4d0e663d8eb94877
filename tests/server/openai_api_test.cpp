// The OpenAI request parser and response JSON, without a network or model.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "server/metrics.h"

namespace kvant::server {
namespace {

using nlohmann::json;
constexpr const char* kModel = "m";

ParseOutcome chat(const json& extra) {
  json j = {{"model", kModel}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  j.update(extra);
  return parse_request(Endpoint::Chat, j.dump(), kModel);
}

ParseOutcome comp(const json& extra) {
  json j = {{"model", kModel}, {"prompt", "hi"}};
  j.update(extra);
  return parse_request(Endpoint::Completion, j.dump(), kModel);
}

TEST(OpenAiApi, ChatDefaultsAndFields) {
  auto r = chat({{"max_completion_tokens", 7},
                 {"temperature", 0.5},
                 {"top_p", 0.9},
                 {"top_k", 40},
                 {"min_p", 0.05},
                 {"seed", 42},
                 {"stop", "x"},
                 {"presence_penalty", 1},
                 {"frequency_penalty", -1},
                 {"logprobs", true},
                 {"top_logprobs", 3},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}},
                 {"user", "u"}});
  ASSERT_TRUE(r.request) << r.error.message;
  const ParsedRequest& p = *r.request;
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.stop.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(p.stop.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 3);
  EXPECT_TRUE(p.stream && p.include_usage);
  ASSERT_EQ(p.chat.messages.size(), 1u);
  EXPECT_EQ(p.chat.messages[0]["role"], "user");
  auto d = chat(json::object());
  ASSERT_TRUE(d.request);
  EXPECT_FLOAT_EQ(d.request->sampling.temperature, 1.f);  // OpenAI's default
  EXPECT_EQ(d.request->max_tokens, 0);
}

TEST(OpenAiApi, SeedZeroStaysFixed) {
  auto r = chat({{"seed", 0}});
  ASSERT_TRUE(r.request);
  EXPECT_NE(r.request->sampling.seed, 0u);
}

TEST(OpenAiApi, SeveralChoices) {
  auto a = chat({{"n", 3}, {"seed", 7}});
  ASSERT_TRUE(a.request);
  EXPECT_EQ(a.request->n, 3);
  auto b = comp({{"n", 2}, {"best_of", 2}});
  ASSERT_TRUE(b.request);
  EXPECT_EQ(b.request->n, 2);
  // Choice 0 keeps the seed; the others differ from it and from each other;
  // seed 0 (none given) stays 0 so that every choice picks its own.
  const uint64_t s = a.request->sampling.seed;
  EXPECT_EQ(choice_seed(s, 0), s);
  EXPECT_NE(choice_seed(s, 1), s);
  EXPECT_NE(choice_seed(s, 1), choice_seed(s, 2));
  EXPECT_EQ(choice_seed(0, 5), 0u);
}

TEST(OpenAiApi, CompletionPrompts) {
  auto a = comp({{"prompt", {1, 2, 3}}});
  ASSERT_TRUE(a.request);
  EXPECT_TRUE(a.request->prompt_is_ids);
  EXPECT_EQ(a.request->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  auto b = comp({{"prompt", {"text"}}});
  ASSERT_TRUE(b.request);
  EXPECT_EQ(b.request->prompt, "text");
  auto c = comp({{"logprobs", 2}});
  ASSERT_TRUE(c.request);
  EXPECT_TRUE(c.request->logprobs);
  EXPECT_EQ(c.request->top_logprobs, 2);
}

TEST(OpenAiApi, ErrorsNameTheField) {
  struct Case {
    ParseOutcome got;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {chat({{"temperature", 3}}), 400, "temperature"},
      {chat({{"top_p", 0}}), 400, "top_p"},
      {chat({{"max_tokens", "5"}}), 400, "max_tokens"},
      {chat({{"n", 0}}), 400, "n"},
      {chat({{"n", kMaxChoices + 1}}), 400, "n"},
      {comp({{"n", 2}, {"best_of", 3}}), 400, "best_of"},
      {comp({{"n", 2}, {"echo", true}}), 400, "echo"},
      {chat({{"stop", {1}}}), 400, "stop"},
      {chat({{"top_logprobs", 2}}), 400, "top_logprobs"},
      {chat({{"model", "other"}}), 404, "model"},
      {chat({{"messages", json::array()}}), 400, "messages"},
      {comp({{"prompt", {"a", "b"}}}), 400, "prompt"},
      {comp({{"logprobs", 21}}), 400, "logprobs"},
      {comp({{"max_tokens", 0}}), 400, "max_tokens"},  // 0 only with echo
      {comp({{"echo", "yes"}}), 400, "echo"},
      {comp({{"echo", true}, {"prompt_logprobs_from", 0}}), 400, "prompt_logprobs_from"},
  };
  for (const auto& c : cases) {
    ASSERT_FALSE(c.got.request) << c.param;
    EXPECT_EQ(c.got.error.status, c.status) << c.param;
    EXPECT_EQ(c.got.error.param, c.param);
  }
  auto bad = parse_request(Endpoint::Chat, "{\"model\": \"m\", \"messages\": \"\xff\"}", kModel);
  ASSERT_FALSE(bad.request);
  EXPECT_NE(bad.error.message.find("UTF-8"), std::string::npos);
  auto j = json::parse(error_body(bad.error));
  EXPECT_TRUE(j["error"].contains("message") && j["error"].contains("type") &&
              j["error"].contains("param") && j["error"].contains("code"));
}

TEST(OpenAiApi, SpeculativeDecodingIsAskedPerRequest) {
  // Off unless asked for; true takes the defaults; an object names vLLM's keys.
  EXPECT_EQ(chat(json::object()).request->speculative.num_tokens, 0);
  EXPECT_EQ(comp({{"speculative", false}}).request->speculative.num_tokens, 0);
  auto on = chat({{"speculative", true}});
  ASSERT_TRUE(on.request);
  EXPECT_EQ(on.request->speculative.num_tokens, kDefaultSpeculativeTokens);
  auto o = comp({{"speculative",
                  {{"method", "ngram"}, {"num_speculative_tokens", 6}, {"prompt_lookup_min", 1},
                   {"prompt_lookup_max", 3}}}});
  ASSERT_TRUE(o.request) << o.error.message;
  EXPECT_EQ(o.request->speculative.num_tokens, 6);
  EXPECT_EQ(o.request->speculative.min_ngram, 1);
  EXPECT_EQ(o.request->speculative.max_ngram, 3);
  EXPECT_EQ(o.request->speculative.method, SpecMethod::kNgram);
  // The model's multi-token-prediction layer: one draft token by default.
  auto m = chat({{"speculative", {{"method", "mtp"}}}});
  ASSERT_TRUE(m.request) << m.error.message;
  EXPECT_EQ(m.request->speculative.method, SpecMethod::kMtp);
  EXPECT_EQ(m.request->speculative.num_tokens, 1);
  auto m0 = chat({{"speculative", {{"method", "mtp"}, {"num_speculative_tokens", 0}}}});
  ASSERT_TRUE(m0.request) << m0.error.message;
  EXPECT_EQ(m0.request->speculative.num_tokens, 0);
  struct Case {
    json value;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {"yes", "speculative", "a boolean or an object"},
      {{{"method", "eagle"}}, "speculative.method", "ngram"},
      {{{"num_speculative_tokens", 17}}, "speculative.num_speculative_tokens", "[0, 16]"},
      {{{"num_speculative_tokens", "4"}}, "speculative.num_speculative_tokens", "integer"},
      {{{"prompt_lookup_min", 5}, {"prompt_lookup_max", 3}}, "speculative", "max_ngram"},
      {{{"draft_model", "x"}}, "speculative.draft_model", "not supported"},
      {{{"method", "mtp"}, {"prompt_lookup_max", 3}}, "speculative.prompt_lookup_max",
       "method ngram"},
  };
  for (const auto& c : cases) {
    auto r = chat({{"speculative", c.value}});
    ASSERT_FALSE(r.request) << c.value.dump();
    EXPECT_EQ(r.error.status, 400);
    EXPECT_EQ(r.error.param, c.param) << c.value.dump();
    EXPECT_NE(r.error.message.find(c.says), std::string::npos) << r.error.message;
  }
}

TEST(OpenAiApi, UnreadFieldsAreRefusedByName) {
  const std::pair<json, const char*> refused[] = {
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"examples", 1}}}}}}},
       "tools[0].function.examples"},
      {{{"response_format", {{"type", "json_object"}, {"strict", true}}}}, "response_format.strict"},
      {{{"structured_outputs", {{"grammar", "root ::= x"}}}}, "structured_outputs.grammar"},
      {{{"functions", json::array({{{"name", "f"}}})}}, "functions"},
      {{{"logit_bias", {{"abc", 5}}}}, "logit_bias"},
      {{{"logit_bias", {{"-3", 5}}}}, "logit_bias"},
      {{{"logit_bias", {{"50", 101}}}}, "logit_bias"},
      {{{"logit_bias", {{"50", "x"}}}}, "logit_bias"},
      {{{"logit_bias", {{"07", 1}, {"7", 2}}}}, "logit_bias"},
      {{{"reasoning_effort", "low"}}, "reasoning_effort"},
      {{{"some_field", 1}}, "some_field"},
      {{{"store", true}}, "store"},
      {{{"echo", true}}, "echo"},  // a completions field on chat
      {{{"messages", {{{"role", "user"}, {"content", "hi"}, {"audio", {{"id", "a"}}}}}}},
       "messages[0].audio"},
      {{{"messages",
         {{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {{{"id", "c1"}, {"extra", 1}}}}}}}},
       "messages[0].tool_calls[0].extra"},
      {{{"stream", true}, {"stream_options", {{"continuous_usage_stats", true}}}},
       "stream_options.continuous_usage_stats"},
  };
  for (const auto& [extra, name] : refused) {
    auto r = chat(extra);
    ASSERT_FALSE(r.request) << name;
    EXPECT_EQ(r.error.status, 400) << name;
    EXPECT_EQ(r.error.param, name);
    if (std::string(name) != "logit_bias" && std::string(name) != "response_format") {
      EXPECT_EQ(r.error.code, "unsupported_parameter");
    }
    EXPECT_NE(r.error.message.find(name), std::string::npos) << r.error.message;
  }
  EXPECT_EQ(comp({{"top_logprobs", 2}}).error.param, "top_logprobs");  // a chat field
  EXPECT_EQ(comp({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}).error.param,
            "tools");  // tools are for chat
  // Values that ask for nothing, and nulls, are accepted.
  const json accepted[] = {{{"tools", json::array()}},
                           {{"tool_choice", "none"}},
                           {{"logit_bias", json::object()}},
                           {{"response_format", {{"type", "text"}}}},
                           {{"store", false}},
                           {{"parallel_tool_calls", true}},
                           {{"anything", nullptr}}};
  for (const auto& extra : accepted) EXPECT_TRUE(chat(extra).request) << extra.dump();
  auto lb = comp({{"logit_bias", {{"50", 5}, {"7", -100}}}});
  ASSERT_TRUE(lb.request) << lb.error.message;
  auto bias = lb.request->sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{7, -100.f}, {50, 5.f}}));
}

TEST(OpenAiApi, EchoAndPromptLogprobs) {
  auto r = comp({{"echo", true},
                 {"max_tokens", 0},
                 {"logprobs", 3},
                 {"prompt_logprobs_from", 7},
                 {"return_tokens_as_token_ids", true}});
  ASSERT_TRUE(r.request) << r.error.message;
  EXPECT_TRUE(r.request->echo);
  EXPECT_TRUE(r.request->prompt_only);
  EXPECT_EQ(r.request->top_logprobs, 3);
  EXPECT_EQ(r.request->prompt_logprobs_from, 7);
  EXPECT_TRUE(r.request->tokens_as_ids);
  // More than 20 alternatives: only for prompt tokens, up to the server's limit.
  json body = {{"model", kModel}, {"prompt", "hi"}, {"echo", true}, {"logprobs", 64}};
  auto gen = parse_request(Endpoint::Completion, body.dump(), kModel, 64);
  ASSERT_FALSE(gen.request);
  EXPECT_EQ(gen.error.param, "logprobs");
  body["max_tokens"] = 0;
  auto score = parse_request(Endpoint::Completion, body.dump(), kModel, 64);
  ASSERT_TRUE(score.request) << score.error.message;
  EXPECT_EQ(score.request->top_logprobs, 64);
  EXPECT_EQ(score.request->sampling.top_logprobs, kMaxTopLogprobs);
  auto over = parse_request(Endpoint::Completion, body.dump(), kModel, 32);
  ASSERT_FALSE(over.request);
  EXPECT_EQ(over.error.param, "logprobs");
  // An echoed first token has no logprob: null, as OpenAI writes it.
  TokenLogprobText first{"The", 0.f, true, {}};
  first.has_logprob = false;
  std::vector<TokenLogprobText> lps = {first, {" cat", -1.5f, true, {{" cat", -1.5f}}}};
  auto j = logprobs_json(Endpoint::Completion, lps, 0);
  EXPECT_TRUE(j["token_logprobs"][0].is_null());
  EXPECT_TRUE(j["top_logprobs"][0].is_null());
  EXPECT_EQ(j["token_logprobs"][1], -1.5f);
  EXPECT_EQ(j["text_offset"][1], 3);
}

TEST(OpenAiApi, ResponsesAndChunks) {
  ResponseMeta meta{"chatcmpl-1", 5, "m"};
  Usage u{10, 3, 4};
  std::vector<TokenLogprobText> lps = {{"a", -0.5f, true, {{"a", -0.5f}, {"b", -1.f}}}};
  auto full = full_response(Endpoint::Chat, meta, "hey", &lps, "error", "page changed", u);
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "error");
  EXPECT_EQ(full["choices"][0]["error"]["message"], "page changed");
  EXPECT_EQ(full["usage"]["total_tokens"], 13);
  EXPECT_EQ(full["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(full["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  auto first = stream_chunk(Endpoint::Chat, meta, true, "", nullptr, 0, "", "");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  auto c = stream_chunk(Endpoint::Completion, meta, false, "xy", &lps, 7, "", "");
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"][0], 7);
  EXPECT_EQ(usage_chunk(Endpoint::Chat, meta, u)["choices"].size(), 0u);
  ChoiceResult two[2];
  two[0].text = "a";
  two[0].finish = "stop";
  two[1].text = "b";
  two[1].finish = "length";
  auto many = full_response(Endpoint::Completion, meta, two, false, u);
  ASSERT_EQ(many["choices"].size(), 2u);
  EXPECT_EQ(many["choices"][1]["index"], 1);
  EXPECT_EQ(many["choices"][1]["text"], "b");
  EXPECT_EQ(many["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(stream_chunk(Endpoint::Chat, meta, false, "x", nullptr, 0, "", "", "", 4)["choices"][0]
                ["index"],
            4);
  // Bytes that are not UTF-8 never make the dump throw.
  EXPECT_NO_THROW(dump_json(json{{"t", std::string("\xe2\x82")}}));
}

TEST(ServerMetrics, PrometheusText) {
  Metrics m;
  EngineStats s;
  s.kv_pages_total = 10;
  s.kv_pages_used = 4;
  s.kv_pages_cached = 3;
  m.set_engine(s);
  m.ttft.observe(0.02);
  m.count_finish("stop");
  const std::string t = m.render({});
  EXPECT_NE(t.find("kvant_kv_pages_active 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("kvant_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("kvant_requests_finished_total{reason=\"stop\"} 1\n"), std::string::npos);
}

}  // namespace
}  // namespace kvant::server

namespace kvant::server {
namespace {

// Inputs that once escaped the parser as exceptions (and closed the
// connection with no answer) are client errors with a message.
TEST(OpenAiApi, OverflowsAndOddTypesAreClientErrors) {
  const char* bodies[] = {
      R"({"model": "m", "prompt": "hi", "max_tokens": 1e400})",
      R"({"model": "m", "prompt": "hi", "unknown_field": -1e400})",
      R"({"model": "m", "prompt": "hi", "temperature": 1e309})",
      R"({"model": "m", "messages": [{"role": "user", "content": [{"type": 1}]}]})",
      R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})",
      R"({"model": "m", "messages": [{"role": "user", "content": [null]}]})",
      R"({"model": "m", "prompt": [1, 2, 1e30]})",
      R"({"model": "m", "prompt": "hi", "stop": [1e400]})",
      R"({"model": "m", "prompt": "hi", "logit_bias": {"1": 1e400}})",
      R"([1e400])",
  };
  for (const char* b : bodies)
    for (Endpoint e : {Endpoint::Chat, Endpoint::Completion}) {
      ParseOutcome out;
      ASSERT_NO_THROW(out = parse_request(e, b, "m")) << b;
      EXPECT_FALSE(out.request) << b;
      EXPECT_EQ(out.error.status, 400) << b;
      EXPECT_FALSE(out.error.message.empty()) << b;
    }
}

TEST(OpenAiApi, ToolsMessagesAndStructuredOutput) {
  const char* body = R"({"model": "m", "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "21"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": false, "chat_template_kwargs": {"enable_thinking": false}})";
  auto r = parse_request(Endpoint::Chat, body, kModel);
  ASSERT_TRUE(r.request) << r.error.message;
  const ParsedRequest& p = *r.request;
  EXPECT_EQ(p.tool_choice, ParsedRequest::ToolChoice::Function);
  EXPECT_EQ(p.tool_function, "get_weather");
  EXPECT_FALSE(p.parallel_tool_calls);
  ASSERT_TRUE(p.chat.tools.is_array());
  EXPECT_EQ(p.chat.kwargs["enable_thinking"], false);
  ASSERT_EQ(p.chat.messages.size(), 3u);
  const auto& call = p.chat.messages[1]["tool_calls"][0];
  // Arguments become an object, keys in the client's order, for the template.
  EXPECT_EQ(call["function"]["arguments"].dump(), R"({"city":"Paris","unit":"c"})");
  EXPECT_EQ(p.chat.messages[1]["reasoning_content"], "think");
  EXPECT_EQ(p.chat.messages[2]["tool_call_id"], "c1");

  auto none = chat({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}, {"tool_choice", "none"}});
  ASSERT_TRUE(none.request);
  EXPECT_TRUE(none.request->chat.tools.is_null()) << "tool_choice none hides the tools";

  auto rf = parse_request(Endpoint::Chat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
        "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}}})",
                          kModel);
  ASSERT_TRUE(rf.request) << rf.error.message;
  ASSERT_TRUE(rf.request->output);
  EXPECT_EQ(rf.request->output->kind, grammar::OutputSpec::Kind::JsonSchema);
  EXPECT_EQ(rf.request->output->schema["properties"].begin().key(), "b") << "schema key order kept";
  auto choice = comp({{"guided_choice", {"yes", "no"}}});
  ASSERT_TRUE(choice.request) << choice.error.message;
  EXPECT_EQ(choice.request->output->choices.size(), 2u);

  const std::pair<json, const char*> errors[] = {
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}},
       "tool_choice"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}}, "tools[0].function.name"},
      {{{"tools", {{{"type", "code_interpreter"}}}}}, "tools[0].type"},
      {{{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{not json"}}}}}}}}}},
       "messages[0].tool_calls[0].function.arguments"},
      {{{"messages", {{{"role", "user"}, {"content", "x"}, {"tool_call_id", "c"}}}}}, "messages[0].tool_call_id"},
      {{{"response_format", {{"type", "json_schema"}}}}, "response_format.json_schema"},
      {{{"response_format", {{"type", "xml"}}}}, "response_format.type"},
      {{{"response_format", {{"type", "json_object"}}}, {"guided_regex", "a+"}}, "response_format"},
      {{{"response_format", {{"type", "json_object"}}}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}},
       "response_format"},
      {{{"guided_choice", json::array()}}, "guided_choice"},
      {{{"chat_template_kwargs", {{"messages", 1}}}}, "chat_template_kwargs.messages"},
  };
  for (const auto& [extra, name] : errors) {
    auto e = chat(extra);
    ASSERT_FALSE(e.request) << name;
    EXPECT_EQ(e.error.status, 400) << name;
    EXPECT_EQ(e.error.param, name) << e.error.message;
  }
}

}  // namespace
}  // namespace kvant::server
