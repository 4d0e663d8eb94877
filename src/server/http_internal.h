// The HTTP transport's internals, shared by http_server.cpp (connections,
// admission, routing, shutdown) and generate.cpp (completions: preparing a
// request on the worker pool, submitting it, streaming its answer, watching
// its client). Not a public header.
//
// Threads: the I/O thread owns every socket, every Connection and every
// Generation's connection-side fields. The worker pool parses, renders and
// tokenizes request bodies (Server::offload), so the I/O thread only moves
// bytes. The engine loop thread runs the request callbacks, which copy each
// event into the Generation's queue under its mutex and post a wake-up to
// the I/O thread. A session waits for events on a steady_timer that the
// posted handler cancels; it always looks at the queue before waiting, so a
// wake-up that arrives while it is busy writing is not lost.
#pragma once

// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
// clang-format on
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_set>

#include "server/admission.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/responses.h"
#include "server/server.h"

namespace kvant::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

// One event from the engine, copied off the engine thread.
struct Event {
  std::string text;
  int32_t token = -1;
  bool has_logprobs = false;
  StepLogprobs logprobs;
  std::shared_ptr<const PromptLogprobs> prompt_logprobs;  // with the first event, when asked
  FinishReason finish = FinishReason::None;
  std::string error;
  ErrorCode error_code = ErrorCode::kNone;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  int32_t choice = 0;  // which of the request's n choices
};

// One choice's answer as it is assembled on the I/O thread.
struct ChoiceState {
  ChoiceResult out;  // non-streamed: text and logprobs; always: the finish
  Usage usage;
  bool first_chunk = true, finished = false;
  int64_t text_offset = 0;
  // Chat output parsing (ParsedRequest::parse_output), streamed: the text
  // is split into reasoning, content and tool calls as it comes.
  std::optional<ChatOutputStream> parser;
  bool any_tool_call = false;
};

// Chat output parsing (output_serving.cpp): one batch's SSE events of a
// choice whose text is split into reasoning, content and tool calls as it
// streams (the finish becomes "tool_calls" when there were any), and the
// same for whole answers once every choice finished.
std::string parsed_sse_events(const ResponseMeta& meta, const ParsedRequest& pr, int32_t i,
                              ChoiceState& c, const std::string& delta,
                              const std::vector<TokenLogprobText>& delta_lps);
void parse_choices(const ParsedRequest& pr, std::vector<ChoiceState>& cs);

// A request between the engine thread and its connection.
struct Generation {
  explicit Generation(asio::io_context& io) : io(io), timer(io) {}
  asio::io_context& io;
  // The engine's ids of the choices submitted so far (I/O thread). Choice 0
  // goes first; the others follow once its prompt is in the prefix cache.
  std::vector<RequestId> ids;
  // Shared with the engine thread.
  std::mutex mu;
  std::deque<Event> events;
  // I/O thread only.
  asio::steady_timer timer;
  bool finished = false;      // the final event was taken from the queue
  bool disconnected = false;  // the client went away
  bool cancelled = false;
  bool watching = false;      // the disconnect watcher is running
  bool stop_watching = false;
  // Engine thread only (sized on the I/O thread before the first submit).
  struct ChoiceClock {
    Clock::time_point last_token;
    bool any_event = false, any_token = false;
  };
  Clock::time_point arrival;
  std::vector<ChoiceClock> clocks;  // one per choice
  // Each choice's prompt tokens, counted in Server::queued_tokens_ until its first event.
  int64_t queued_tokens = 0;
  // Pages reserved for its pull (disaggregated decode), released with its
  // first event or when the pull fails.
  std::atomic<int64_t> reserved_pages{0};
};

struct Connection {
  Connection(tcp::socket s, std::string addr) : stream(std::move(s)), address(std::move(addr)) {}
  beast::tcp_stream stream;
  beast::flat_buffer buf;
  std::string address;
  bool idle = true;         // waiting for a request's headers
  Clock::time_point idle_since = Clock::now();
  bool peer_closed = false;  // the client half-closed its side
  bool evicted = false;      // closed to make room under the connection limit
};
using ConnPtr = std::shared_ptr<Connection>;
using Request = http::request<http::string_body>;
using Parser = http::request_parser<http::string_body>;

// A prepared completion request: parsed, rendered, tokenized and checked
// (on the worker pool), or the error to answer.
struct Prepared {
  std::optional<ApiError> error;
  ParsedRequest pr;
  std::vector<int32_t> ids;
  std::vector<int32_t> echo_ids;
  std::string echo_text;
};

class Server {
 public:
  Server(Engine& engine, const ServerOptions& options);
  ~Server();
  int run();

 private:
  // http_server.cpp
  awaitable<void> accept_loop();
  void start_session(tcp::socket socket);
  awaitable<void> refuse(tcp::socket socket, ApiError e);
  awaitable<void> session(ConnPtr conn);
  awaitable<void> linger_close(ConnPtr conn);
  // Reads the body and answers one request; false: close the connection.
  awaitable<bool> serve_one(ConnPtr conn, Parser& parser);
  // Checks a request's headers before its body is read; the error, if any.
  std::optional<ApiError> check_headers(const Parser& parser, bool& is_preflight);
  awaitable<bool> handle(ConnPtr conn, Request& req, Reservation body);
  awaitable<bool> send(ConnPtr conn, const Request& req, http::status status, std::string body,
                       const char* content_type, bool keep_alive, Headers headers = {});
  awaitable<bool> send_error(ConnPtr conn, const Request& req, ApiError e, bool keep_alive = true,
                             Headers headers = {});
  awaitable<bool> tokenize(ConnPtr conn, Request& req, Reservation body);
  void evict_idle();
  void begin_shutdown();
  void arm_signals();
  awaitable<void> supervise();
  std::string health_body() const;
  void cors_headers(const Request& req, Headers& h) const;

  // generate.cpp
  awaitable<bool> generate(ConnPtr conn, Request& req, Endpoint endpoint, Reservation body);
  Prepared prepare(Endpoint endpoint, std::string body) const;
  std::optional<ApiError> check_prompt(Endpoint endpoint, ParsedRequest& pr,
                                       std::vector<int32_t>& ids) const;
  // Output parsing and the compiled constraint of a rendered request.
  std::optional<ApiError> setup_output(ParsedRequest& pr) const;
  Result<std::shared_ptr<grammar::CompiledConstraint>> compiled_constraint(
      const grammar::OutputSpec& spec) const;
  std::optional<ApiError> admit(const Prepared& p, Reservation& held);
  int64_t held_bytes(const Prepared& p) const;
  awaitable<bool> run_generation(ConnPtr conn, Request& req, Endpoint endpoint, Prepared p,
                                 Reservation held, std::string peer = {});
  struct Submitted {
    std::optional<RequestId> id;
    bool keep = false;  // with no id: keep the connection (run_generation's result)
  };
  awaitable<Submitted> submit(ConnPtr conn, Request& req, std::shared_ptr<Generation> gen,
                              kvant::Request er, const std::string& peer);
  // Pulls choice i > 0's prompt K/V from `peer` and queues it (no answer is
  // written: a failure becomes that choice's error).
  awaitable<Result<RequestId>> submit_pulled(std::shared_ptr<Generation> gen, kvant::Request er,
                                             const std::string& peer);
  awaitable<void> start_choices(std::shared_ptr<Generation> gen, const ParsedRequest& pr,
                                std::vector<int32_t>& prompt, int32_t& started,
                                const std::string& peer);
  // Queues one engine request of `gen` (counted as queued and in flight).
  Result<RequestId> enqueue(Generation& gen, kvant::Request er, std::shared_ptr<KvHandoff> kv);
  // The engine request of choice `i`, its events going to `gen`.
  kvant::Request choice_request(const std::shared_ptr<Generation>& gen, const ParsedRequest& pr,
                                std::vector<int32_t> ids, int32_t i);
  awaitable<bool> send_whole(ConnPtr conn, Request& req, Endpoint endpoint,
                             const ResponseMeta& meta, const ParsedRequest& pr,
                             const std::vector<ChoiceState>& cs, Reservation held,
                             bool early_head);
  awaitable<bool> write_sse_head(ConnPtr conn, const Request& req);
  awaitable<bool> write_early_head(ConnPtr conn, const Request& req);
  awaitable<void> watch_disconnect(ConnPtr conn, std::shared_ptr<Generation> gen);
  awaitable<void> stop_watching(ConnPtr conn, std::shared_ptr<Generation> gen);
  void on_event(const std::shared_ptr<Generation>& gen, int32_t choice, const RequestEvent& e);
  void cancel(Generation& gen);  // I/O thread: every choice
  std::string new_id(Endpoint endpoint);

  // disagg_serving.cpp: the prefill role's KV listener and the decode
  // role's puller (0, or the exit code when start-up must fail).
  int start_disagg();
  // Which prefill server a request names (X-Kvant-Prefill), checked; empty
  // when it runs here.
  std::optional<ApiError> disagg_peer(const Request& req, const Prepared& p, std::string& peer);
  // Reserves pages for the prompt, pulls its K/V from `peer`; the handoff,
  // or the error to answer.
  awaitable<std::optional<ApiError>> pull_prompt(std::shared_ptr<Generation> gen,
                                                 const kvant::Request& er, const std::string& peer,
                                                 std::shared_ptr<disagg::KvPull>& pull,
                                                 std::shared_ptr<KvHandoff>& kv);
  void release_reserved(Generation& gen);
  // Runs f() on the worker pool and resumes on the I/O thread with its
  // result (an exception from f is rethrown here). The worker hands the
  // result over by posting to the I/O context, so the coroutine never runs
  // on a worker thread.
  template <class F>
  awaitable<std::invoke_result_t<F>> offload(F f) {
    using R = std::invoke_result_t<F>;
    std::optional<R> result;
    std::exception_ptr error;
    asio::steady_timer done(io_, Clock::time_point::max());
    bool finished = false;
    asio::post(workers_, [&] {
      try {
        result.emplace(f());
      } catch (...) {
        error = std::current_exception();
      }
      asio::post(io_, [&] {
        finished = true;
        done.cancel();
      });
    });
    while (!finished) {
      beast::error_code ec;
      co_await done.async_wait(asio::redirect_error(use_awaitable, ec));
    }
    if (error) std::rethrow_exception(error);
    co_return std::move(*result);
  }
  // A worker-pool slot (false: the queue is full; answer 503).
  bool take_worker_slot();
  void give_worker_slot() { worker_jobs_.fetch_sub(1); }
  ServerGauges gauges() const;

  // Declared before io_: the coroutine frames io_ destroys at the end
  // release into these (reservations, the active table, the engine loop).
  Engine& engine_;
  ServerOptions opt_;
  Metrics metrics_;
  EngineLoop loop_;
  ByteBudget budget_;
  ConnectionLimits limits_;
  OriginPolicy origins_;
  int64_t max_prompt_bytes_ = 0;  // longest prompt text that could fit the context
  std::atomic<int64_t> queued_{0}, in_flight_{0}, queued_tokens_{0}, worker_jobs_{0};
  std::unordered_set<std::shared_ptr<Generation>> active_;  // I/O thread
  std::unordered_set<Connection*> conns_;                   // I/O thread
  int64_t responding_ = 0;  // requests read and not yet fully answered (I/O thread)
  bool draining_ = false;
  Clock::time_point drain_start_;
  bool drain_cancelled_ = false;
  int rc_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
  // Compiled output constraints by OutputSpec::cache_key (worker threads),
  // over one vocabulary index built on first use.
  mutable std::mutex constraints_mu_;
  mutable std::shared_ptr<const grammar::VocabIndex> vocab_index_;
  mutable std::deque<std::pair<std::string, std::shared_ptr<grammar::CompiledConstraint>>>
      constraints_;
  // At most this many grammars (each up to 16 MiB of automaton and 32 MiB
  // of masks) are kept.
  static constexpr size_t kMaxCachedConstraints = 32;
  asio::io_context io_{1};
  asio::thread_pool workers_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  // Disaggregation (after io_: gone before it, since their threads post to it).
  std::unique_ptr<disagg::KvPuller> puller_;
  std::unique_ptr<disagg::KvPullServer> kv_server_;
  std::atomic<int64_t> kv_pulls_{0}, kv_pulls_failed_{0}, kv_pulls_refused_{0}, kv_pull_bytes_{0};
  std::atomic<int64_t> reserved_pages_{0}, pulls_waiting_{0};
  std::atomic<uint64_t> pull_seq_{0};
};

}  // namespace kvant::server
