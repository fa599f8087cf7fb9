// SPDX-License-Identifier: Apache-2.0
// Communication between the ranks of a tensor-parallel run: one process per device, ranks 0 … size-1, launched by
// mpirun / srun. The collectives are the few a Megatron-style split needs (one all-reduce after each row-parallel
// GEMM, broadcasts of rank 0's step plan, a gather of logits). Backends wrap proven libraries only: none (size 1),
// MPI for host memory and bootstrap, NCCL for device memory. The model sees this interface, never a library.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace fp4serve::dist {

/// Every collective blocks until this rank's part is done and must be called by every rank of the communicator in
/// the same order with the same sizes (a mismatch is undefined in MPI and NCCL alike). Failures throw
/// fp4serve::DeviceError (NCCL) or fp4serve::Error (MPI) naming the call, the rank and the library's message.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "single", "mpi" or "nccl": what `explain` and the logs print.
  virtual std::string name() const = 0;
  /// True when the buffers passed to the collectives live in device memory (NCCL), false for host memory.
  virtual bool device_memory() const = 0;

  /// In place: data[i] ← Σ over ranks of data[i], fp32, `count` elements.
  virtual void all_reduce_sum(float* data, std::size_t count) = 0;
  /// Rank r's `bytes` bytes at `send` land at recv + r·bytes on every rank; `recv` holds size()·bytes bytes.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes) = 0;
  /// Rank `root`'s `bytes` bytes at `data` overwrite every other rank's.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Ends every rank of the run with exit code `code` (MPI_Abort); for an error on one rank that the others,
  /// blocked in a collective, would otherwise wait on forever.
  [[noreturn]] virtual void abort(int code) = 0;
};

/// The size-1 communicator: rank 0 of 1, every collective a copy or nothing. Needs no MPI.
std::unique_ptr<Communicator> make_single_communicator();

}  // namespace fp4serve::dist
