// SPDX-License-Identifier: Apache-2.0
#include "app/tensor_parallel.h"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "app/log.h"
#include "backends/registry.h"
#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "plan/layer_plan.h"
#include "plan/shard.h"

namespace fp4serve::app {
namespace {

std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

// Rank 0 → followers before each load: the model's index + 1, or 0 to end the run.
constexpr int64_t kEndRun = 0;

// Every rank's load outcome, gathered: empty strings for success.
std::vector<std::string> gather_errors(dist::Communicator& comm, const std::string& mine) {
  std::array<char, 1024> buf{};
  std::memcpy(buf.data(), mine.data(), std::min(mine.size(), buf.size() - 1));
  std::vector<char> all(buf.size() * static_cast<size_t>(comm.size()));
  comm.all_gather(buf.data(), all.data(), buf.size());
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) out.emplace_back(all.data() + static_cast<size_t>(r) * buf.size());
  return out;
}

runtime::FatalHandler print_and_abort(int rank) {
  return [rank](const std::exception& e) {
    std::fprintf(stderr, "fp4serve: error: rank %d: %s (the other ranks cannot go on: ending the run)\n", rank, e.what());
  };
}

// A size the model cannot split into is refused from the headers, before mpirun is suggested or any rank loads:
// the mpirun command printed for a size that fails after loading would only lead to that failure.
void check_model_splits(const std::string& model, const model::LoadOptions& load) {
  const plan::ParallelConfig& parallel = load.parallel;
  if (parallel.tensor_parallel_size <= 1 || model.empty()) return;
  const auto ckpt = checkpoint::Checkpoint::open(resolve_model_path(model));
  // The device's own catalogue, so that this answer is the one loading gives (cuda without a GPU plans as the CPU
  // here; loading then reports the missing GPU).
  const plan::DeviceCaps device =
      plan::resolve_device(load.device == plan::DeviceChoice::Cuda ? plan::DeviceChoice::Auto : load.device);
  const std::unique_ptr<plan::KernelCatalogue> catalogue = backends::catalogue_for(device);
  plan::PlanOptions options;
  options.catalogue = catalogue.get();
  options.activation_quant = load.activation_quant;
  const plan::LayerPlan layer_plan = plan::build_plan(ckpt, options);
  try {
    (void)plan::plan_tensor_parallel(layer_plan, parallel.tensor_parallel_size, parallel.expert_parallel);
  } catch (const UsageError& e) {
    // plan's message names the layer, the numbers that do not divide and plan::valid_tensor_parallel_sizes.
    throw UsageError(fmt::format("-tp/--tensor-parallel-size {}: {}; nothing was launched", parallel.tensor_parallel_size,
                                 e.what()));
  }
}

}  // namespace

std::vector<std::string> remember_command_line(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-tp") {
      args.emplace_back("--tensor-parallel-size");
    } else if (a.starts_with("-tp=")) {
      args.push_back("--tensor-parallel-size=" + a.substr(4));
    } else {
      args.push_back(a);
    }
  }
  command_line() = args;
  return args;
}

TensorParallelRun::TensorParallelRun(ModelOptions& opts) {
  const dist::LaunchInfo launch = dist::detect_launch();
  plan::ParallelConfig& parallel = opts.load.parallel;
  const std::vector<std::string>& args = command_line();
  std::vector<const char*> rest;
  for (size_t i = 1; i < args.size(); ++i) rest.push_back(args[i].c_str());
  const std::string hint = dist::mpirun_command(parallel.tensor_parallel_size, args.empty() ? "fp4serve" : args[0],
                                                static_cast<int>(rest.size()), rest.data(), geteuid() == 0);
  try {
    check_model_splits(opts.model, opts.load);
    dist::check_tensor_parallel_size(parallel.tensor_parallel_size, launch, hint);
  } catch (const Error&) {  // a refused size, or a model that cannot be read (FormatError, IoError, ...)
    if (launch.launched && launch.rank != 0) {
      // Rank 0 prints the refusal once. mpirun ends the whole job at the first non-zero exit, so a rank that left
      // at once could take rank 0 down before its message was written (seen under load: printed 0 times). The
      // other ranks wait, and mpirun ends them when rank 0 exits with the same code.
      std::this_thread::sleep_for(std::chrono::seconds(3));
      throw CLI::RuntimeError(2);
    }
    throw;
  }
  if (parallel.tensor_parallel_size == 1) {
    comm_ = dist::make_single_communicator();
    return;
  }
  comm_ = dist::make_mpi_communicator();
  if (comm_->size() != parallel.tensor_parallel_size) {  // a PMIx launch that did not export its size
    throw UsageError(fmt::format("--tensor-parallel-size {} does not match MPI's world size {}",
                                 parallel.tensor_parallel_size, comm_->size()));
  }
  parallel.rank = comm_->rank();
  opts.load.comm = comm_.get();
  if (comm_->rank() != 0) set_log_level(LogLevel::Error);  // also no loading bar (load_model_for draws it at Info)
  // Every rank runs on the same kind of device: auto is settled here, where the GPU ordinal is chosen, by rank 0's
  // answer (a rank of a mixed allocation that lacks the GPU then fails to load, and rank 0 reports it).
  if (opts.load.device == plan::DeviceChoice::Auto) {
    int32_t gpu = plan::resolve_device(plan::DeviceChoice::Auto).kind == plan::DeviceKind::Cuda ? 1 : 0;
    comm_->broadcast(&gpu, sizeof(gpu), 0);
    opts.load.device = gpu != 0 ? plan::DeviceChoice::Cuda : plan::DeviceChoice::Cpu;
  }
  if (opts.load.device == plan::DeviceChoice::Cuda) {
    opts.load.cuda_device = launch.local_rank;
    // GPU ranks all-reduce device buffers with NCCL; MPI stays the channel of the step plans. make_nccl_communicator
    // agrees on a failed setup across ranks before it throws, so every rank takes the MPI fallback together.
    try {
      dist::NcclOptions nccl;
      nccl.cuda_device = launch.local_rank;
      device_comm_ = dist::make_nccl_communicator(*comm_, nccl);
      opts.load.comm = device_comm_.get();
    } catch (const DeviceError& e) {  // no GPU or no libnccl on some rank
      log_warning("NCCL is not usable ({}); the all-reduces go over MPI through host memory", e.what());
    } catch (const UnsupportedError& e) {  // a build without the CUDA toolkit's nccl.h
      log_warning("{}; the all-reduces go over MPI through host memory", e.what());
    }
  }
}

TensorParallelRun::~TensorParallelRun() {
  if (!leader() || ended_ || size() == 1) return;
  try {
    int64_t end = kEndRun;
    comm_->broadcast(&end, sizeof(end), 0);
  } catch (const std::exception& e) {
    print_and_abort(0)(e);
    comm_->abort(3);
  }
}

RankModel TensorParallelRun::load(const ModelOptions& opts, size_t index) {
  if (!leader()) throw UsageError("TensorParallelRun::load runs on rank 0; the other ranks follow");
  if (size() > 1) {
    auto go = static_cast<int64_t>(index + 1);
    comm_->broadcast(&go, sizeof(go), 0);
  }
  RankModel out;
  std::string error;
  std::exception_ptr own;
  try {
    out.loaded = load_model_for(opts);
  } catch (const std::exception& e) {
    error = e.what();
    own = std::current_exception();
  }
  if (size() > 1) {
    const std::vector<std::string> errors = gather_errors(*comm_, error);
    for (const std::string& e : errors) ended_ = ended_ || !e.empty();  // the followers have returned
    if (own) std::rethrow_exception(own);
    for (int r = 1; r < size(); ++r) {
      if (!errors[static_cast<size_t>(r)].empty()) {
        throw Error(fmt::format("rank {} of {} failed to load the model: {}", r, size(), errors[static_cast<size_t>(r)]));
      }
    }
  } else if (own) {
    std::rethrow_exception(own);
  }
  out.tp = std::make_unique<runtime::RankZeroModel>(*out.loaded.decoder, *comm_, print_and_abort(0));
  return out;
}

void TensorParallelRun::follow(std::span<const ModelOptions> models) {
  if (leader()) throw UsageError("TensorParallelRun::follow runs on ranks other than 0");
  for (;;) {
    int64_t go = kEndRun;
    comm_->broadcast(&go, sizeof(go), 0);
    if (go == kEndRun) return;
    const auto index = static_cast<size_t>(go - 1);
    if (index >= models.size()) {
      throw FormatError(fmt::format("rank {}: rank 0 asked for model {} of {}", comm_->rank(), index, models.size()));
    }
    model::LoadedModel loaded;
    std::string error;
    try {
      loaded = load_model_for(models[index]);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::vector<std::string> errors = gather_errors(*comm_, error);
    bool any = false;
    for (const std::string& e : errors) any = any || !e.empty();
    if (any) throw CLI::RuntimeError(2);  // rank 0 prints the failing rank's message and exits 2
    runtime::run_follower(*loaded.decoder, *comm_, print_and_abort(comm_->rank()));
  }
}

}  // namespace fp4serve::app
