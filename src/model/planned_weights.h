// SPDX-License-Identifier: Apache-2.0
// The WeightSource that follows a LayerPlan: each module's tensors in checkpoint order (quant/linear_weights.h)
// with the encoding of its chosen scheme, the checkpoint's global-scale convention (CT divisor, ModelOpt
// multiplier) and its bias, sliced for this rank's tensor-parallel shard; modules that the plan runs fused are
// stacked into one weight (each shard keeps its own global scale). The backend repacks them at upload. A
// downgraded W4A4 checkpoint's input scales were validated by the plan and are not read here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/weight_source.h"
#include "plan/layer_plan.h"
#include "plan/shard.h"

namespace fp4serve::model {

/// Loading progress: tensors and bytes (as stored in the checkpoint) prepared so far, out of the totals.
struct LoadProgressReport {
  uint64_t tensors = 0, total_tensors = 0;
  uint64_t bytes = 0, total_bytes = 0;
  bool done = false;  ///< the last report of a load
};
/// Called on the loading thread. The library prints nothing; the CLI draws a bar (app/model_options.cpp).
using LoadProgressCallback = std::function<void(const LoadProgressReport&)>;

/// Counts prepared tensors and bytes and reports them to a callback (empty: counts only) each time the byte
/// percentage changes, and once more at the end.
class LoadProgress {
 public:
  LoadProgress(uint64_t total_tensors, uint64_t total_bytes, LoadProgressCallback callback);
  void add(uint64_t tensors, uint64_t bytes);
  void finish();

 private:
  void report(bool done);
  LoadProgressReport state_;
  LoadProgressCallback callback_;
  int last_percent_ = -1;
};

/// One expert of a fused 3-D tensor: a view of its bytes in the tensor when they need no reordering (`bytes`
/// empty), else the reordered copy in `bytes` and a view over it.
struct ExpertSlice {
  std::vector<std::byte> bytes;
  core::TensorView view;  ///< into `bytes` when not empty (moving the slice keeps it valid, copying does not)
};

/// Expert `expert` of `t` [E, R, ...] as [R, ...]. With `transpose` (a dense [E, K, N] weight, GPT-OSS's
/// in×out orientation) the slice becomes [N, K] first; with `deinterleave` its rows are reordered row 2i → i and
/// 2i+1 → R/2 + i (gate/up interleaved → gate | up halves, FORMATS.md §5). Throws FormatError naming `name` when
/// `t` has fewer than 2 dimensions, `expert` is outside 0 … E−1, or deinterleaved rows are odd in number.
ExpertSlice slice_expert(const core::TensorView& t, int64_t expert, bool deinterleave, bool transpose,
                         const std::string& name);

/// In-memory storage of an unquantized (Dense) lm_head, the tied embedding included; the checkpoint is not changed.
enum class LmHeadDtype : uint8_t {
  Bf16,  ///< as the checkpoint stores it (bf16, or fp32 from f16/f32)
  Fp8,   ///< E4M3 per output row (scale amax/448): 1 byte per weight
  Int8,  ///< int8 per output row (scale amax/127): 1 byte per weight
};
std::string_view lm_head_dtype_name(LmHeadDtype dtype);  ///< "bf16", "fp8", "int8" (--lm-head-dtype)

/// Choices of the run, not of the checkpoint, that change the weights handed to the backend.
struct PrepareOptions {
  LmHeadDtype lm_head_dtype = LmHeadDtype::Bf16;  ///< an unquantized lm_head's DenseRequant
};

class PlannedWeights final : public WeightSource {
 public:
  /// With `tp` (null or size 1: the whole model), every module is rank `rank`'s shard of it
  /// (plan::module_shard), sliced in element space (the backend repacks the slices). Throws UsageError when rank is outside the plan.
  PlannedWeights(const checkpoint::Checkpoint& ckpt, const plan::LayerPlan& plan, LoadProgress& progress,
                 const plan::TensorParallelPlan* tp = nullptr, int rank = 0, PrepareOptions options = {});

  core::TensorView tensor(const std::string& name) const override;
  bool has_tensor(const std::string& name) const override;
  /// A native W4A4 scheme (planned where the device's catalogue has FP4 matrix units) gives the packed weights with
  /// the activations' format attached (LinearPart::activation_quant), as the emulation does. Throws
  /// UnsupportedError naming the module for a scheme no backend has a kernel for (native W8A8 FP8), FormatError
  /// when a module is not in the plan.
  LinearGroup linear_group(const std::vector<std::string>& modules) const override;
  std::vector<checkpoint::ModuleInfo> modules(int64_t layer, checkpoint::ModuleRole role) const override;
  /// Slices the planned 3-D tensors (weight or blocks/scales, bias) of `module` at `expert`; dense weights stored
  /// [E, K, N] (GPT-OSS unquantized) are transposed to [N, K]. Throws FormatError when `expert` is outside
  /// 0 … E−1 or `deinterleave` meets an odd N, UnsupportedError for schemes other than W4A16_MXFP4 and
  /// unquantized (the plan admits no other quantized 3-D experts).
  LinearGroup fused_expert(const std::string& module, int64_t expert, bool deinterleave) const override;
  /// The plan's q_attn / k_cache transforms of `layer`. Throws FormatError for malformed matrices or perms.
  AttentionTransforms attention_transforms(int64_t layer) const override;
  std::optional<AttentionHeads> attention_heads() const override;
  /// Drops the resident checkpoint pages of every tensor read since the last call (checkpoint::Checkpoint::
  /// release_pages): the Decoder calls it once a layer's groups are uploaded, when the backend holds its own copy.
  void release_read() const override;

 private:
  /// ckpt_.tensor(name), remembered for release_read.
  core::TensorView read(const std::string& name) const;
  LinearPart prepare_module(const plan::ModulePlan& module) const;
  /// The module's online transform at `location` ("input" or "output"; null when it has none). Throws
  /// UnsupportedError for an online transform at a location a Linear cannot take or two at one location,
  /// FormatError for missing/malformed matrices or a block that does not divide the transformed width.
  std::shared_ptr<const OnlineTransform> online_transform(const plan::ModulePlan& module, std::string_view location,
                                                          int64_t width) const;
  plan::ModuleShard shard_of(const plan::ModulePlan& module) const;
  /// The shared transform of `t` built from `tensors` (its matrix, and perm when randomized). Throws FormatError
  /// naming `owner` when they are missing or malformed.
  std::shared_ptr<const OnlineTransform> transform(const std::string& owner, const quant::TransformUse& t,
                                                   const std::vector<plan::TensorUse>& tensors) const;

  const checkpoint::Checkpoint& ckpt_;
  const plan::LayerPlan& plan_;
  LoadProgress& progress_;
  PrepareOptions options_;
  std::unordered_map<std::string, const plan::ModulePlan*> modules_;  // by checkpoint module name
  mutable TransformCache transforms_;  // identical transform matrices are built once and shared
  const plan::TensorParallelPlan* tp_ = nullptr;  // null: the whole model
  int rank_ = 0;
  mutable std::vector<std::span<const std::byte>> read_;  // checkpoint bytes read since the last release_read
};

}  // namespace fp4serve::model
