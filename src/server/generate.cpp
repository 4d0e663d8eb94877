// Completions (/v1/chat/completions, /v1/completions) over the engine: the
// body parsed, rendered and tokenized on the worker pool with size caps
// checked before the expensive work; admission by request count, queued
// prompt tokens and bytes held; the answer streamed or sent whole; the
// client watched for the whole request. See http_internal.h for the threads.
//
// A request is cancelled when its client is gone: a read error or reset,
// or a failed write. End of stream alone is a half-close, which HTTP allows
// (the client may still read): the request goes on, and a heartbeat (an SSE
// comment, or for a whole response its status line early and then JSON
// whitespace) is written every second, so that a client that closed for
// good is found at the next write rather than after max_tokens.
#include <cstdio>
#include <exception>

#include "server/http_internal.h"

namespace kvant::server {
namespace {

constexpr auto kHeartbeat = std::chrono::seconds(1);
constexpr size_t kMaxBuffered = 64 * 1024;  // pipelined bytes kept while a request runs

int64_t strings_bytes(const std::vector<std::string>& v) {
  int64_t n = 0;
  for (const auto& s : v) n += int64_t(s.size()) + 32;
  return n;
}

// Folds a batch of engine events into the answer: text and logprobs to
// send, usage, and the finish (true once the final event is among them).
bool take_events(std::deque<Event>& batch, const ParsedRequest& pr, const Tokenizer& tok,
                 std::string& delta, std::vector<TokenLogprobText>& delta_lps, Usage& usage,
                 std::string& finish, std::string& error, std::string& error_code) {
  bool finished = false;
  for (Event& ev : batch) {
    delta += ev.text;
    if (pr.logprobs && ev.has_logprobs)
      delta_lps.push_back(token_logprob_text(tok, pr.tokens_as_ids, ev.logprobs));
    usage.prompt_tokens = ev.prompt_tokens;
    usage.completion_tokens = ev.completion_tokens;
    usage.cached_tokens = ev.cached_tokens;
    if (ev.finish != FinishReason::None) {
      finished = true;
      finish = std::string(finish_reason_name(ev.finish));
      if (ev.finish == FinishReason::Error) {
        error = client_error_text(ev.error_code, ev.error);
        error_code = client_error_code(ev.error_code);
      }
    }
  }
  return finished;
}

}  // namespace

std::string Server::new_id(Endpoint endpoint) {
  char b[40];
  std::snprintf(b, sizeof b, "%s-%016llx", endpoint == Endpoint::Chat ? "chatcmpl" : "cmpl",
                (unsigned long long)rng_());
  return b;
}

// The prompt's token ids, checked against the vocabulary and the context;
// the error otherwise. Text longer than any prompt that could fit is refused
// before it is rendered or tokenized.
std::optional<ApiError> Server::check_prompt(Endpoint endpoint, ParsedRequest& pr,
                                             std::vector<int32_t>& ids) const {
  const Tokenizer& tok = engine_.tokenizer();
  const int64_t ctx = engine_.capacity().max_context;
  auto too_long = [&](int64_t n, const char* unit) {
    ApiError e = api_error(400,
                           "this model's context holds " + std::to_string(ctx) +
                               " tokens, but the prompt has " + std::to_string(n) + " " + unit +
                               " (the prompt plus at least one generated token must fit)",
                           "invalid_request_error", "context_length_exceeded");
    e.param = endpoint == Endpoint::Chat ? "messages" : "prompt";
    return e;
  };
  if (endpoint == Endpoint::Chat) {
    if (!opt_.render_chat)
      return api_error(400, "this model has no chat template", "invalid_request_error");
    if (pr.chat_bytes > max_prompt_bytes_) return too_long(pr.chat_bytes, "bytes of text");
    if (!pr.chat.tools.is_null() && opt_.tool_format == ToolFormat::None) {
      ApiError e = api_error(400,
                             "this model's chat template has no tool-call format the server "
                             "reads; start it with --tool-parser NAME to name one",
                             "invalid_request_error");
      e.param = "tools";
      return e;
    }
    auto r = opt_.render_chat(pr.chat);
    if (!r) return api_error(400, r.error().message, "invalid_request_error");
    ids = std::move(r->ids);
    pr.output_options.starts_in_reasoning = r->starts_in_reasoning;
    pr.reasoning_done = r->reasoning_done;
  } else if (pr.prompt_is_ids) {
    ids = std::move(pr.prompt_ids);
    for (int32_t t : ids)
      if (t >= tok.vocab_size()) {
        ApiError e =
            api_error(400,
                      "prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                          std::to_string(tok.vocab_size()) + ")",
                      "invalid_request_error");
        e.param = "prompt";
        return e;
      }
  } else {
    if (int64_t(pr.prompt.size()) > max_prompt_bytes_)
      return too_long(int64_t(pr.prompt.size()), "bytes of text");
    ids = tok.encode(pr.prompt, /*add_bos=*/true, /*parse_special=*/true);
  }
  if (ids.empty()) {
    ApiError e = api_error(400, "the prompt is empty after tokenization", "invalid_request_error");
    e.param = endpoint == Endpoint::Chat ? "messages" : "prompt";
    return e;
  }
  if (int64_t(ids.size()) >= ctx) return too_long(int64_t(ids.size()), "tokens");
  return std::nullopt;
}

// Runs on the worker pool: everything CPU-heavy about a request before it
// is queued. The body is freed as soon as it is parsed; what the request
// keeps afterwards is its tokens (and its prompt text when echoed).
Prepared Server::prepare(Endpoint endpoint, std::string body) const {
  Prepared p;
  auto parsed = parse_request(endpoint, body, opt_.model_name, opt_.max_logprobs);
  std::string().swap(body);
  if (!parsed.request) {
    p.error = parsed.error;
    return p;
  }
  p.pr = std::move(*parsed.request);
  if (auto e = check_prompt(endpoint, p.pr, p.ids)) {
    p.error = std::move(e);
    return p;
  }
  if (auto e = setup_output(p.pr)) {
    p.error = std::move(e);
    return p;
  }
  if (p.pr.echo) {
    p.echo_ids = p.ids;
    p.echo_text = p.pr.prompt_is_ids ? engine_.tokenizer().decode(p.echo_ids) : p.pr.prompt;
  }
  std::string().swap(p.pr.prompt);
  p.pr.chat = ChatInput();
  std::vector<int32_t>().swap(p.pr.prompt_ids);
  std::string().swap(p.pr.user);
  return p;
}

// What a queued and running request holds, at most: its tokens (the
// engine's copies too), its echo, and the room its answer may take.
int64_t Server::held_bytes(const Prepared& p) const {
  const int64_t ctx = engine_.capacity().max_context;
  const int64_t n = int64_t(p.ids.size());
  int64_t gen = p.pr.prompt_only ? 0 : ctx - n;
  if (p.pr.max_tokens > 0) gen = std::min<int64_t>(gen, p.pr.max_tokens);
  const int64_t top = p.pr.logprobs ? std::max<int64_t>(p.pr.top_logprobs, 0) : -1;
  const int64_t per_token = 16 + (top >= 0 ? 64 + 48 * top : 0);
  int64_t bytes = 4096 + 12 * n + 4 * int64_t(p.echo_ids.size()) + int64_t(p.echo_text.size()) +
                  gen * per_token * std::max<int64_t>(p.pr.n, 1) + strings_bytes(p.pr.stop.stop);
  if (p.pr.echo && top >= 0) bytes += n * (48 + 48 * top);
  return bytes;
}

std::optional<ApiError> Server::admit(const Prepared& p, Reservation& held) {
  if (queued_.load() >= opt_.max_waiting)
    return api_error(429,
                     "the server has " + std::to_string(queued_.load()) +
                         " requests waiting, its limit; retry later",
                     "rate_limit_error", "queue_full");
  const int64_t n = int64_t(p.ids.size()) * std::max<int64_t>(p.pr.n, 1);
  if (queued_tokens_.load() + n > opt_.max_queued_tokens && queued_.load() > 0)
    return api_error(429,
                     "the server has " + std::to_string(queued_tokens_.load()) +
                         " prompt tokens waiting; this request's " + std::to_string(n) +
                         " would pass its limit of " + std::to_string(opt_.max_queued_tokens) +
                         "; retry later",
                     "rate_limit_error", "queue_full");
  const int64_t need = held_bytes(p);
  if (need > budget_.limit())
    return api_error(413,
                     "this request would hold " + std::to_string(need) +
                         " bytes (prompt, echo and the answer max_tokens allows), more than the "
                         "server's request memory of " +
                         std::to_string(budget_.limit()) + "; lower max_tokens",
                     "invalid_request_error", "request_too_large");
  if (!held.resize(need))
    return api_error(429,
                     "the server holds as many request bytes as it may (" +
                         std::to_string(budget_.limit()) + "); retry later",
                     "rate_limit_error", "memory_budget");
  return std::nullopt;
}

void Server::on_event(const std::shared_ptr<Generation>& gen, int32_t choice,
                      const RequestEvent& e) {
  // Engine thread: nothing may escape into the engine.
  const auto now = Clock::now();
  Generation::ChoiceClock& ck = gen->clocks[size_t(choice)];
  if (!ck.any_event) {
    ck.any_event = true;
    release_reserved(*gen);
    queued_.fetch_sub(1);
    queued_tokens_.fetch_sub(gen->queued_tokens);
  }
  if (e.token >= 0) {
    if (!ck.any_token) {
      if (choice == 0)
        metrics_.ttft.observe(std::chrono::duration<double>(now - gen->arrival).count());
    } else {
      metrics_.itl.observe(std::chrono::duration<double>(now - ck.last_token).count());
    }
    ck.any_token = true;
    ck.last_token = now;
  }
  if (e.finish != FinishReason::None) {
    metrics_.e2e.observe(std::chrono::duration<double>(now - gen->arrival).count());
    metrics_.count_finish(std::string(finish_reason_name(e.finish)));
    in_flight_.fetch_sub(1);
  }
  Event ev;
  try {
    ev.text.assign(e.text);
    ev.token = e.token;
    if (e.logprobs) {
      ev.has_logprobs = true;
      ev.logprobs = *e.logprobs;
    }
    if (e.prompt_logprobs)
      ev.prompt_logprobs = std::make_shared<PromptLogprobs>(*e.prompt_logprobs);
    ev.error.assign(e.error);
  } catch (const std::exception& x) {
    // Out of memory copying the event: the client learns the choice failed.
    ev = Event{};
    ev.error = std::string("the server could not copy this request's output: ") + x.what();
    ev.error_code = ErrorCode::kEngine;
    ev.finish = FinishReason::Error;
    if (e.finish == FinishReason::None) engine_.cancel(e.id);
  }
  if (ev.finish == FinishReason::None) ev.finish = e.finish;
  if (ev.error_code == ErrorCode::kNone) ev.error_code = e.error_code;
  ev.prompt_tokens = e.prompt_tokens;
  ev.completion_tokens = e.completion_tokens;
  ev.cached_tokens = e.cached_tokens;
  ev.choice = choice;
  if (ev.error_code == ErrorCode::kKvIntegrity)
    std::fprintf(stderr, "kvant serve: request %llu: %s\n", (unsigned long long)e.id,
                 ev.error.c_str());
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(gen->mu);
    was_empty = gen->events.empty();
    gen->events.push_back(std::move(ev));
  }
  if (was_empty) asio::post(gen->io, [gen] { gen->timer.cancel(); });
}

void Server::cancel(Generation& gen) {
  if (gen.cancelled || gen.finished) return;
  gen.cancelled = true;
  for (RequestId id : gen.ids) engine_.cancel(id);
  loop_.wake();
}

awaitable<void> Server::watch_disconnect(ConnPtr conn, std::shared_ptr<Generation> gen) {
  // Bytes the client sends meanwhile (a pipelined request, a stray CRLF)
  // stay in the connection's buffer for the next request.
  while (!gen->stop_watching && !gen->finished && conn->buf.size() < kMaxBuffered) {
    beast::error_code ec;
    const size_t n = co_await conn->stream.socket().async_read_some(
        conn->buf.prepare(4096), asio::redirect_error(use_awaitable, ec));
    conn->buf.commit(n);
    if (gen->stop_watching || gen->finished || ec == asio::error::operation_aborted) break;
    if (ec == asio::error::eof) {
      conn->peer_closed = true;  // a half-close; heartbeats find out whether it is more
      gen->timer.cancel();
      break;
    }
    if (ec) {
      gen->disconnected = true;
      cancel(*gen);
      break;
    }
  }
  gen->watching = false;
  gen->timer.cancel();
}

// Ends the watcher before the connection reads its next request.
awaitable<void> Server::stop_watching(ConnPtr conn, std::shared_ptr<Generation> gen) {
  gen->stop_watching = true;
  beast::error_code ec;
  conn->stream.socket().cancel(ec);
  while (gen->watching) {
    gen->timer.expires_at(Clock::time_point::max());
    co_await gen->timer.async_wait(asio::redirect_error(use_awaitable, ec));
  }
}

// Starts a chunked text/event-stream response; false when its header cannot be written.
awaitable<bool> Server::write_sse_head(ConnPtr conn, const Request& req) {
  http::response<http::empty_body> head{http::status::ok, req.version()};
  head.set(http::field::server, "kvant");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  Headers cors;
  cors_headers(req, cors);
  for (auto& [k, v] : cors) head.set(k, v);
  head.keep_alive(false);
  head.chunked(true);
  http::response_serializer<http::empty_body> sr(head);
  beast::error_code ec;
  conn->stream.expires_after(std::chrono::seconds(60));
  co_await http::async_write_header(conn->stream, sr, asio::redirect_error(use_awaitable, ec));
  conn->stream.expires_never();
  metrics_.count_http(200);
  co_return !ec;
}

awaitable<bool> Server::generate(ConnPtr conn, Request& req, Endpoint endpoint,
                                 Reservation body) {
  if (draining_)
    co_return co_await send_error(
        conn, req, api_error(503, "the server is shutting down", "server_error", "shutting_down"),
        false);
  if (loop_.failed())
    co_return co_await send_error(
        conn, req,
        api_error(503, "the engine failed; see /health", "server_error", "engine_failed"), false);
  if (queued_.load() >= opt_.max_waiting)
    co_return co_await send_error(conn, req,
                                  api_error(429,
                                            "the server has " + std::to_string(queued_.load()) +
                                                " requests waiting, its limit; retry later",
                                            "rate_limit_error", "queue_full"),
                                  true, header("Retry-After", "1"));
  if (!take_worker_slot())
    co_return co_await send_error(conn, req,
                                  api_error(503, "the server is busy; retry later", "server_error",
                                            "server_busy"),
                                  true, header("Retry-After", "1"));
  Prepared p;
  std::exception_ptr failure;
  // Named, not a temporary inside co_await (GCC 12 destroys such
  // temporaries twice).
  auto job = [this, endpoint, text = std::move(req.body())]() mutable {
    return prepare(endpoint, std::move(text));
  };
  try {
    p = co_await offload(std::move(job));
  } catch (...) {
    failure = std::current_exception();
  }
  give_worker_slot();
  body.reset();  // the body is gone (freed by the worker)
  if (failure) std::rethrow_exception(failure);
  if (p.error) co_return co_await send_error(conn, req, *p.error);
  Reservation held(&budget_);
  if (auto e = admit(p, held)) {
    Headers h;
    if (e->status == 429) h = header("Retry-After", "1");
    co_return co_await send_error(conn, req, *e, true, std::move(h));
  }
  std::string peer;
  if (auto e = disagg_peer(req, p, peer)) co_return co_await send_error(conn, req, *e);
  co_return co_await run_generation(conn, req, endpoint, std::move(p), std::move(held),
                                    std::move(peer));
}

// Queues a request, its K/V first pulled from the prefill server `peer`
// when one is named (disagg_serving.cpp). The engine's id, or, when the
// client was already answered (an error) or is gone, no id and what
// run_generation returns.
awaitable<Server::Submitted> Server::submit(ConnPtr conn, Request& req,
                                                         std::shared_ptr<Generation> gen,
                                                         kvant::Request er,
                                                         const std::string& peer) {
  // Disaggregated: the prompt runs on the prefill server `peer`, and its
  // K/V arrives here before the request is queued.
  std::shared_ptr<disagg::KvPull> pull;
  std::shared_ptr<KvHandoff> kv;
  if (!peer.empty()) {
    gen->watching = true;
    asio::co_spawn(io_, watch_disconnect(conn, gen), asio::detached);
    auto e = co_await pull_prompt(gen, er, peer, pull, kv);
    if (e || gen->disconnected) {
      release_reserved(*gen);
      co_await stop_watching(conn, gen);
      if (gen->disconnected) co_return Submitted{std::nullopt, false};
      co_return Submitted{std::nullopt, co_await send_error(conn, req, *e, false)};
    }
  }
  auto id = enqueue(*gen, std::move(er), std::move(kv));
  if (pull) pull->ack(id ? 0 : 1, id ? std::string() : id.error().message);
  if (!id) {
    if (pull) {
      kv_pulls_refused_.fetch_add(1);
      release_reserved(*gen);
      std::fprintf(stderr, "kvant serve: refused a handoff from %s: %s\n", peer.c_str(),
                   id.error().message.c_str());
      co_await stop_watching(conn, gen);
      const bool keep = co_await send_error(
          conn, req,
          api_error(502, "the prompt's K/V from the prefill server was refused: " +
                             id.error().message,
                    "server_error", "kv_integrity_error"),
          false);
      co_return Submitted{std::nullopt, keep};
    }
    const bool keep = co_await send_error(
        conn, req, api_error(400, id.error().message, "invalid_request_error"));
    co_return Submitted{std::nullopt, keep};
  }
  co_return Submitted{*id, false};
}

Result<RequestId> Server::enqueue(Generation& gen, kvant::Request er,
                                  std::shared_ptr<KvHandoff> kv) {
  queued_.fetch_add(1);
  in_flight_.fetch_add(1);
  queued_tokens_.fetch_add(gen.queued_tokens);
  auto id = kv ? engine_.submit_handoff(std::move(er), std::move(kv)) : engine_.submit(std::move(er));
  if (!id) {
    queued_.fetch_sub(1);
    in_flight_.fetch_sub(1);
    queued_tokens_.fetch_sub(gen.queued_tokens);
  }
  return id;
}

kvant::Request Server::choice_request(const std::shared_ptr<Generation>& gen,
                                      const ParsedRequest& pr, std::vector<int32_t> ids,
                                      int32_t i) {
  kvant::Request er = engine_request(pr, std::move(ids));
  er.sampling.seed = choice_seed(er.sampling.seed, i);
  // Each choice follows the grammar on its own; the compiled automaton and
  // its masks are shared.
  if (pr.constraint)
    if (auto c = pr.constraint->start()) er.constraint = std::shared_ptr<TokenConstraint>(std::move(*c));
  // Tool-call markers that are special tokens must reach the parser.
  if (pr.parse_output && pr.output_options.tools != ToolFormat::None) er.stop.skip_special_tokens = false;
  er.on_event = [this, gen, i](const RequestEvent& e) { on_event(gen, i, e); };
  return er;
}

namespace {

// The request's usage: the prompt once, every choice's completion tokens.
Usage total_usage(const std::vector<ChoiceState>& cs) {
  Usage u = cs[0].usage;
  u.completion_tokens = 0;
  for (const ChoiceState& c : cs) u.completion_tokens += c.usage.completion_tokens;
  return u;
}

std::vector<ChoiceResult> cs_results(const std::vector<ChoiceState>& cs) {
  std::vector<ChoiceResult> r;
  r.reserve(cs.size());
  for (const ChoiceState& c : cs) r.push_back(c.out);
  return r;
}

}  // namespace

awaitable<Result<RequestId>> Server::submit_pulled(std::shared_ptr<Generation> gen,
                                                   kvant::Request er, const std::string& peer) {
  std::shared_ptr<disagg::KvPull> pull;
  std::shared_ptr<KvHandoff> kv;
  if (auto e = co_await pull_prompt(gen, er, peer, pull, kv)) {
    release_reserved(*gen);
    co_return make_error(e->message);
  }
  auto id = enqueue(*gen, std::move(er), std::move(kv));
  if (pull) pull->ack(id ? 0 : 1, id ? std::string() : id.error().message);
  if (!id) {
    kv_pulls_refused_.fetch_add(1);
    release_reserved(*gen);
  }
  co_return id;
}

// Queues choices started..n-1 (their K/V pulled from the same prefill server
// as choice 0's, when there is one). One that fails, or that comes after the
// request was cancelled, gets an error event of its own.
awaitable<void> Server::start_choices(std::shared_ptr<Generation> gen, const ParsedRequest& pr,
                                      std::vector<int32_t>& prompt, int32_t& started,
                                      const std::string& peer) {
  for (; started < pr.n; ++started) {
    Result<RequestId> id = make_error("the request was cancelled");
    if (!gen->cancelled && peer.empty())
      id = enqueue(*gen, choice_request(gen, pr, prompt, started), nullptr);
    else if (!gen->cancelled)
      id = co_await submit_pulled(gen, choice_request(gen, pr, prompt, started), peer);
    if (id) {
      gen->ids.push_back(*id);
      continue;
    }
    Event ev;
    ev.finish = FinishReason::Error;
    ev.error = id.error().message;
    ev.error_code = ErrorCode::kEngine;
    ev.choice = started;
    std::lock_guard<std::mutex> lk(gen->mu);
    gen->events.push_back(std::move(ev));
  }
  std::vector<int32_t>().swap(prompt);
  loop_.wake();
}

// Submits a prepared request and answers it: streamed as SSE events or
// whole. With n > 1 choices, choice 0 is queued first and the others when
// its first event comes: its prompt's pages are then in the prefix cache,
// and they share them. On a decode server whose choice 0 pulled its K/V
// from a prefill server, the others pull theirs from it too (its prefix
// cache serves them), so every choice decodes from the same prompt K/V. The request ends with this coroutine whatever
// happens (unfinished choices are cancelled) and leaves the active table
// only after its last byte is written, which is what the drain waits for.
awaitable<bool> Server::run_generation(ConnPtr conn, Request& req, Endpoint endpoint, Prepared p,
                                       Reservation held, std::string peer) {
  const ParsedRequest& pr = p.pr;
  const Tokenizer& tok = engine_.tokenizer();
  const int32_t nc = std::max<int32_t>(pr.n, 1);
  auto gen = std::make_shared<Generation>(io_);
  gen->arrival = Clock::now();
  gen->queued_tokens = int64_t(p.ids.size());
  gen->clocks.resize(size_t(nc));
  std::vector<int32_t> prompt;  // kept for choices 1..n-1
  if (nc > 1) prompt = p.ids;
  const Submitted sub =
      co_await submit(conn, req, gen, choice_request(gen, pr, std::move(p.ids), 0), peer);
  if (!sub.id) co_return sub.keep;
  gen->ids.push_back(*sub.id);
  active_.insert(gen);
  loop_.wake();
  struct Release {
    Server* s;
    std::shared_ptr<Generation> g;
    ~Release() {
      s->cancel(*g);
      s->active_.erase(g);
    }
  } release{this, gen};
  if (!gen->watching) {
    gen->watching = true;
    asio::co_spawn(io_, watch_disconnect(conn, gen), asio::detached);
  }

  ResponseMeta meta{new_id(endpoint),
                    std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count(),
                    opt_.model_name};
  std::vector<ChoiceState> cs(static_cast<size_t>(nc));
  int32_t open = nc, started = 1;
  bool write_failed = false, echoed = false, early_head = false;
  auto last_write = Clock::now();
  auto fail_write = [&] {
    write_failed = true;
    gen->disconnected = true;
    cancel(*gen);
  };
  // Bytes as they are (stream: an already framed chunk; whole: body bytes
  // after an early head).
  auto write_bytes = [&](std::string data, bool chunk) -> awaitable<void> {
    if (write_failed) co_return;
    beast::error_code ec;
    conn->stream.expires_after(std::chrono::seconds(60));
    if (chunk)
      co_await asio::async_write(conn->stream, http::make_chunk(asio::buffer(data)),
                                 asio::redirect_error(use_awaitable, ec));
    else
      co_await asio::async_write(conn->stream, asio::buffer(data),
                                 asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    last_write = Clock::now();
    if (ec) fail_write();
  };
  if (pr.stream && !co_await write_sse_head(conn, req)) fail_write();

  while (open > 0) {
    std::deque<Event> batch;
    {
      std::lock_guard<std::mutex> lk(gen->mu);
      batch.swap(gen->events);
    }
    if (started < nc && (!batch.empty() || gen->cancelled)) {
      co_await start_choices(gen, pr, prompt, started, peer);
      if (batch.empty()) continue;
    }
    if (batch.empty()) {
      beast::error_code ec;
      if (conn->peer_closed && !write_failed) {
        if (Clock::now() - last_write >= kHeartbeat) {
          if (pr.stream) {
            co_await write_bytes(": keep-alive\n\n", true);
          } else {
            if (!early_head) {
              early_head = true;
              if (!co_await write_early_head(conn, req)) fail_write();
            }
            co_await write_bytes(" ", false);
          }
          continue;
        }
        gen->timer.expires_at(last_write + kHeartbeat);
      } else {
        gen->timer.expires_at(Clock::time_point::max());
      }
      co_await gen->timer.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    std::vector<std::deque<Event>> per(static_cast<size_t>(nc));
    for (Event& ev : batch) per[size_t(ev.choice)].push_back(std::move(ev));
    std::string out;
    for (int32_t i = 0; i < nc; ++i) {
      if (per[size_t(i)].empty()) continue;
      ChoiceState& c = cs[size_t(i)];
      std::string delta;
      std::vector<TokenLogprobText> delta_lps;
      if (pr.echo && !echoed) {
        // The prompt first (one choice only): its text, and its tokens'
        // logprobs (none for the first token and those before
        // prompt_logprobs_from, or when the request failed before its
        // prompt was computed).
        echoed = true;
        delta = std::move(p.echo_text);
        if (pr.logprobs) {
          std::shared_ptr<const PromptLogprobs> plp;
          for (const Event& ev : per[size_t(i)])
            if (ev.prompt_logprobs) plp = ev.prompt_logprobs;
          auto job = [&] { return echo_logprobs(tok, pr.tokens_as_ids, p.echo_ids, plp.get()); };
          delta_lps = co_await offload(std::move(job));
        }
      }
      c.finished = take_events(per[size_t(i)], pr, tok, delta, delta_lps, c.usage, c.out.finish,
                               c.out.error, c.out.error_code);
      if (c.finished) --open;
      if (pr.stream && pr.parse_output) {
        out += parsed_sse_events(meta, pr, i, c, delta, delta_lps);
      } else if (pr.stream) {
        if (!delta.empty() || !delta_lps.empty() || c.first_chunk || c.finished)
          out += sse_events(endpoint, meta, pr, i, c.first_chunk, delta, delta_lps, c.text_offset,
                            c.finished, c.out.finish, c.out.error, c.out.error_code);
        c.first_chunk = false;
      } else {
        c.out.text += delta;
        for (auto& t : delta_lps) c.out.logprobs.push_back(std::move(t));
      }
    }
    gen->finished = open == 0;
    if (pr.stream && gen->finished) out += sse_tail(endpoint, meta, pr, total_usage(cs));
    if (pr.stream && !write_failed && !out.empty()) co_await write_bytes(std::move(out), true);
  }
  co_await stop_watching(conn, gen);
  if (gen->disconnected || write_failed) co_return false;
  if (pr.stream) {
    beast::error_code ec;
    conn->stream.expires_after(std::chrono::seconds(60));
    co_await asio::async_write(conn->stream, http::make_chunk_last(),
                               asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    co_return false;
  }
  if (pr.parse_output) parse_choices(pr, cs);
  co_return co_await send_whole(conn, req, endpoint, meta, pr, cs, std::move(held), early_head);
}

// A non-streamed answer once every choice finished (after an early head,
// its body bytes only).
awaitable<bool> Server::send_whole(ConnPtr conn, Request& req, Endpoint endpoint,
                                   const ResponseMeta& meta, const ParsedRequest& pr,
                                   const std::vector<ChoiceState>& cs, Reservation held,
                                   bool early_head) {
  auto render = [&] {
    return dump_json(full_response(endpoint, meta, cs_results(cs), pr.logprobs, total_usage(cs)));
  };
  std::string out;
  if (pr.logprobs || pr.echo || cs.size() > 1)
    out = co_await offload(render);
  else
    out = render();
  held.reset();
  if (early_head) {
    beast::error_code ec;
    conn->stream.expires_after(std::chrono::seconds(60));
    co_await asio::async_write(conn->stream, asio::buffer(out),
                               asio::redirect_error(use_awaitable, ec));
    conn->stream.expires_never();
    co_return false;
  }
  co_return co_await send(conn, req, http::status::ok, std::move(out), "application/json", true);
}

// The status line and headers of a whole response, sent before its body is
// known (to a client that half-closed): no length, the body ends when the
// connection closes, and JSON whitespace keeps it alive until then.
awaitable<bool> Server::write_early_head(ConnPtr conn, const Request& req) {
  http::response<http::empty_body> head{http::status::ok, req.version()};
  head.set(http::field::server, "kvant");
  head.set(http::field::content_type, "application/json");
  Headers cors;
  cors_headers(req, cors);
  for (auto& [k, v] : cors) head.set(k, v);
  head.keep_alive(false);
  http::response_serializer<http::empty_body> sr(head);
  beast::error_code ec;
  conn->stream.expires_after(std::chrono::seconds(60));
  co_await http::async_write_header(conn->stream, sr, asio::redirect_error(use_awaitable, ec));
  conn->stream.expires_never();
  metrics_.count_http(200);
  co_return !ec;
}

}  // namespace kvant::server
