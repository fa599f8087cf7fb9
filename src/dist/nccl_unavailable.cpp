// SPDX-License-Identifier: Apache-2.0
// make_nccl_communicator in a build without the CUDA toolkit (or without its nccl.h): a refusal on every rank.
#include <fmt/format.h>

#include "dist/communicator.h"
#include "fp4serve/error.h"

namespace fp4serve::dist {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, const NcclOptions&) {
  throw UnsupportedError(fmt::format("NCCL communicator on rank {}: this fp4serve was built without the CUDA toolkit's "
                                     "nccl.h (FP4SERVE_CUDA=OFF or no nvcc at configure time); use --device cpu",
                                     bootstrap.rank()));
}

}  // namespace fp4serve::dist
