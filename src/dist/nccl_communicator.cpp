// SPDX-License-Identifier: Apache-2.0
// The NCCL backend. libnccl is opened at run time (dlopen), so a build with the CUDA toolkit still runs on a
// machine without NCCL or without a GPU; nccl.h supplies only the types and the functions' signatures. Every
// failure before the NCCL communicator exists is agreed on by all ranks over the bootstrap communicator, so
// that one rank's missing GPU is an error on every rank, not a hang in the others' ncclCommInitRank.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dist/communicator.h"
#include "fp4serve/error.h"

namespace fp4serve::dist {
namespace {

// The symbols used, resolved from the library that was opened.
struct NcclApi {
  void* handle = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
};

// Opens `library` and resolves every symbol; on failure returns the reason (the library and dlerror text).
std::string open_nccl(const std::string& library, NcclApi& api) {
  api.handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api.handle == nullptr) {
    const char* why = dlerror();
    return fmt::format("cannot load the NCCL library {} ({}); install NCCL (Debian/NVIDIA package libnccl2, or the "
                       "CUDA toolkit's lib folder on LD_LIBRARY_PATH) or run the ranks with --device cpu",
                       library, why != nullptr ? why : "no reason given");
  }
  std::string missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.handle, name));
    if (fn == nullptr) missing += missing.empty() ? name : std::string(", ") + name;
  };
  resolve(api.get_version, "ncclGetVersion");
  resolve(api.get_unique_id, "ncclGetUniqueId");
  resolve(api.comm_init_rank, "ncclCommInitRank");
  resolve(api.comm_destroy, "ncclCommDestroy");
  resolve(api.comm_abort, "ncclCommAbort");
  resolve(api.get_error_string, "ncclGetErrorString");
  resolve(api.all_reduce, "ncclAllReduce");
  resolve(api.all_gather, "ncclAllGather");
  resolve(api.broadcast, "ncclBroadcast");
  if (!missing.empty()) {
    dlclose(api.handle);
    api.handle = nullptr;
    return fmt::format("the NCCL library {} lacks {} (NCCL 2.x is needed)", library, missing);
  }
  return {};
}

// Empty when CUDA device `device` can be selected, else why not.
std::string select_device(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return fmt::format("no usable CUDA device for NCCL (cudaGetDeviceCount: {}: {})", cudaGetErrorName(e),
                       cudaGetErrorString(e));
  }
  if (device < 0 || device >= count) {
    return fmt::format("CUDA device {} does not exist: {} device(s) are visible (the rank's local rank picks the "
                       "device: launch at most as many ranks per node as GPUs)",
                       device, count);
  }
  const cudaError_t s = cudaSetDevice(device);
  if (s != cudaSuccess) return fmt::format("cudaSetDevice({}): {}", device, cudaGetErrorString(s));
  return {};
}

// Every rank learns whether every rank succeeded: all ranks throw, naming each failing rank and its reason.
void agree(Communicator& bootstrap, const std::string& local_error, const char* stage) {
  std::array<char, 512> mine{};
  std::memcpy(mine.data(), local_error.data(), std::min(local_error.size(), mine.size() - 1));
  std::vector<char> all(mine.size() * static_cast<size_t>(bootstrap.size()));
  bootstrap.all_gather(mine.data(), all.data(), mine.size());
  std::string failures;
  for (int r = 0; r < bootstrap.size(); ++r) {
    const char* msg = all.data() + static_cast<size_t>(r) * mine.size();
    if (msg[0] != '\0') failures += fmt::format("{}rank {}: {}", failures.empty() ? "" : "; ", r, msg);
  }
  if (!failures.empty()) {
    throw DeviceError(fmt::format("NCCL communicator ({}) on rank {} of {}: {}", stage, bootstrap.rank(),
                                  bootstrap.size(), failures));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, const NcclOptions& options)
      : rank_(bootstrap.rank()), size_(bootstrap.size()), stream_(static_cast<cudaStream_t>(options.cuda_stream)) {
    if (bootstrap.device_memory()) {
      throw UsageError("make_nccl_communicator: the bootstrap communicator must carry host memory (MPI or single)");
    }
    std::string error = open_nccl(options.library, api_);
    if (error.empty()) error = select_device(options.cuda_device);
    agree(bootstrap, error, "setup");
    device_ = options.cuda_device;

    // Rank 0 makes the unique id; the bootstrap carries it, with rank 0's error if it could not.
    struct IdMessage {
      char error[256];
      ncclUniqueId id;
    } msg{};
    if (rank_ == 0) {
      const ncclResult_t r = api_.get_unique_id(&msg.id);
      if (r != ncclSuccess) {
        const std::string text = fmt::format("ncclGetUniqueId: {}", api_.get_error_string(r));
        std::memcpy(msg.error, text.data(), std::min(text.size(), sizeof(msg.error) - 1));
      }
    }
    bootstrap.broadcast(&msg, sizeof(msg), 0);
    if (msg.error[0] != '\0') {
      throw DeviceError(fmt::format("NCCL communicator on rank {} of {}: rank 0: {}", rank_, size_, msg.error));
    }
    check(api_.comm_init_rank(&comm_, size_, msg.id, rank_), "ncclCommInitRank");
    if (cudaMalloc(&scratch_, sizeof(float)) != cudaSuccess) {
      api_.comm_destroy(comm_);
      throw DeviceError(fmt::format("NCCL communicator on rank {}: cudaMalloc of the barrier's 4 bytes failed", rank_));
    }
  }
  ~NcclCommunicator() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (comm_ != nullptr) api_.comm_destroy(comm_);
    // libnccl stays loaded: its threads may outlive the communicator until process exit.
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  bool device_memory() const override { return true; }

  // Communicator's contract: a collective returns when it is done, so every call waits for its stream (a caller
  // on another stream may read the buffer next). Enqueueing on the caller's stream without the wait is the faster
  // form a CUDA-graph step would want; it needs that stream here, not this contract.
  void all_reduce_sum(float* data, std::size_t count) override {
    check(api_.all_reduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    wait("ncclAllReduce");
  }
  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    check(api_.all_gather(send, recv, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
    wait("ncclAllGather");
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      throw UsageError(fmt::format("broadcast: root {} is not a rank of this {}-rank communicator", root, size_));
    }
    check(api_.broadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    wait("ncclBroadcast");
  }
  // NCCL has no barrier: a one-float all-reduce that every rank waits for on the host.
  void barrier() override { all_reduce_sum(static_cast<float*>(scratch_), 1); }
  [[noreturn]] void abort(int code) override {
    if (comm_ != nullptr) api_.comm_abort(comm_);
    comm_ = nullptr;
    std::_Exit(code);
  }

 private:
  void wait(const char* call) const {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) {
      throw DeviceError(fmt::format("{} on rank {} of {} (CUDA device {}): cudaStreamSynchronize: {}", call, rank_, size_,
                                    device_, cudaGetErrorString(e)));
    }
  }
  void check(ncclResult_t r, const char* call) const {
    if (r != ncclSuccess) {
      throw DeviceError(fmt::format("{} failed on rank {} of {} (CUDA device {}): {}", call, rank_, size_, device_,
                                    api_.get_error_string(r)));
    }
  }

  NcclApi api_;
  int rank_;
  int size_;
  int device_ = -1;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, const NcclOptions& options) {
  return std::make_unique<NcclCommunicator>(bootstrap, options);
}

}  // namespace fp4serve::dist
