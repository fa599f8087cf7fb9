// SPDX-License-Identifier: Apache-2.0
// The MPI backend: host-memory collectives over a duplicate of MPI_COMM_WORLD (so that a library sharing the
// process keeps its own message space), errors returned instead of MPI's default abort, and MPI initialised once
// per process and finalised at exit.
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "dist/communicator.h"
#include "fp4serve/error.h"

namespace fp4serve::dist {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", code);
  return std::string(text, static_cast<size_t>(len));
}

void check(int code, const char* call, int rank) {
  if (code != MPI_SUCCESS) throw Error(fmt::format("{} failed on rank {}: {}", call, rank, mpi_error_text(code)));
}

// MPI may be initialised once per process and never again after MPI_Finalize: one environment for the process's
// lifetime, finalised by the destructor of this function-local static at exit.
class MpiEnvironment {
 public:
  static MpiEnvironment& get() {
    static MpiEnvironment env;
    return env;
  }
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;
  ~MpiEnvironment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }

 private:
  MpiEnvironment() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // someone else (a test harness) owns MPI
    // SERIALIZED: the server's scheduler thread, not the main thread, makes the step's calls, one at a time.
    int provided = MPI_THREAD_SINGLE;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread", -1);
    owner_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      owner_ = false;
      throw Error(fmt::format("MPI_Init_thread: this MPI library provides thread level {} but fp4serve needs "
                              "MPI_THREAD_SERIALIZED ({}): collectives are made from the scheduler thread",
                              provided, MPI_THREAD_SERIALIZED));
    }
  }
  bool owner_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // MPI counts are int: larger transfers go in pieces of at most `max_piece` elements.
  explicit MpiCommunicator(size_t max_piece) : max_piece_(std::clamp<size_t>(max_piece, 1, size_t{1} << 30)) {
    MpiEnvironment::get();
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", -1);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", -1);
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", rank_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  bool device_memory() const override { return false; }

  void all_reduce_sum(float* data, std::size_t count) override {
    for (size_t done = 0; done < count; done += max_piece_) {
      const int n = static_cast<int>(std::min(max_piece_, count - done));
      check(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce", rank_);
    }
  }

  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    auto* out = static_cast<unsigned char*>(recv);
    const auto* in = static_cast<const unsigned char*>(send);
    const bool in_place = in == out + static_cast<size_t>(rank_) * bytes;
    if (bytes <= max_piece_) {
      const int n = static_cast<int>(bytes);
      check(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "MPI_Allgather",
            rank_);
      return;
    }
    // Piece by piece: piece p of every rank lands at recv + r·bytes + offset, a strided receive type whose extent
    // is one rank's whole share.
    for (size_t offset = 0; offset < bytes; offset += max_piece_) {
      const size_t len = std::min(max_piece_, bytes - offset);
      MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
      check(MPI_Type_contiguous(static_cast<int>(len), MPI_BYTE, &piece), "MPI_Type_contiguous", rank_);
      check(MPI_Type_create_resized(piece, 0, static_cast<MPI_Aint>(bytes), &strided), "MPI_Type_create_resized",
            rank_);
      MPI_Type_commit(&strided);
      const int code = MPI_Allgather(in_place ? MPI_IN_PLACE : in + offset, static_cast<int>(len), MPI_BYTE, out + offset, 1,
                                     strided, comm_);
      MPI_Type_free(&strided);
      MPI_Type_free(&piece);
      check(code, "MPI_Allgather", rank_);
    }
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      throw UsageError(fmt::format("broadcast: root {} is not a rank of this {}-rank communicator", root, size_));
    }
    auto* p = static_cast<unsigned char*>(data);
    for (size_t done = 0; done < bytes; done += max_piece_) {
      const int n = static_cast<int>(std::min(max_piece_, bytes - done));
      check(MPI_Bcast(p + done, n, MPI_BYTE, root, comm_), "MPI_Bcast", rank_);
    }
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier", rank_); }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] true if a library's does
  }

 private:
  size_t max_piece_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(std::size_t max_piece) {
  return std::make_unique<MpiCommunicator>(max_piece);
}

}  // namespace fp4serve::dist
