// SPDX-License-Identifier: Apache-2.0
// Run under mpirun by tests/dist/CMakeLists.txt for what a GoogleTest case cannot show from inside one process.
//   mpi_probe abort CODE : the last rank calls Communicator::abort(CODE) while the others wait in a barrier; the
//                          launch must end (no hang) with a failing status.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "dist/communicator.h"

int main(int argc, char** argv) {
  try {
    auto comm = fp4serve::dist::make_mpi_communicator();
    if (argc == 3 && std::strcmp(argv[1], "abort") == 0) {
      if (comm->rank() == comm->size() - 1) comm->abort(std::atoi(argv[2]));
      comm->barrier();  // never returns: the aborting rank does not enter it
      std::fprintf(stderr, "rank %d: the barrier returned without the aborting rank\n", comm->rank());
      return 1;
    }
    std::fprintf(stderr, "usage: mpi_probe abort CODE\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_probe: %s\n", e.what());
    return 3;
  }
}
