// Communication between the processes that serve one model together (tensor
// and expert parallelism): the few collectives the forward pass needs,
// behind one interface, so that the model and engine are written once over
// it and the transport (Open MPI first; NCCL later) is a choice made at
// start-up.
//
// Contracts every communicator keeps (tests/dist/communicator_test.cpp
// checks them on 1, 2 and 3 ranks):
//  - Every rank calls the same collectives in the same order with the same
//    sizes (counts in all_to_all_v match pairwise). A mismatch is a bug:
//    checked where one rank can see it (KV_CHECK), undefined where not.
//  - all_reduce_sum is deterministic: element i of the result is
//    ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{N-1}[i], summed in rank order,
//    the same bits on every rank, in every run, for every message size.
//    Logits then do not depend on how a run was launched beyond its rank
//    count, and a scalar loop is its reference.
//  - Buffers of one call do not overlap each other (except where a call
//    works in place on one buffer).
//  - One thread at a time calls a communicator (MPI is initialised
//    MPI_THREAD_SERIALIZED: the server steps its engine on a thread other
//    than the one that created it).
//  - A call returns an error when the transport fails (naming the call,
//    the MPI function, this rank and the library's own message). The
//    communicator is then unusable and the peers are probably blocked in
//    the same collective: report the error, then abort() ends every rank.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "core/result.h"

namespace kvant::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "local", "mpi", "nccl"

  // In place: every rank passes its contribution, of the same length, and
  // gets the sum in rank order (above). Once it has seen a length, a call of
  // that length or less allocates nothing.
  virtual Result<void> all_reduce_sum(std::span<float> data) = 0;

  // Every rank contributes `in` (the same length on all ranks); `out`, of
  // size() * in.size() bytes, receives rank 0's piece, then rank 1's, ...
  virtual Result<void> all_gather(std::span<const std::byte> in, std::span<std::byte> out) = 0;

  // Personalised exchange: send_counts[r] bytes go to rank r, taken from
  // `send` back to back in rank order (rank r's bytes start at the sum of
  // send_counts[0..r)); recv_counts[r] bytes arrive from rank r, placed in
  // `recv` the same way. send_counts[r] on this rank equals recv_counts[me]
  // on rank r. Counts may be zero, and uneven.
  virtual Result<void> all_to_all_v(std::span<const std::byte> send,
                                    std::span<const size_t> send_counts, std::span<std::byte> recv,
                                    std::span<const size_t> recv_counts) = 0;

  // Root's bytes replace every other rank's (the same length on all ranks).
  virtual Result<void> broadcast(std::span<std::byte> data, int root) = 0;

  virtual Result<void> barrier() = 0;

  // A collective that has not completed this many seconds after it began
  // fails (the error names the call): a peer that died or hangs ends in a
  // message, not a wait for ever. 0 (the default): no limit. Local: never
  // waits, so the limit is kept and has nothing to bound.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;

  // Ends every rank of the job with `code` (MPI_Abort for MPI): what a rank
  // does after an error, since its peers would otherwise wait in their next
  // collective for ever.
  [[noreturn]] virtual void abort(int code) = 0;
};

// "local": one rank, every operation a copy or nothing, no allocation.
// "mpi": the processes mpirun started (MPI_COMM_WORLD), when this build has
// MPI; the first "mpi" communicator of the process initialises MPI and the
// last one to go finalises it, after which MPI cannot start again in this
// process (an error, not a crash).
// "nccl": the same processes, one GPU each (-DKVANT_CUDA=ON builds only;
// dist/nccl/nccl_communicator.cpp): buffers are device memory, MPI starts
// the job and carries NCCL's bootstrap id, and abort() ends the job
// through MPI.
Result<std::unique_ptr<Communicator>> make_communicator(std::string_view kind);

// Whether this build has the "mpi" communicator.
bool built_with_mpi();

// Whether an MPI launcher started this process (Open MPI's mpirun sets
// OMPI_COMM_WORLD_SIZE, MPICH's and Slurm's PMI launchers PMI_SIZE, PMIx
// launchers PMIX_RANK): callers pick "mpi" then and "local" otherwise.
bool launched_by_mpirun();

}  // namespace kvant::dist
