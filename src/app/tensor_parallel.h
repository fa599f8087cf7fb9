// SPDX-License-Identifier: Apache-2.0
// --tensor-parallel-size N for the commands that run a model (generate, perplexity, serve, bench model): one
// process per device, started by mpirun / srun. Rank 0 runs the command as usual (tokenizer, sampling, HTTP,
// output) over a runtime::RankZeroModel; every other rank loads its shard and follows rank 0's steps silently.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "app/model_options.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "backends/load_model.h"
#include "runtime/rank_zero_model.h"

namespace fp4serve::app {

/// Keeps argv for the mpirun command a refusal prints, and returns it with vLLM's `-tp N` / `-tp=N` spelled
/// --tensor-parallel-size (CLI11 has no multi-letter single-dash options). Called once by main.
std::vector<std::string> remember_command_line(int argc, const char* const* argv);

/// A model loaded on every rank; model() is what rank 0 runs (it broadcasts each step to the followers).
struct RankModel {
  model::LoadedModel loaded;
  std::unique_ptr<runtime::RankZeroModel> tp;
  const model::ForwardModel& model() const { return *tp; }
};

class TensorParallelRun {
 public:
  /// Checks opts.load.parallel.tensor_parallel_size against opts.model's layers (from the headers: a size they
  /// cannot split into is refused naming the valid sizes, before anything is launched), then against the launch (dist::check_tensor_parallel_size:
  /// UsageError, exit 2, with the mpirun command to run, or naming both sizes), starts MPI for N > 1 and fills
  /// opts.load: the rank, the communicator, --device auto resolved, and for the GPU the ordinal = the local rank
  /// and NCCL for the decoder's all-reduces (when libnccl or a GPU is missing on any rank, every rank warns and
  /// uses MPI over host copies instead).
  /// Non-zero ranks log errors only.
  explicit TensorParallelRun(ModelOptions& opts);
  /// Rank 0: when load() never ran, tells the followers to return without loading.
  ~TensorParallelRun();
  TensorParallelRun(const TensorParallelRun&) = delete;
  TensorParallelRun& operator=(const TensorParallelRun&) = delete;

  bool leader() const { return comm_->rank() == 0; }
  int size() const { return comm_->size(); }

  /// Rank 0: every rank loads `opts` (each its shard); when any rank fails, rank 0 throws that rank's error (its
  /// own, or an Error naming the rank and its message). May be called again after the previous RankModel is gone
  /// (bench model loads each sample afresh).
  /// `index` tells the followers which of their `models` (follow) to load.
  RankModel load(const ModelOptions& opts, size_t index = 0);
  /// Other ranks: loads models[index] each time rank 0 loads, runs its steps until rank 0 frees that model, and
  /// returns when rank 0 ends the run. Throws CLI::RuntimeError(2) (exit 2, nothing printed: rank 0 reports it)
  /// when this rank failed to load.
  void follow(std::span<const ModelOptions> models);

 private:
  std::unique_ptr<dist::Communicator> comm_;         // MPI: the step plans, load outcomes, CPU all-reduces
  std::unique_ptr<dist::Communicator> device_comm_;  // NCCL for --device cuda (destroyed before MPI ends)
  bool ended_ = false;
};

}  // namespace fp4serve::app
