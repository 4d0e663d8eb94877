// Moving a request's K/V from a prefill server to a decode server, behind an
// interface: the servers speak to KvPuller and KvPullServer, and TCP (Boost.
// Asio, tcp_transport.cpp) is the one implementation today; an RDMA or UCX
// one would implement the same two classes (the page bytes would then move
// by one-sided reads into the decode pool, and the messages stay these).
//
// One transfer, as both sides see it:
//   1. The decode server has room for the request's pages (it reserves them
//      first, so a full decode server pushes back before anything moves),
//      and asks a prefill server to run the prompt: pull().
//   2. Both sides exchange Hello on the connection first; a layout other
//      than one's own is refused by both, with both layouts in the message.
//   3. The prefill server's handler runs the prompt (Request::handoff) and
//      replies with the KvHandoff, a copy of the pages that is what travels.
//   4. The decode server verifies and imports it (Engine::submit_handoff)
//      and acknowledges (taken, or refused with the reason); the prefill
//      side drops its copy then, or when its lease runs out.
// Every wait has a time limit; a peer that goes away mid-transfer ends the
// transfer with an error on the other side, never a hang.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/result.h"
#include "engine/engine.h"
#include "engine/kv_handoff.h"

namespace kvant::disagg {

// What a server says about its KV pool to its peers (WireHello).
struct KvPeerInfo {
  std::string model;
  uint64_t layout_hash = 0;
  std::string layout;  // describe_layout(), for refusals
};

// The decode side's handle on one transfer.
class KvPull {
 public:
  virtual ~KvPull() = default;
  // After the handoff arrived: tells the prefill side it was taken (status
  // 0) or refused (the reason), and closes the transfer.
  virtual void ack(uint32_t status, const std::string& message) = 0;
  // Ends the transfer now (the client went away): the callback gets an
  // error if it has not run yet.
  virtual void cancel() = 0;
};

// Called once per pull, on a transport thread: the handoff, or why there
// is none (the peer is unreachable or refused, died, timed out, the bytes
// failed their checks, or the prefill side could not run the prompt).
using PullDone = std::function<void(Result<std::shared_ptr<KvHandoff>>)>;

class KvPuller {
 public:
  virtual ~KvPuller() = default;
  // Asks the prefill server at `peer` ("host:port") to run `request` (its
  // on_event is ignored) and send its K/V.
  virtual std::shared_ptr<KvPull> pull(const std::string& peer, uint64_t request_id,
                                       const Request& request, PullDone done) = 0;
  // Connects to `peer` and exchanges Hello only: the peer's description, or
  // the refusal (a layout other than this side's, naming both).
  virtual Result<KvPeerInfo> probe(const std::string& peer) = 0;
};

// The prefill side. The handler runs a pulled request and calls `reply`
// once, from any thread, with its handoff or an error; it returns what
// cancels the request (called when the decode side goes away first).
using PullReply = std::function<void(Result<std::shared_ptr<const KvHandoff>>)>;
using PullHandler = std::function<std::function<void()>(uint64_t request_id, Request request,
                                                         PullReply reply)>;

struct KvPullServerStats {
  int64_t connections = 0, refused_peers = 0;  // refused: layout differs, or a bad Hello
  int64_t pulls = 0, sent = 0, acked = 0, rejected = 0, failed = 0;
  int64_t leases_expired = 0;  // no Ack within the lease: the copy was dropped
  int64_t held = 0;            // copies waiting for their Ack
  int64_t bytes_sent = 0;
};

class KvPullServer {
 public:
  virtual ~KvPullServer() = default;
  virtual int port() const = 0;
  virtual KvPullServerStats stats() const = 0;
  virtual void stop() = 0;
};

struct TcpTransportOptions {
  double connect_timeout_seconds = 5;
  // A transfer's whole time on the decode side (the prompt's prefill on the
  // prefill server included) and a message's on the prefill side.
  double transfer_timeout_seconds = 600;
  double lease_seconds = 60;  // prefill side: how long a copy waits for its Ack
  // Debug only (fault tests): flip one byte of the Nth handoff's page bytes
  // before it is sent (1-based; 0 off), after its checksums were taken; and
  // pause for this long halfway through every handoff's bytes.
  int64_t debug_flip_handoff = 0;
  double debug_send_pause_seconds = 0;
};

std::unique_ptr<KvPuller> make_tcp_puller(KvPeerInfo self, TcpTransportOptions options);
// Listens on host:port (port 0: any) and serves pulls with `handler`.
Result<std::unique_ptr<KvPullServer>> make_tcp_pull_server(const std::string& host, int port,
                                                           KvPeerInfo self, PullHandler handler,
                                                           TcpTransportOptions options);

}  // namespace kvant::disagg
