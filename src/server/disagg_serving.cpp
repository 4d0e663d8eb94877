// Disaggregated prefill and decode in the server (README: Disaggregated
// serving; the transfer itself is disagg/kv_transport.h).
//
// A prefill server (role "prefill") listens for KV transfer connections
// beside its HTTP port and runs each pulled request with Request::handoff:
// the engine computes the prompt, samples the first token and hands out a
// copy of the prompt's pages, which the transport sends and holds until the
// decode server's Ack (or the lease ends). The pool's own pages go back at
// the step the request finished (the prefix cache may keep them): the copy
// is what travels, so no transfer ever reads a page that was reused.
//
// A decode server (role "decode") serves a completion whose X-Kvant-Prefill
// header names one of its --prefill-peer addresses as follows: prepare and
// admit it as usual; reserve the pages its prompt will take (waiting while
// the pool cannot hold them: back-pressure before anything moves); pull the
// K/V; hand it to Engine::submit_handoff, which checks the layout hash and
// every page's checksum before anything is queued; Ack; then stream tokens
// as for any request. The reservation ends with the request's first event.
#include <cstdio>

#include "disagg/kv_wire.h"
#include "server/http_internal.h"

namespace kvant::server {

int Server::start_disagg() {
  if (opt_.role.empty()) return 0;
  disagg::KvPeerInfo self{opt_.model_name, engine_.kv_layout_hash(),
                          disagg::describe_layout(engine_.kv_layout())};
  if (opt_.role == "prefill") {
    disagg::PullHandler handler = [this](uint64_t, kvant::Request r, disagg::PullReply reply) {
      r.handoff = true;
      auto shared_reply = std::make_shared<disagg::PullReply>(std::move(reply));
      r.on_event = [shared_reply](const RequestEvent& e) {
        if (e.finish == FinishReason::None) return;
        if (e.handoff) {
          try {
            (*shared_reply)(std::shared_ptr<const KvHandoff>(std::make_shared<KvHandoff>(*e.handoff)));
          } catch (const std::exception& x) {
            (*shared_reply)(make_error(std::string("out of memory copying the handoff: ") + x.what()));
          }
        } else {
          (*shared_reply)(make_error(
              e.error.empty() ? "the prompt finished (" +
                                    std::string(finish_reason_name(e.finish)) + ") without K/V"
                              : std::string(e.error)));
        }
      };
      auto id = engine_.submit(std::move(r));
      if (!id) {
        (*shared_reply)(make_error(id.error().message));
        return std::function<void()>();
      }
      loop_.wake();
      const RequestId rid = *id;
      return std::function<void()>([this, rid] {
        engine_.cancel(rid);
        loop_.wake();
      });
    };
    auto srv = disagg::make_tcp_pull_server(opt_.host == "localhost" ? "127.0.0.1" : opt_.host,
                                            opt_.kv_port, self, std::move(handler),
                                            opt_.kv_transport);
    if (!srv) {
      std::fprintf(stderr, "kvant serve: %s\n", srv.error().message.c_str());
      return 1;
    }
    kv_server_ = std::move(*srv);
    std::fprintf(stderr, "kvant serve: prefill role, KV transfers on %s:%d (%s)\n",
                 opt_.host.c_str(), kv_server_->port(), self.layout.c_str());
    return 0;
  }
  if (opt_.role == "decode") {
    puller_ = disagg::make_tcp_puller(self, opt_.kv_transport);
    // Each peer's layout is checked now: a mismatch refuses to start; a
    // peer that is not up yet is checked again by every transfer's Hello.
    for (const std::string& peer : opt_.prefill_peers) {
      auto info = puller_->probe(peer);
      if (info) {
        std::fprintf(stderr, "kvant serve: decode role, prefill peer %s (%s) has this layout\n",
                     peer.c_str(), info->model.c_str());
        continue;
      }
      const std::string& why = info.error().message;
      if (why.find("layout differs") != std::string::npos ||
          why.find("server too") != std::string::npos) {
        std::fprintf(stderr, "kvant serve: refusing prefill peer %s: %s\n", peer.c_str(),
                     why.c_str());
        return 1;
      }
      std::fprintf(stderr, "kvant serve: prefill peer %s not reachable yet (%s)\n", peer.c_str(),
                   why.c_str());
    }
    return 0;
  }
  std::fprintf(stderr, "kvant serve: unknown role '%s' (prefill or decode)\n", opt_.role.c_str());
  return 2;
}

std::optional<ApiError> Server::disagg_peer(const Request& req, const Prepared& p,
                                            std::string& peer) {
  peer.clear();
  auto it = req.find("X-Kvant-Prefill");
  if (it == req.end()) return std::nullopt;
  const std::string named(it->value());
  if (opt_.role != "decode")
    return api_error(400,
                     "X-Kvant-Prefill names a prefill server, but this server is not a decode "
                     "server (kvant serve --role decode)",
                     "invalid_request_error");
  bool known = false;
  for (const auto& a : opt_.prefill_peers) known |= a == named;
  if (!known)
    return api_error(400,
                     "X-Kvant-Prefill: '" + named +
                         "' is not one of this server's --prefill-peer addresses",
                     "invalid_request_error");
  // What a handoff cannot carry runs here instead: a request that ends with
  // its first token or before (max_tokens 0 or 1), the prompt's own
  // log-probabilities (echo with logprobs), and an output constraint (the
  // prefill side would draw the first token without it).
  if (p.pr.prompt_only || p.pr.max_tokens == 1 || (p.pr.echo && p.pr.logprobs) || p.pr.constraint)
    return std::nullopt;
  peer = named;
  return std::nullopt;
}

void Server::release_reserved(Generation& gen) {
  const int64_t n = gen.reserved_pages.exchange(0);
  if (n) reserved_pages_.fetch_sub(n);
}

awaitable<std::optional<ApiError>> Server::pull_prompt(std::shared_ptr<Generation> gen,
                                                       const kvant::Request& er,
                                                       const std::string& peer,
                                                       std::shared_ptr<disagg::KvPull>& pull,
                                                       std::shared_ptr<KvHandoff>& kv) {
  const KvCapacity& cap = engine_.capacity();
  const int64_t need = (int64_t(er.prompt.size()) + cap.page_tokens - 1) / cap.page_tokens + 1;
  if (need > cap.pages)
    co_return api_error(400,
                        "the prompt needs " + std::to_string(need) +
                            " KV pages; this decode server holds " + std::to_string(cap.pages),
                        "invalid_request_error", "context_length_exceeded");
  // Reserve the pages first: wait while the pages in use, those reserved
  // for other pulls and these would not fit (back-pressure).
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(
                                              opt_.kv_transport.transfer_timeout_seconds));
  bool waiting = false;
  for (;;) {
    const EngineStats s = metrics_.engine();
    const int64_t in_use = std::max<int64_t>(0, s.kv_pages_used - s.kv_pages_cached);
    int64_t r = reserved_pages_.load();
    if (in_use + r + need <= cap.pages || (in_use == 0 && r == 0)) {
      if (reserved_pages_.compare_exchange_strong(r, r + need)) break;
      continue;
    }
    if (!waiting) pulls_waiting_.fetch_add(1);
    waiting = true;
    if (gen->disconnected || Clock::now() > give_up) {
      pulls_waiting_.fetch_sub(1);
      co_return api_error(503, "the decode server had no room for this prompt's K/V in time",
                          "server_error", "kv_full");
    }
    gen->timer.expires_after(std::chrono::milliseconds(5));
    beast::error_code ec;
    co_await gen->timer.async_wait(asio::redirect_error(use_awaitable, ec));
  }
  if (waiting) pulls_waiting_.fetch_sub(1);
  gen->reserved_pages.fetch_add(need);  // several choices may each pull

  struct Outcome {
    std::optional<Result<std::shared_ptr<KvHandoff>>> result;
  };
  auto out = std::make_shared<Outcome>();
  auto* io = &io_;
  pull = puller_->pull(peer, pull_seq_.fetch_add(1) + 1, er,
                       [out, gen, io](Result<std::shared_ptr<KvHandoff>> r) {
                         asio::post(*io, [out, gen, r = std::move(r)]() mutable {
                           out->result = std::move(r);
                           gen->timer.cancel();
                         });
                       });
  bool cancelled = false;
  while (!out->result) {
    if (gen->disconnected && !cancelled) {
      cancelled = true;
      pull->cancel();
    }
    gen->timer.expires_at(Clock::time_point::max());
    beast::error_code ec;
    co_await gen->timer.async_wait(asio::redirect_error(use_awaitable, ec));
  }
  if (!*out->result) {
    kv_pulls_failed_.fetch_add(1);
    pull.reset();
    const std::string& why = out->result->error().message;
    std::fprintf(stderr, "kvant serve: pull from %s failed: %s\n", peer.c_str(), why.c_str());
    const bool corrupt = why.find("checksum") != std::string::npos;
    co_return api_error(502, "the prefill server " + peer + " did not deliver the prompt's K/V: " + why,
                        "server_error", corrupt ? "kv_integrity_error" : "kv_transfer_failed");
  }
  kv = std::move(**out->result);
  kv_pulls_.fetch_add(1);
  kv_pull_bytes_.fetch_add(int64_t(kv->data.size()));
  co_return std::nullopt;
}

}  // namespace kvant::server
