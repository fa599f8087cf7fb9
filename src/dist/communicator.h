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

/// The MPI communicator over every process of the launch (a duplicate of MPI_COMM_WORLD), host memory. The first
/// call initialises MPI for the process (MPI_Init_thread, MPI_THREAD_SERIALIZED: the server's scheduler thread
/// makes the calls, one at a time); MPI_Finalize runs at exit. Counts above 2³⁰ go in pieces. Throws
/// fp4serve::Error with MPI's error string when initialisation or a collective fails. Run without a launcher it is
/// a one-rank communicator (an MPI singleton). `max_piece`: elements (floats, bytes) per MPI call; tests pass
/// small values to exercise the pieces.
std::unique_ptr<Communicator> make_mpi_communicator(std::size_t max_piece = std::size_t{1} << 30);

struct NcclOptions {
  int cuda_device = 0;           ///< the CUDA device this rank drives: its local rank on the node
  void* cuda_stream = nullptr;   ///< cudaStream_t the collectives are enqueued on; nullptr = the legacy stream
  std::string library = "libnccl.so.2";  ///< what dlopen opens (a path, or a name the loader searches)
};

/// The NCCL communicator for device memory: rank r of `bootstrap` (MPI, host memory) becomes NCCL rank r. Opens
/// `options.library` at run time, selects the CUDA device, rank 0 makes the ncclUniqueId and `bootstrap` broadcasts
/// it, then ncclCommInitRank. The collectives take device pointers and are stream-ordered: they are enqueued on
/// options.cuda_stream and done for later work on that stream (barrier() also waits on the host). Every rank
/// checks the library and its device first and all ranks agree over `bootstrap`, so a failure on one rank throws
/// on every rank (DeviceError naming the failing rank and what is missing: the library with dlopen's reason, or
/// the CUDA device with the runtime's error) instead of leaving the others waiting. UnsupportedError in a build
/// without the CUDA toolkit. Collective bodies throw DeviceError with ncclGetErrorString's text.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, const NcclOptions& options = {});

}  // namespace fp4serve::dist
