// SPDX-License-Identifier: Apache-2.0
// Native W4A4 through cuBLASLt block-scaled FP4 matmul (see native_fp4.h). NEVER RUN on a GPU.
#include "backends/cuda/kernels/native_fp4.h"

#include <cublasLt.h>

#include <optional>
#include <string>

#include "backends/cuda/kernels/gemm_fp4_launch.h"
#include "backends/cuda/kernels/gpu_layout.h"
#include "backends/cuda/kernels/linear_cuda.h"
#include "fp4serve/error.h"
#include "quant/block_format.h"

namespace fp4serve::kernels::cuda {


namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

class LtHandle {
 public:
  LtHandle() { FP4SERVE_CUBLAS_CHECK(cublasLtCreate(&handle_)); }
  ~LtHandle() { cublasLtDestroy(handle_); }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// RAII owners of the cuBLASLt descriptors of one call.
struct LtMatmul {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtMatmul() = default;
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  ~LtMatmul() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// cuBLASLt's block-scale mode for FP4 operands of format f: its modes pair one E4M3 with 16 elements
// (VEC16_UE4M3) and one E8M0 with 32 (VEC32_UE8M0); nullopt for any other row.
std::optional<cublasLtMatmulMatrixScale_t> find_lt_scale_mode(quant::BlockFormat f) {
  const quant::BlockFormatTraits& row = quant::block_format_traits(f);
  if (row.scale == quant::ElementFormat::E4M3 && row.group_size == 16) return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
  if (row.scale == quant::ElementFormat::E8M0 && row.group_size == 32) return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  return std::nullopt;
}

cublasLtMatmulMatrixScale_t lt_scale_mode(quant::BlockFormat f) {
  if (const auto mode = find_lt_scale_mode(f)) return *mode;
  const quant::BlockFormatTraits& row = quant::block_format_traits(f);
  throw UnsupportedError("native W4A4: cuBLASLt has no block-scale mode for " + std::string(row.name) + " (" +
                         std::to_string(row.group_size) + " elements per scale)");
}

template <class T>
void ensure(DeviceBuffer<T>& buffer, size_t count) {
  if (buffer.size() < count) buffer = DeviceBuffer<T>(count);
}

}  // namespace

NativeFp4Weight pack_native_fp4(const quant::LinearWeights& w) { return pack_native_fp4(Fp4Rows(w)); }

NativeFp4Weight pack_native_fp4(const Fp4Rows& rows) {
  lt_scale_mode(rows.block_format());  // a format cuBLASLt cannot scale fails at upload, not at the first call
  const int64_t n = rows.out_features(), k = rows.in_features(), groups = rows.groups();
  NativeFp4Weight out;
  out.codes.assign(static_cast<size_t>(n * k / 2), uint8_t{0});
  out.scales.assign(static_cast<size_t>(block_scale_bytes(n, groups)), uint8_t{0});
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t col = 0; col < k; col += 2) {
      out.codes[static_cast<size_t>((row * k + col) / 2)] =
          static_cast<uint8_t>(rows.nibble(row, col) | (rows.nibble(row, col + 1) << 4));
    }
    for (int64_t g = 0; g < groups; ++g) {
      out.scales[static_cast<size_t>(block_scale_offset(row, g, groups))] = rows.scale_byte(row, g);
    }
  }
  return out;
}

bool native_fp4_supports(quant::BlockFormat format) { return find_lt_scale_mode(format).has_value(); }

bool native_fp4_available(const DeviceInfo& device) { return device.sm >= 100 && cublasLtGetVersion() >= 120800; }

void linear_w4a4(const DeviceLinear& w, const bf16* x, int64_t m, float* y, W4A4Scratch& scratch, Stream& stream) {
  if (w.native_codes.empty()) return linear_w4a4_emulated(w, x, m, y, scratch.activations, stream);
  if (m < 0 || (m > 0 && (x == nullptr || y == nullptr))) throw UsageError("linear_w4a4: bad m, x or y");
  if (m == 0) return;
  if (w.layout != quant::WeightEncoding::Fp4) throw UsageError("linear_w4a4: the layer is not an FP4 layer");
  const bool igs = w4a4_input_global_scale(w.block_format);
  if (igs && !(w.input_global_scale > 0.f)) throw UsageError("linear_w4a4: the layer has no input_global_scale");
  const int64_t n = w.out_features, k = w.in_features, group = quant::block_format_traits(w.block_format).group_size;
  ensure(scratch.codes, static_cast<size_t>(m * k / 2));
  ensure(scratch.scales, static_cast<size_t>(block_scale_bytes(m, k / group)));
  ensure(scratch.product, static_cast<size_t>(m * n));
  ensure(scratch.workspace, kWorkspaceBytes);
  FP4SERVE_CUDA_CHECK(cudaMemsetAsync(scratch.scales.data(), 0, scratch.scales.bytes(), stream.get()));
  launch_quantize_activations_packed(w.block_format, x, m, k, igs ? w.input_global_scale : 0.f, scratch.codes.data(),
                                     scratch.scales.data(), stream.get());

  thread_local LtHandle lt;
  LtMatmul mm;
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&mm.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
  // The same block-scale mode on both operands (the format's row: E4M3 per 16 for NVFP4, E8M0 per 32 for MXFP4).
  const int32_t mode = lt_scale_mode(w.block_format);
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
  const void* a_scale = w.native_scales.data();
  const void* b_scale = scratch.scales.data();
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale));
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale));
  // Column-major view: Dᵀ [N, m] = Wᵀᵀ · xᵀ with W stored K-major (K×N, ld K) and x K-major (K×m, ld K).
  FP4SERVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mm.a, CUDA_R_4F_E2M1, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  FP4SERVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mm.b, CUDA_R_4F_E2M1, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
  FP4SERVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mm.d, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n));
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&mm.pref));
  const size_t workspace = scratch.workspace.bytes();
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(mm.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt.get(), mm.op, mm.a, mm.b, mm.d, mm.d, mm.pref, 1, &result, &found));
  if (found == 0) {
    throw UnsupportedError("linear_w4a4: cuBLASLt has no block-scaled FP4 algorithm for [" + std::to_string(n) + ", " +
                           std::to_string(k) + "] × m = " + std::to_string(m));
  }
  const float alpha = 1.f, beta = 0.f;
  FP4SERVE_CUBLAS_CHECK(cublasLtMatmul(lt.get(), mm.op, &alpha, w.native_codes.data(), mm.a, scratch.codes.data(), mm.b,
                                       &beta, scratch.product.data(), mm.d, scratch.product.data(), mm.d, &result.algo,
                                       scratch.workspace.data(), workspace, stream.get()));
  launch_w4a4_epilogue(scratch.product.data(), m, n, igs ? w.input_global_scale : 1.f,
                       w.global_scale.empty() ? nullptr : w.global_scale.data(),
                       w.convention == quant::GlobalScaleConvention::Divisor,
                       w.bias.empty() ? nullptr : w.bias.data(), y, stream.get());
}

}  // namespace fp4serve::kernels::cuda
