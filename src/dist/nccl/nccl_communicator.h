// The "nccl" communicator's factory, internal to dist/. The build links
// nccl_communicator.cpp with -DKVANT_CUDA=ON and nccl_unavailable.cpp (an
// error saying so) otherwise.
#pragma once

#include <memory>

#include "core/result.h"
#include "dist/communicator.h"

namespace kvant::dist {

// Every rank of an mpirun job calls it at the same point: MPI starts the
// job and carries NCCL's bootstrap id from rank 0; then NCCL does the rest.
// The GPU is the process's local rank (OMPI_COMM_WORLD_LOCAL_RANK, else
// MPI_LOCALRANKID or SLURM_LOCALID) modulo the devices it sees.
Result<std::unique_ptr<Communicator>> make_nccl_communicator();

}  // namespace kvant::dist
