// SPDX-License-Identifier: Apache-2.0
// Online transforms of compressed-tensors `transform_config` (FORMATS.md §1.8): a Linear's input before its GEMM
// (`input`), its output after GEMM and bias (`output`), the post-RoPE query (`q_attn`) and key states before the
// KV-cache write (`k_cache`), each value ← value · M̂ block-diagonally over the last dimension, where M̂ is the
// stored matrix `P.<group>_<location>.weight` after its stored permutation `.perm` (randomize), transposed when
// `inverse`, divided by √b for the Hadamard types
// (compressed-tensors `HadamardTransform.forward`, `apply_transform_weight` / `_multihead_matmul`). A Sylvester
// Hadamard runs as the fast Walsh–Hadamard kernel; a stored matrix that verifies as signs · (A ⊗ H_p) · signs
// (every random-hadamard compressed-tensors builds, permuted or not; quant/hadamard_factor.h) as sign flips, the
// FWHT on p-blocks and a small k×k GEMM; anything else as a dense block-diagonal rotation. An OnlineTransform is
// data (kernel, block, matrices); each backend applies it (Backend::upload_transform, transform, and the linear
// groups' input / output transforms).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor_view.h"
#include "quant/hadamard_factor.h"

namespace fp4serve::model {

/// How a transform executes.
enum class TransformKernel : uint8_t {
  Fwht,   ///< the fast Walsh–Hadamard transform (the matrix is ±1 Sylvester: log2(b) add/sub stages per element)
  Dense,  ///< a block rotation with the normalized b×b matrix (b multiply-adds per element)
  /// the stored matrix is signs · (A ⊗ H_p) · signs with A k×k, b = k·p: gathers with signs, the FWHT on p-blocks
  /// and a k×k GEMM (k + log2 p multiply-adds per element; backends without that kernel run matrix() dense)
  KroneckerHadamard,
};
const char* transform_kernel_name(TransformKernel k);

class OnlineTransform {
 public:
  /// `matrix` is the b×b row-major f32 matrix to multiply by (already permuted, transposed and normalized);
  /// ignored (may be empty) for Fwht.
  OnlineTransform(TransformKernel kernel, int64_t block, std::vector<float> matrix);
  /// KroneckerHadamard: `structured` computes x·M̂; `matrix` (b×b, as above) is kept for backends without the
  /// structured kernel (the CUDA backend runs it dense).
  OnlineTransform(quant::KroneckerHadamardSteps structured, std::vector<float> matrix);

  TransformKernel kernel() const { return kernel_; }
  int64_t block() const { return block_; }
  /// Dense and KroneckerHadamard: the b×b matrix applied; Fwht: empty.
  const std::vector<float>& matrix() const { return matrix_; }
  /// KroneckerHadamard: the factors' kernel layout (k = its order of A, p of the Sylvester factor); else null.
  const quant::KroneckerHadamardSteps* structured() const { return structured_.get(); }


 private:
  TransformKernel kernel_;
  int64_t block_;
  std::vector<float> matrix_;
  std::shared_ptr<const quant::KroneckerHadamardSteps> structured_;
};

/// What a checkpoint says about one online transform of a module.
struct TransformSource {
  std::string name;              ///< `P.<group>_<location>.weight`, for messages
  std::string type;              ///< hadamard | random-hadamard | random-matrix
  bool inverse = false;
  core::TensorView matrix;       ///< [b, b] F32/BF16/F16/F64
  std::optional<core::TensorView> perm;  ///< [b] I64/I32, a permutation of 0…b−1
};

/// The effective b×b matrix of a transform, in f64, row-major: M[i][j] = W[perm[i]][perm[j]] (W if no perm),
/// transposed when inverse, divided by √b for `hadamard` / `random-hadamard` (not for `random-matrix`, which
/// compressed-tensors applies unscaled). Throws FormatError naming the tensor for a non-square matrix, an
/// unsupported dtype, a perm of the wrong length or that is not a permutation, or a non-finite entry;
/// UnsupportedError for an unknown type.
std::vector<double> effective_transform_matrix(const TransformSource& source);

/// True when `m` (b×b, row-major) equals H_b/√b, H_b the Sylvester Hadamard matrix (H[i][j] = (−1)^popcount(i&j)),
/// within 1e-6 per entry, so that the FWHT computes x·m. b must be a power of two ≥ 2.
bool is_normalized_sylvester(const std::vector<double>& m, int64_t b);

/// Builds transforms and shares identical ones: two sources with the same effective matrix (by content hash, then
/// exact comparison) get the same object, so q/k/v and every layer of a QuIP checkpoint hold one matrix. Kernel:
/// Fwht when M̂ is exactly H_b/√b, else KroneckerHadamard when quant::factor_kronecker_hadamard verifies on the
/// stored values (never on the config's type alone), else Dense.
class TransformCache {
 public:
  /// Throws as effective_transform_matrix.
  std::shared_ptr<const OnlineTransform> get(const TransformSource& source);
  /// Number of distinct transforms built so far.
  size_t distinct() const { return count_; }

 private:
  // A source already answered, by a copy of its stored bytes: a source whose matrix and perm bytes, shapes and
  // dtypes, type and direction all match (everything read_stored validates or reads) gets the same transform
  // without being read into f64 and hashed again (a QuIP checkpoint repeats its matrices in every layer: that was
  // 12% of `perplexity`'s CPU time on one). by_hash_ still shares transforms whose stored forms differ but whose
  // effective f64 matrices are equal.
  struct SeenSource {
    core::DType dtype = core::DType::F32;
    std::vector<int64_t> shape;
    std::vector<std::byte> matrix, perm;
    bool has_perm = false;
    core::DType perm_dtype = core::DType::I64;
    std::vector<int64_t> perm_shape;
    std::string type;
    bool inverse = false;
    std::shared_ptr<const OnlineTransform> transform;
    bool matches(const TransformSource& source) const;
  };
  std::shared_ptr<const OnlineTransform> build_or_share(const TransformSource& source);

  std::unordered_map<uint64_t, std::vector<SeenSource>> by_bytes_;
  std::unordered_map<uint64_t, std::vector<std::pair<std::vector<double>, std::shared_ptr<const OnlineTransform>>>> by_hash_;
  size_t count_ = 0;
};

}  // namespace fp4serve::model
