// The "mpi" communicator in a build without MPI: an error that says how to
// get one. CMake compiles this file instead of mpi_communicator.cpp when
// find_package(MPI) finds nothing.
#include "dist/mpi/mpi_communicator.h"

namespace kvant::dist {

Result<std::unique_ptr<Communicator>> make_mpi_communicator() {
  return make_error(
      "communicator 'mpi': kvant was built without MPI (install libopenmpi-dev, "
      "then configure and build again)");
}

bool built_with_mpi() { return false; }

}  // namespace kvant::dist
