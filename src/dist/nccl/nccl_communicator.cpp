// The "nccl" communicator: the ranks of an mpirun job, one GPU each, over
// NCCL. Buffers are device memory of this process's GPU (the CUDA backend's
// activations); every call is enqueued on the communicator's own stream and
// waited for before it returns, so the caller sees the same blocking
// contract as the other communicators.
//
// Start-up: MPI (the "mpi" communicator) starts the job; rank 0 makes
// NCCL's unique id and broadcasts it over MPI; each rank then joins a
// non-blocking NCCL communicator (ncclConfig_t::blocking = 0), so that every
// wait, including the join, is a loop this file controls and can bound
// (set_timeout) and abort (ncclCommAbort) instead of hanging in NCCL.
//
// all_reduce_sum keeps communicator.h's promise (rank-order sums, the same
// bits on every rank, for every size), which ncclAllReduce does not: its
// ring and tree algorithms add in an order that depends on the algorithm,
// the chunking and the protocol NCCL picks per size. Instead every rank
// gathers every rank's vector (ncclAllGather, into a scratch that grows to
// the largest size seen and is then reused) and adds them in rank order with
// a small kernel (ordered_sum.cu; its arithmetic in ordered_sum.h is tested
// on the CPU). That moves (N-1) vectors into each rank, against a ring's
// 2(N-1)/N: the price of determinism, small for the one-token hidden
// vectors of decode, which are latency-bound.
//
// all_to_all_v is one NCCL group of ncclSend/ncclRecv pairs (a rank's own
// piece is a device copy); broadcast is ncclBroadcast in place; barrier an
// all-reduce of one int.
//
// Waiting: after enqueueing, the stream is polled (cudaStreamQuery) with
// NCCL's asynchronous error checked between polls; the first 2 ms spin, then
// the thread yields, then sleeps 200 us (as the MPI communicator does). A
// collective past the deadline aborts the NCCL communicator and returns an
// error naming the call; abort() then ends every rank through MPI.
#include "dist/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "dist/mpi/mpi_communicator.h"
#include "dist/nccl/ordered_sum_launch.h"

namespace kvant::dist {
namespace {

using Clock = std::chrono::steady_clock;

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

class NcclCommunicator final : public Communicator {
 public:
  static Result<std::unique_ptr<Communicator>> create(std::unique_ptr<Communicator> boot);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }

  Result<void> all_reduce_sum(std::span<float> data) override;
  Result<void> all_gather(std::span<const std::byte> in, std::span<std::byte> out) override;
  Result<void> all_to_all_v(std::span<const std::byte> send, std::span<const size_t> send_counts,
                            std::span<std::byte> recv, std::span<const size_t> recv_counts) override;
  Result<void> broadcast(std::span<std::byte> data, int root) override;
  Result<void> barrier() override;

  void set_timeout(double seconds) override {
    timeout_ = seconds;
    boot_->set_timeout(seconds);
  }
  double timeout() const override { return timeout_; }
  [[noreturn]] void abort(int code) override;

 private:
  explicit NcclCommunicator(std::unique_ptr<Communicator> boot)
      : boot_(std::move(boot)), rank_(boot_->rank()), size_(boot_->size()) {}

  Error fail(const char* call, const char* fn, const std::string& what) const;
  Result<void> nccl(const char* call, const char* fn, ncclResult_t rc);
  Result<void> cuda(const char* call, const char* fn, cudaError_t rc);
  // Waits for NCCL to finish enqueueing (non-blocking communicators may
  // return ncclInProgress), then for the stream.
  Result<void> wait(const char* call);
  Result<void> grow_scratch(const char* call, size_t bytes);
  Result<void> usable(const char* call) const {
    if (!broken_) return {};
    return fail(call, "(none)", "the communicator failed earlier and cannot be used again");
  }

  std::unique_ptr<Communicator> boot_;  // MPI: bootstrap and abort()
  int rank_, size_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;  // all-reduce gather buffer, then barrier's int
  size_t scratch_bytes_ = 0;
  double timeout_ = 0;
  bool broken_ = false;
};

Error NcclCommunicator::fail(const char* call, const char* fn, const std::string& what) const {
  return make_error(std::string("communicator 'nccl', rank ") + std::to_string(rank_) + ": " +
                    call + ": " + fn + " failed: " + what);
}

Result<void> NcclCommunicator::nccl(const char* call, const char* fn, ncclResult_t rc) {
  if (rc == ncclSuccess || rc == ncclInProgress) return {};
  broken_ = true;
  std::string what = ncclGetErrorString(rc);
  if (comm_ != nullptr)
    if (const char* last = ncclGetLastError(comm_); last != nullptr && *last != '\0')
      what += std::string(" (") + last + ")";
  return fail(call, fn, what);
}

Result<void> NcclCommunicator::cuda(const char* call, const char* fn, cudaError_t rc) {
  if (rc == cudaSuccess) return {};
  broken_ = true;
  return fail(call, fn, cudaGetErrorString(rc));
}

Result<void> NcclCommunicator::wait(const char* call) {
  const auto t0 = Clock::now();
  auto waited = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto pause = [&] {
    const double s = waited();
    if (s < 2e-3) return;
    if (s < 20e-3) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  };
  auto expired = [&]() -> Result<void> {
    if (timeout_ > 0 && waited() > timeout_) {
      broken_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return fail(call, "wait",
                  "no completion after " + std::to_string(waited()) +
                      " s (a peer rank died or hangs; --dist-timeout)");
    }
    return {};
  };
  for (;;) {  // NCCL's own enqueueing (non-blocking communicator)
    ncclResult_t async = ncclSuccess;
    KV_TRY(nccl(call, "ncclCommGetAsyncError", ncclCommGetAsyncError(comm_, &async)));
    if (async == ncclSuccess) break;
    if (async != ncclInProgress) return nccl(call, "ncclCommGetAsyncError", async);
    KV_TRY(expired());
    pause();
  }
  for (;;) {  // the GPU's work
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return {};
    if (q != cudaErrorNotReady) return cuda(call, "cudaStreamQuery", q);
    ncclResult_t async = ncclSuccess;
    KV_TRY(nccl(call, "ncclCommGetAsyncError", ncclCommGetAsyncError(comm_, &async)));
    if (async != ncclSuccess && async != ncclInProgress)
      return nccl(call, "ncclCommGetAsyncError", async);
    KV_TRY(expired());
    pause();
  }
}

Result<std::unique_ptr<Communicator>> NcclCommunicator::create(std::unique_ptr<Communicator> boot) {
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(std::move(boot)));
  const char* call = "start";
  int devices = 0;
  KV_TRY(c->cuda(call, "cudaGetDeviceCount", cudaGetDeviceCount(&devices)));
  if (devices <= 0) return c->fail(call, "cudaGetDeviceCount", "no CUDA device");
  c->device_ = local_rank() % devices;
  KV_TRY(c->cuda(call, "cudaSetDevice", cudaSetDevice(c->device_)));
  KV_TRY(c->cuda(call, "cudaStreamCreateWithFlags",
                 cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking)));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (c->rank_ == 0) KV_TRY(c->nccl(call, "ncclGetUniqueId", ncclGetUniqueId(&id)));
  KV_TRY(c->boot_->broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  KV_TRY(c->nccl(call, "ncclCommInitRankConfig",
                 ncclCommInitRankConfig(&c->comm_, c->size_, id, c->rank_, &config)));
  KV_TRY(c->wait(call));
  KV_TRY(c->grow_scratch(call, sizeof(int)));
  return std::unique_ptr<Communicator>(std::move(c));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    if (broken_) {
      ncclCommAbort(comm_);
    } else {
      ncclCommFinalize(comm_);
      (void)wait("finalize");
      if (comm_ != nullptr) ncclCommDestroy(comm_);
    }
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Result<void> NcclCommunicator::grow_scratch(const char* call, size_t bytes) {
  if (bytes <= scratch_bytes_) return {};
  if (scratch_ != nullptr) {
    KV_TRY(cuda(call, "cudaStreamSynchronize", cudaStreamSynchronize(stream_)));
    cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  KV_TRY(cuda(call, "cudaMalloc", cudaMalloc(&scratch_, bytes)));
  scratch_bytes_ = bytes;
  return {};
}

Result<void> NcclCommunicator::all_reduce_sum(std::span<float> data) {
  const char* call = "all_reduce_sum";
  KV_TRY(usable(call));
  if (size_ == 1 || data.empty()) return {};
  const size_t n = data.size();
  KV_TRY(grow_scratch(call, size_t(size_) * n * sizeof(float)));
  auto* parts = static_cast<float*>(scratch_);
  KV_TRY(nccl(call, "ncclAllGather",
              ncclAllGather(data.data(), parts, n, ncclFloat32, comm_, stream_)));
  KV_TRY(cuda(call, "launch_ordered_sum",
              launch_ordered_sum(parts, size_, n, data.data(), stream_)));
  return wait(call);
}

Result<void> NcclCommunicator::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  const char* call = "all_gather";
  KV_TRY(usable(call));
  KV_CHECK(out.size() == in.size() * size_t(size_));
  if (in.empty()) return {};
  KV_TRY(nccl(call, "ncclAllGather",
              ncclAllGather(in.data(), out.data(), in.size(), ncclUint8, comm_, stream_)));
  return wait(call);
}

Result<void> NcclCommunicator::all_to_all_v(std::span<const std::byte> send,
                                            std::span<const size_t> send_counts,
                                            std::span<std::byte> recv,
                                            std::span<const size_t> recv_counts) {
  const char* call = "all_to_all_v";
  KV_TRY(usable(call));
  KV_CHECK(send_counts.size() == size_t(size_) && recv_counts.size() == size_t(size_));
  size_t so = 0, ro = 0;
  for (int r = 0; r < size_; ++r) {
    so += send_counts[size_t(r)];
    ro += recv_counts[size_t(r)];
  }
  KV_CHECK(so <= send.size() && ro <= recv.size());
  KV_TRY(nccl(call, "ncclGroupStart", ncclGroupStart()));
  so = ro = 0;
  Result<void> st;
  for (int r = 0; r < size_ && st.ok(); ++r) {
    const size_t sc = send_counts[size_t(r)], rc = recv_counts[size_t(r)];
    if (r == rank_) {
      KV_CHECK(sc == rc);
      if (sc > 0)
        st = cuda(call, "cudaMemcpyAsync",
                  cudaMemcpyAsync(recv.data() + ro, send.data() + so, sc, cudaMemcpyDeviceToDevice,
                                  stream_));
    } else {
      if (sc > 0)
        st = nccl(call, "ncclSend", ncclSend(send.data() + so, sc, ncclUint8, r, comm_, stream_));
      if (st.ok() && rc > 0)
        st = nccl(call, "ncclRecv", ncclRecv(recv.data() + ro, rc, ncclUint8, r, comm_, stream_));
    }
    so += sc;
    ro += rc;
  }
  KV_TRY(nccl(call, "ncclGroupEnd", ncclGroupEnd()));
  KV_TRY(st);
  return wait(call);
}

Result<void> NcclCommunicator::broadcast(std::span<std::byte> data, int root) {
  const char* call = "broadcast";
  KV_TRY(usable(call));
  KV_CHECK(root >= 0 && root < size_);
  if (data.empty()) return {};
  KV_TRY(nccl(call, "ncclBroadcast",
              ncclBroadcast(data.data(), data.data(), data.size(), ncclUint8, root, comm_,
                            stream_)));
  return wait(call);
}

Result<void> NcclCommunicator::barrier() {
  const char* call = "barrier";
  KV_TRY(usable(call));
  KV_TRY(nccl(call, "ncclAllReduce",
              ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_)));
  return wait(call);
}

void NcclCommunicator::abort(int code) {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  boot_->abort(code);
  std::abort();  // not reached: MPI's abort ends the process
}

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator() {
  auto boot = make_mpi_communicator();
  if (!boot) return make_error("communicator 'nccl' starts over MPI: " + boot.error().message);
  return NcclCommunicator::create(std::move(*boot));
}

}  // namespace kvant::dist
