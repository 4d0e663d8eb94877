// The "mpi" communicator's factory, internal to dist/. The build links one
// of two definitions: mpi_communicator.cpp when CMake found MPI, and
// mpi_unavailable.cpp (an error saying so) when it did not, so no code asks
// at compile time which build it is in.
#pragma once

#include <memory>

#include "core/result.h"
#include "dist/communicator.h"

namespace kvant::dist {

Result<std::unique_ptr<Communicator>> make_mpi_communicator();

}  // namespace kvant::dist
