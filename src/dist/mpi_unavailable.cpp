// SPDX-License-Identifier: Apache-2.0
// make_mpi_communicator in a build configured with FP4SERVE_MPI=OFF (the Arm cross build, which has no arm64
// Open MPI): a refusal, so --tensor-parallel-size N > 1 fails with a message instead of a link error.
#include "dist/communicator.h"
#include "fp4serve/error.h"

namespace fp4serve::dist {

std::unique_ptr<Communicator> make_mpi_communicator(std::size_t) {
  throw UnsupportedError("tensor parallelism: this fp4serve was built with FP4SERVE_MPI=OFF (no Open MPI); "
                         "rebuild with Open MPI (scripts/install-deps.sh) to run --tensor-parallel-size N > 1");
}

}  // namespace fp4serve::dist
