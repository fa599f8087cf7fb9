// SPDX-License-Identifier: Apache-2.0
// Linear modules whose outputs are concatenated along N, e.g. q|k|v or gate|up. The plan decides whether the
// shards run fused (one weight of stacked row blocks) or unfused (one per shard, SCHEMES.md rule 4); the model only
// sees the concatenated output either way. A group is data in checkpoint order (quant/linear_weights.h): each
// backend repacks it into its own layout and runs it (Backend::upload_linear, linear):
// y[m, N] = concat over parts of U_part(T_part(x[m, K]) · W_partᵀ (+ bias_part)), T_part the part's online input
// transform and U_part its output transforms per slice (identity where absent).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/online_transform.h"
#include "quant/linear_weights.h"

namespace fp4serve::model {

/// What a part does to its input before the GEMM: the W4A4 activation emulation of its block format (chosen by
/// the plan; not plan::ActivationQuant, the --activation-quant policy that decides which parts get one). Each
/// backend maps it to its own GEMM options.
enum class ActivationEmulation : uint8_t {
  None,          ///< activations stay as the backend's GEMM takes them
  EmulateNvfp4,  ///< W4A4 emulation: x is quantized to NVFP4 exactly as compressed-tensors does, then dequantized
  EmulateMxfp4,  ///< W4A4 emulation: x is quantized to MXFP4 (E8M0 per 32, dynamic) as compressed-tensors does
};

/// An online `output` transform on the output columns [offset, offset + width) of a part: the shard it belongs to
/// (a fused q|k|v part holds one per shard that has one; every shard transforms only its own slice).
struct OutputTransform {
  int64_t offset = 0;
  int64_t width = 0;
  std::shared_ptr<const OnlineTransform> transform;
};

struct LinearPart {
  quant::LinearWeights weight;  ///< checkpoint order; the backend repacks it at upload
  ActivationEmulation activation_quant = ActivationEmulation::None;
  /// Online `input` transform applied to x before this part's GEMM (null: none). Parts of a fused group share
  /// one object; identical matrices are shared across layers (TransformCache).
  std::shared_ptr<const OnlineTransform> input_transform;
  /// Online `output` transforms applied to y = x·Wᵀ + bias, the bias included (compressed-tensors forward hook on
  /// the Linear); slices are disjoint and lie within [0, weight.out_features()).
  std::vector<OutputTransform> output_transforms;
  /// The output projection to vocabulary logits (lm_head, or the tied embedding). Its unquantized weight may take
  /// the model's 16-bit activation precision, as GPU engines run a bf16 model's lm_head (bf16 x, fp32 sums); other
  /// unquantized layers (a bf16 checkpoint's projections, MoE routers, whose top-k is sensitive) keep fp32 x.
  bool lm_head = false;
};

/// One part running the GEMM of `parts` (same input transform, activation quantization and layout) over their
/// stacked row blocks (quant::stack_rows); each part's output transforms move to its slice of the fused output.
/// Throws what stack_rows throws, and UsageError when the parts have different input transforms or activation
/// quantization.
LinearPart fuse_parts(std::vector<LinearPart> parts);

/// Sees the input of every linear group during a forward pass: calibration (`quantize --scheme nvfp4` observes
/// activation amax for `input_global_scale`) and debugging use it; inference passes none.
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  /// x is [m, k] fp32, the input shared by every module in `modules`.
  virtual void observe(const std::vector<std::string>& modules, const float* x, int64_t m, int64_t k) = 0;
};

class LinearGroup {
 public:
  LinearGroup() = default;
  /// Parts in output order; all share in_features. `modules` are the checkpoint module names the group runs
  /// (reported to an ActivationObserver). Throws UsageError when the parts disagree on in_features or an output
  /// transform slice lies outside its part or is not a multiple of its block.
  explicit LinearGroup(std::vector<LinearPart> parts, std::vector<std::string> modules = {});

  const std::vector<std::string>& modules() const { return modules_; }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const std::vector<LinearPart>& parts() const { return parts_; }
  /// The parts, for a backend's upload to move the weights out of (the group is consumed by the upload).
  std::vector<LinearPart>& parts() { return parts_; }
  bool empty() const { return parts_.empty(); }


 private:
  std::vector<LinearPart> parts_;
  std::vector<std::string> modules_;
  int64_t in_features_ = 0;
  int64_t out_features_ = 0;
};

}  // namespace fp4serve::model
