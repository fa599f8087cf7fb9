// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel sharding rules (Megatron-style), decided from the plan and the headers alone, so that `explain`
// shows them without MPI and every rank of a run slices the same way:
// - column-parallel (q/k/v, gate/up, expert gate/up): whole output rows per rank; q heads split evenly, KV heads
//   split when num_key_value_heads ≥ N and replicated (each rank keeps the one its q heads read) when fewer;
//   fused groups keep every shard's own global scale (the slices are prepared exactly as the whole);
// - row-parallel (o_proj, down_proj, expert down): K split only on granule boundaries — the scale group along K
//   (16 NVFP4, 32 MXFP4, int4 group_size, FP8 block width), the block of an online input transform and the
//   8-column kernel octet — shards may be uneven (1120 = 384/384/352 at TP 3), a rank without one whole granule
//   is refused; the bias is added by rank 0 only; the partial outputs are summed by one all-reduce per block;
// - MoE: each expert's intermediate size split like a dense MLP when every rank gets a whole granule, else
//   whole experts per rank (also forced by `expert_parallel`); router, norms, embedding and lm_head replicated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/layer_plan.h"

namespace fp4serve::plan {

/// A half-open index range [begin, end).
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

/// How the feed-forward of a layer is distributed.
enum class FfnSplit : uint8_t {
  Intermediate,  ///< dense MLP, or every expert: gate/up rows and down columns of the intermediate split
  WholeExperts,  ///< experts distributed, each rank runs its experts whole (expert parallelism)
};

/// The split of one decoder layer, for every rank (index = rank).
struct LayerShard {
  int64_t layer = 0;
  std::vector<IndexRange> q_heads;   ///< attention heads of each rank
  std::vector<IndexRange> kv_heads;  ///< KV heads of each rank (one replicated head when fewer KV heads than ranks)
  int64_t o_granule = 1;             ///< o_proj K alignment (elements)
  bool moe = false;
  FfnSplit ffn = FfnSplit::Intermediate;
  int64_t intermediate = 0;          ///< the MLP / expert intermediate size I
  int64_t ffn_granule = 1;           ///< alignment of the intermediate split (elements)
  std::vector<IndexRange> ffn_columns;  ///< Intermediate: each rank's slice of I
  int64_t experts = 0;                  ///< E (MoE layers)
  std::vector<IndexRange> expert_ranges;  ///< WholeExperts: each rank's experts
  int64_t shared_intermediate = 0;        ///< Qwen2-MoE shared expert width, 0 when none
  std::vector<IndexRange> shared_columns;  ///< its split (always Intermediate)
};

/// How a run is split over processes: `--tensor-parallel-size`, `--expert-parallel` and this process's rank
/// (from the launcher). Parsed once by the app; the loader checks it against the communicator and the model.
struct ParallelConfig {
  int tensor_parallel_size = 1;  ///< ranks, one process (and device) each
  int rank = 0;                  ///< this process: 0 … tensor_parallel_size − 1
  bool expert_parallel = false;  ///< MoE layers: whole experts per rank instead of split experts
};

struct TensorParallelPlan {
  int size = 1;
  bool expert_parallel = false;  ///< requested (MoE layers then split WholeExperts)
  std::vector<LayerShard> layers;
};

/// What one rank keeps of one module.
struct ModuleShard {
  bool present = true;  ///< false: an expert of another rank (WholeExperts), not loaded here
  IndexRange rows;      ///< output rows kept (all for row-parallel and replicated modules)
  IndexRange columns;   ///< input columns K kept (all for column-parallel and replicated modules)
  bool bias = true;     ///< add the bias here (row-parallel: rank 0 only)
  bool whole() const { return present && rows.begin == 0 && columns.begin == 0; }
};

/// The K alignment a row-parallel split of `module` must keep: lcm of its scale group along K, the block of its
/// online input transform and 8 (the kernels' column octet).
int64_t row_split_granule(const ModulePlan& module);
/// The row alignment of a column-parallel split of `module`: lcm of 8 (the row tile) and its output transform block.
int64_t column_split_granule(const ModulePlan& module);

/// `total` elements in units of `granule` over `parts` ranks: the first (units mod parts) ranks get one unit more
/// (1120 / 32 over 3 → 384, 384, 352). Returns an empty vector when a rank would get no unit or `total` is not a
/// multiple of `granule`.
std::vector<IndexRange> split_on_granules(int64_t total, int64_t granule, int parts);

/// The split of every layer of `plan` over `tensor_parallel_size` ranks. Throws UsageError for a size < 1 and for
/// a size the model cannot split (heads not divisible, KV heads neither dividing nor divided, an o_proj or
/// intermediate split off a granule, fewer whole granules or experts than ranks), naming the layer, the numbers
/// and the valid sizes.
TensorParallelPlan plan_tensor_parallel(const LayerPlan& plan, int tensor_parallel_size, bool expert_parallel);

/// Every size 1 … max_size that plan_tensor_parallel accepts.
std::vector<int> valid_tensor_parallel_sizes(const LayerPlan& plan, bool expert_parallel, int max_size = 64);

/// What `rank` keeps of `module`. Throws UsageError when rank is outside 0 … size − 1, FormatError when the module
/// lies in a layer the plan has no split for.
ModuleShard module_shard(const TensorParallelPlan& tp, const ModulePlan& module, int rank);

/// The per-layer split as `explain --tensor-parallel-size N` prints it (layers with identical splits collapsed).
std::string render_tensor_parallel_text(const LayerPlan& plan, const TensorParallelPlan& tp);

}  // namespace fp4serve::plan
