// The "nccl" communicator in a build without CUDA (nccl_communicator.h).
#include "dist/nccl/nccl_communicator.h"

namespace kvant::dist {

Result<std::unique_ptr<Communicator>> make_nccl_communicator() {
  return make_error(
      "communicator 'nccl': this kvant was built without CUDA (configure with -DKVANT_CUDA=ON)");
}

}  // namespace kvant::dist
