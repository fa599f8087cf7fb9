// SPDX-License-Identifier: Apache-2.0
// What the model needs from a loaded checkpoint: plain tensors (norms, embeddings) and prepared linear groups.
// The implementation behind it (model/planned_weights.h) follows the per-layer plan; tests can supply their own.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/architecture.h"
#include "core/tensor_view.h"
#include "model/linear_group.h"

namespace fp4serve::model {

/// The online transforms of one attention module, each list in config order (compressed-tensors runs the hooks in
/// registration order): `query` on the post-RoPE query states before the scores (q_attn), `key` on the post-RoPE
/// key states before they are written to the KV cache (k_cache). Each runs block-diagonally over head_dim.
struct AttentionTransforms {
  std::vector<std::shared_ptr<const OnlineTransform>> query;
  std::vector<std::shared_ptr<const OnlineTransform>> key;
};

/// This rank's attention heads under tensor parallelism (plan/shard.h): q heads [q_begin, q_begin + q_count) and
/// KV heads [kv_begin, kv_begin + kv_count) of the checkpoint's.
struct AttentionHeads {
  int64_t q_begin = 0, q_count = 0;
  int64_t kv_begin = 0, kv_count = 0;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// The checkpoint tensor `name` (full name, e.g. "model.norm.weight"). Throws FormatError when absent.
  virtual core::TensorView tensor(const std::string& name) const = 0;
  virtual bool has_tensor(const std::string& name) const = 0;
  /// The linear modules `modules` (module paths without ".weight", in output order) prepared for execution,
  /// fused into one part when the plan runs them fused. Throws FormatError/UnsupportedError naming the module.
  virtual LinearGroup linear_group(const std::vector<std::string>& modules) const = 0;
  /// The modules of decoder layer `layer` with role `role` as the architecture describes them for this
  /// checkpoint (checkpoint naming; experts in index order). Empty when the layer has none.
  virtual std::vector<checkpoint::ModuleInfo> modules(int64_t layer, checkpoint::ModuleRole role) const = 0;
  /// Expert `expert` of the fused 3-D experts module `module` (GraniteMoe `input_linear` [E, N, K], GPT-OSS
  /// `gate_up_proj_blocks` [E, N, K/32, 16] + `_scales` + `_bias` [E, N]) prepared as one Linear [N, K]. With
  /// `deinterleave`, row 2i (gate_i) becomes row i and row 2i+1 (up_i) row N/2 + i, bias likewise (GPT-OSS,
  /// FORMATS.md §5), so the output is gate | up halves. Throws FormatError naming the module and expert when
  /// the expert index or a shape is out of range, UnsupportedError for a scheme without a 3-D slicing rule.
  virtual LinearGroup fused_expert(const std::string& module, int64_t expert, bool deinterleave) const = 0;
  /// The q_attn / k_cache transforms of decoder layer `layer`; none by default (a source without transforms).
  virtual AttentionTransforms attention_transforms(int64_t /*layer*/) const { return {}; }
  /// Tensor parallelism: this rank's heads, nullopt when the source holds the whole model. A sharded source
  /// returns linear groups with this rank's rows / columns only, and an empty group for an expert of another
  /// rank (expert parallelism).
  virtual std::optional<AttentionHeads> attention_heads() const { return std::nullopt; }
  /// Called once the backend has uploaded (repacked into its own memory) everything read so far: a source over
  /// a mapped checkpoint drops those pages from the process's resident memory, so the checkpoint does not stay
  /// resident beside the backend's copy. Views handed out stay valid (they fault in again when read). Nothing by
  /// default.
  virtual void release_read() const {}
};

}  // namespace fp4serve::model
