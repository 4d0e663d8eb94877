// The communicator factory, the launcher check and the one-rank ("local")
// communicator. Local operations are copies at most: the engine runs one
// code path whether or not it is distributed, and a single process pays
// nothing for it (no allocation, no system call).
#include "dist/communicator.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"
#include "dist/mpi/mpi_communicator.h"
#include "dist/nccl/nccl_communicator.h"

namespace kvant::dist {
namespace {

// memmove, not memcpy: a caller may hand the same buffer as input and
// output, which a one-rank gather or exchange leaves unchanged.
void copy_bytes(std::span<std::byte> to, std::span<const std::byte> from, size_t n) {
  if (n > 0 && to.data() != from.data()) std::memmove(to.data(), from.data(), n);
}

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "local"; }

  Result<void> all_reduce_sum(std::span<float>) override { return {}; }

  Result<void> all_gather(std::span<const std::byte> in, std::span<std::byte> out) override {
    KV_CHECK_EQ(out.size(), in.size());
    copy_bytes(out, in, in.size());
    return {};
  }

  Result<void> all_to_all_v(std::span<const std::byte> send, std::span<const size_t> send_counts,
                            std::span<std::byte> recv,
                            std::span<const size_t> recv_counts) override {
    KV_CHECK_EQ(send_counts.size(), size_t(1));
    KV_CHECK_EQ(recv_counts.size(), size_t(1));
    KV_CHECK_EQ(send_counts[0], recv_counts[0]);  // what MPI would truncate
    KV_CHECK_LE(send_counts[0], send.size());
    KV_CHECK_LE(recv_counts[0], recv.size());
    copy_bytes(recv, send, send_counts[0]);
    return {};
  }

  Result<void> broadcast(std::span<std::byte>, int root) override {
    KV_CHECK_EQ(root, 0);
    return {};
  }

  Result<void> barrier() override { return {}; }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }

  [[noreturn]] void abort(int code) override { std::exit(code); }

 private:
  double timeout_ = 0;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_communicator(std::string_view kind) {
  if (kind == "local") return std::unique_ptr<Communicator>(new LocalCommunicator());
  if (kind == "mpi") return make_mpi_communicator();
  if (kind == "nccl") return make_nccl_communicator();
  return make_error("unknown communicator '" + std::string(kind) + "' (known: local, mpi, nccl)");
}

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

}  // namespace kvant::dist
