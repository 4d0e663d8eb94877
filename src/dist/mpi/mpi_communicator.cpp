// The "mpi" communicator: the processes of MPI_COMM_WORLD, over a duplicate
// of it (so that kvant's messages never match another library's), through
// MPI's C API.
//
// Errors: the duplicate's error handler is MPI_ERRORS_RETURN, so a failed
// call returns its code instead of aborting inside MPI, and each operation
// turns a code other than MPI_SUCCESS into a kvant Error naming the
// operation, the MPI function, this rank and MPI_Error_string's text. (The
// one call before that, MPI_Comm_dup, runs under MPI_COMM_WORLD's handler,
// which kvant leaves as it finds it: by default MPI aborts the job with its
// own message.)
//
// all_reduce_sum, up to kGatherSumBytes gathered (every rank's vector
// together), is one MPI_Allgather after which each rank adds the
// contributions in rank order itself: one latency, which is what a decode
// step's all-reduces of a few KiB cost. Larger ones are a reduce-scatter then
// an all-gather, written out with MPI_Alltoallv and MPI_Allgatherv rather
// than MPI_Allreduce:
//  1. the elements are cut into size() chunks; rank r owns chunk r and
//     receives every rank's contribution to it (MPI_Alltoallv), in rank
//     order, into its scratch;
//  2. it sums them in rank order, x_0 + x_1 + ... + x_{N-1}, one element at
//     a time (the compiler does not reassociate float additions without
//     -ffast-math, which kvant does not use);
//  3. every rank receives every chunk's sum verbatim (MPI_Allgatherv).
// So each element has one order of additions, fixed by rank order alone,
// and every rank holds the owner's bits. MPI_Allreduce gives neither: Open
// MPI picks its algorithm (recursive doubling, ring, Rabenseifner, ...) by
// message size and rank count, each adds in its own order (a ring's order
// even differs from chunk to chunk), and a non-commutative user operation
// still allows MPI to regroup the additions. The cost is the ring's: each
// rank sends and receives (N-1)/N of the vector in each of the two phases.
//
// Waiting: every collective is MPI's non-blocking form (MPI_Ialltoallv,
// MPI_Ibcast, ...) completed by a loop of MPI_Test that spins for the first
// 2 ms, then yields the core until 20 ms, then sleeps 200 us between tests.
// A decode step's collectives (tens of microseconds, plus whatever the
// ranks' arrival times differ by) complete while spinning: MPI's
// non-blocking collectives advance one round per MPI_Test, so a sleep
// between rounds would add its length to every round; a rank waiting
// long (a follower waiting for rank 0's next step while the server is
// idle) costs next to no CPU instead of MPI's busy poll, which on a small
// machine would take a core from the ranks that compute. The loop also
// gives a deadline (set_timeout): a collective a peer never joins (it died,
// or hangs) fails with a message naming the call and the wait, instead of
// waiting for ever.
#include "dist/mpi/mpi_communicator.h"

#include <mpi.h>

#include <sched.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"

namespace kvant::dist {
namespace {

// MPI starts once per process and cannot start again after MPI_Finalize.
// The runtime is shared by every "mpi" communicator alive; the last one to
// go finalises it, if kvant was the one that initialised it (a host program
// that initialised MPI itself keeps it).
class MpiRuntime {
 public:
  static Result<std::shared_ptr<MpiRuntime>> acquire();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  ~MpiRuntime() {
    if (owns_) MPI_Finalize();
  }

 private:
  MpiRuntime() = default;
  bool owns_ = false;
};

std::string mpi_message(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, size_t(len)) + " (MPI error " + std::to_string(rc) + ")";
}

Result<std::shared_ptr<MpiRuntime>> MpiRuntime::acquire() {
  static std::mutex mu;
  static std::weak_ptr<MpiRuntime> current;
  std::lock_guard lock(mu);
  if (auto rt = current.lock()) return rt;
  int finalized = 0, initialized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    return make_error(
        "communicator 'mpi': MPI was finalised in this process and cannot start again "
        "(keep one communicator for the life of the process)");
  MPI_Initialized(&initialized);
  std::shared_ptr<MpiRuntime> rt(new MpiRuntime());
  int provided = 0;
  if (!initialized) {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
      return make_error("communicator 'mpi': MPI_Init_thread failed: " + mpi_message(rc));
    rt->owns_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  // One thread at a time calls MPI, but not always the one that started it
  // (the server steps its engine on a thread of its own): MPI_THREAD_SERIALIZED.
  if (provided < MPI_THREAD_SERIALIZED)
    return make_error("communicator 'mpi': this MPI provides thread level " +
                      std::to_string(provided) + ", below MPI_THREAD_SERIALIZED");
  current = rt;
  return rt;
}

// Gathered bytes (size() x the vector) below which all_reduce_sum gathers
// and sums locally: measured on 2 ranks of one host (docs/BENCHMARKS.md),
// one round beats two up to about this size.
constexpr size_t kGatherSumBytes = size_t(64) << 10;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm, int rank, int size)
      : runtime_(std::move(runtime)),
        comm_(comm),
        rank_(rank),
        size_(size),
        send_counts_(size_t(size)),
        send_displs_(size_t(size)),
        recv_counts_(size_t(size)),
        recv_displs_(size_t(size)) {}
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  // Frees the duplicate before the runtime (a member, released after the
  // body) may finalise MPI.
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  Result<void> all_reduce_sum(std::span<float> data) override;
  Result<void> all_gather(std::span<const std::byte> in, std::span<std::byte> out) override;
  Result<void> all_to_all_v(std::span<const std::byte> send, std::span<const size_t> send_counts,
                            std::span<std::byte> recv,
                            std::span<const size_t> recv_counts) override;
  Result<void> broadcast(std::span<std::byte> data, int root) override;
  Result<void> barrier() override;

  void set_timeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::abort();  // MPI_Abort does not return; this is for the compiler
  }

 private:
  // An Error for a failed MPI call, or nothing for MPI_SUCCESS.
  Result<void> check(int rc, const char* op, const char* call) const {
    if (rc == MPI_SUCCESS) return {};
    return make_error("communicator 'mpi', rank " + std::to_string(rank_) + " of " +
                      std::to_string(size_) + ": " + op + ": " + call +
                      " failed: " + mpi_message(rc));
  }
  // Starts nothing: completes `req` (started by a non-blocking call whose
  // return code is rc) by the spin / yield / sleep loop above, within the
  // timeout. A timed-out request is left pending: the caller reports and
  // aborts, which is all a rank can do with a collective its peers never
  // finished.
  Result<void> wait(int rc, MPI_Request& req, const char* op, const char* call) const {
    KV_TRY(check(rc, op, call));
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (;;) {
      int done = 0;
      KV_TRY(check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), op, "MPI_Test"));
      if (done) return {};
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (timeout_ > 0 && waited > timeout_)
        return make_error("communicator 'mpi', rank " + std::to_string(rank_) + " of " +
                          std::to_string(size_) + ": " + op + ": " + call +
                          " did not complete within " + std::to_string(int(timeout_)) +
                          " s: a peer rank has died or hangs");
      if (waited < 2e-3) continue;
      if (waited < 20e-3)
        sched_yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // MPI counts and displacements are ints: a larger message is an error
  // here (naming it), not a silent truncation inside MPI.
  Result<void> too_large(const char* op, size_t n, const char* unit) const {
    return make_error("communicator 'mpi', rank " + std::to_string(rank_) + ": " + op + ": " +
                      std::to_string(n) + " " + unit + " pass MPI's int counts; split the call");
  }

  std::shared_ptr<MpiRuntime> runtime_;
  double timeout_ = 0;  // seconds; 0: wait for ever
  MPI_Comm comm_;
  int rank_, size_;
  // Per-rank counts and displacements for the v-collectives, sized once.
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  // The contributions to this rank's chunk of an all-reduce; grows to the
  // largest call seen.
  std::vector<float> scratch_;
};

Result<void> MpiCommunicator::all_reduce_sum(std::span<float> data) {
  const size_t n = data.size();
  if (n == 0 || size_ == 1) return {};
  const size_t N = size_t(size_);
  if (n + N > size_t(INT_MAX)) return too_large("all_reduce_sum", n, "floats");
  if (n * N * sizeof(float) <= kGatherSumBytes) {
    // Small (a decode step's hidden vectors): one round instead of two.
    // Every rank gathers every contribution and adds them in rank order
    // itself, so the bits are the same everywhere, as in the two-phase form.
    // (MPI_Ialltoallv with the whole vector to every rank: Open MPI's
    // MPI_Iallgather took milliseconds for a few KiB over TCP.)
    if (scratch_.size() < N * n) scratch_.resize(N * n);
    for (size_t r = 0; r < N; ++r) {
      send_displs_[r] = 0;
      send_counts_[r] = int(n);
      recv_counts_[r] = int(n);
      recv_displs_[r] = int(r * n);
    }
    MPI_Request req;
    KV_TRY(wait(MPI_Ialltoallv(data.data(), send_counts_.data(), send_displs_.data(), MPI_FLOAT,
                               scratch_.data(), recv_counts_.data(), recv_displs_.data(), MPI_FLOAT,
                               comm_, &req),
                req, "all_reduce_sum", "MPI_Ialltoallv"));
    const float* x = scratch_.data();
    float* out = data.data();
    for (size_t i = 0; i < n; ++i) out[i] = x[i];
    for (size_t r = 1; r < N; ++r) {
      const float* xr = x + r * n;
      for (size_t i = 0; i < n; ++i) out[i] += xr[i];
    }
    return {};
  }
  // Chunk r is [n*r/N, n*(r+1)/N): sizes differ by one at most.
  auto chunk_begin = [&](size_t r) { return int(n * r / N); };
  const int mine = chunk_begin(size_t(rank_) + 1) - chunk_begin(size_t(rank_));
  for (size_t r = 0; r < N; ++r) {
    send_displs_[r] = chunk_begin(r);
    send_counts_[r] = chunk_begin(r + 1) - chunk_begin(r);
    recv_counts_[r] = mine;
    recv_displs_[r] = int(r) * mine;
  }
  if (scratch_.size() < N * size_t(mine)) scratch_.resize(N * size_t(mine));
  MPI_Request req;
  KV_TRY(wait(
      MPI_Ialltoallv(data.data(), send_counts_.data(), send_displs_.data(), MPI_FLOAT,
                     scratch_.data(), recv_counts_.data(), recv_displs_.data(), MPI_FLOAT, comm_,
                     &req),
      req, "all_reduce_sum", "MPI_Ialltoallv"));
  float* out = data.data() + chunk_begin(size_t(rank_));
  const float* x = scratch_.data();
  for (int i = 0; i < mine; ++i) out[i] = x[i];
  for (size_t s = 1; s < N; ++s) {
    const float* xs = x + s * size_t(mine);
    for (int i = 0; i < mine; ++i) out[i] += xs[i];
  }
  // Chunk r's sum, from its owner, to everyone: counts and displacements
  // are the chunks', as sent above.
  return wait(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(),
                              send_counts_.data(), send_displs_.data(), MPI_FLOAT, comm_, &req),
              req, "all_reduce_sum", "MPI_Iallgatherv");
}

Result<void> MpiCommunicator::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  KV_CHECK_EQ(out.size(), in.size() * size_t(size_));
  if (in.empty()) return {};
  if (out.size() > size_t(INT_MAX)) return too_large("all_gather", out.size(), "bytes");
  const int n = int(in.size());
  MPI_Request req;
  return wait(MPI_Iallgather(in.data(), n, MPI_BYTE, out.data(), n, MPI_BYTE, comm_, &req), req,
              "all_gather", "MPI_Iallgather");
}

Result<void> MpiCommunicator::all_to_all_v(std::span<const std::byte> send,
                                           std::span<const size_t> send_counts,
                                           std::span<std::byte> recv,
                                           std::span<const size_t> recv_counts) {
  KV_CHECK_EQ(send_counts.size(), size_t(size_));
  KV_CHECK_EQ(recv_counts.size(), size_t(size_));
  size_t send_at = 0, recv_at = 0;
  for (size_t r = 0; r < size_t(size_); ++r) {
    if (send_at + send_counts[r] > size_t(INT_MAX))
      return too_large("all_to_all_v", send_at + send_counts[r], "bytes to send");
    if (recv_at + recv_counts[r] > size_t(INT_MAX))
      return too_large("all_to_all_v", recv_at + recv_counts[r], "bytes to receive");
    send_displs_[r] = int(send_at);
    send_counts_[r] = int(send_counts[r]);
    recv_displs_[r] = int(recv_at);
    recv_counts_[r] = int(recv_counts[r]);
    send_at += send_counts[r];
    recv_at += recv_counts[r];
  }
  KV_CHECK_LE(send_at, send.size());
  KV_CHECK_LE(recv_at, recv.size());
  MPI_Request req;
  return wait(
      MPI_Ialltoallv(send.data(), send_counts_.data(), send_displs_.data(), MPI_BYTE, recv.data(),
                     recv_counts_.data(), recv_displs_.data(), MPI_BYTE, comm_, &req),
      req, "all_to_all_v", "MPI_Ialltoallv");
}

Result<void> MpiCommunicator::broadcast(std::span<std::byte> data, int root) {
  KV_CHECK_GE(root, 0);
  KV_CHECK_LT(root, size_);
  if (data.empty()) return {};
  if (data.size() > size_t(INT_MAX)) return too_large("broadcast", data.size(), "bytes");
  MPI_Request req;
  return wait(MPI_Ibcast(data.data(), int(data.size()), MPI_BYTE, root, comm_, &req), req,
              "broadcast", "MPI_Ibcast");
}

Result<void> MpiCommunicator::barrier() {
  MPI_Request req;
  return wait(MPI_Ibarrier(comm_, &req), req, "barrier", "MPI_Ibarrier");
}

}  // namespace

Result<std::unique_ptr<Communicator>> make_mpi_communicator() {
  auto runtime = MpiRuntime::acquire();
  if (!runtime) return runtime.error();
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS)
    return make_error("communicator 'mpi': MPI_Comm_dup failed: " + mpi_message(rc));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(std::move(runtime.value()), comm, rank, size));
}

bool built_with_mpi() { return true; }

}  // namespace kvant::dist
