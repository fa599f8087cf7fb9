// SPDX-License-Identifier: Apache-2.0
// Host side of the CUDA linear path: upload (repack to the GPU layout), argument checks, kernel dispatch and the
// cuBLAS bf16 GEMM for Dense layers.
#include "backends/cuda/kernels/linear_cuda.h"

#include <cublas_v2.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/kernels/gemm_fp4_launch.h"
#include "backends/cuda/kernels/gpu_layout.h"
#include "backends/cuda/kernels/limits.h"
#include "backends/cuda/kernels/native_fp4.h"
#include "backends/cuda/kernels/partition.h"
#include "fp4serve/error.h"
#include "quant/block_format.h"
#include "quant/dequant.h"
#include "quant/formats.h"

namespace fp4serve::kernels::cuda {

using quant::WeightEncoding;

namespace {

// One cuBLAS handle per host thread (a handle must not be used by two threads at once); bound to the caller's
// stream before every call.
class BlasHandle {
 public:
  BlasHandle() { FP4SERVE_CUBLAS_CHECK(cublasCreate(&handle_)); }
  ~BlasHandle() { cublasDestroy(handle_); }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

cublasHandle_t blas_for(cudaStream_t stream) {
  thread_local BlasHandle handle;
  FP4SERVE_CUBLAS_CHECK(cublasSetStream(handle.get(), stream));
  return handle.get();
}

// SM count of the current device, cached per host thread (the decode kernel's split-K choice needs it on every
// call; cudaGetDevice is cheap, the attribute query less so).
int multiprocessor_count() {
  thread_local int cached_device = -1, cached_count = 0;
  int device = 0;
  FP4SERVE_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    FP4SERVE_CUDA_CHECK(cudaDeviceGetAttribute(&cached_count, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  return cached_count;
}

// The split-K workspace of the tiled FP4 path, per host thread: allocated once at its largest size (a plan never
// needs more, partition.h), so its address never changes and a CUDA graph that captured it stays valid.
struct SplitWorkspace {
  int device = -1;
  DeviceBuffer<float> partial;
};
SplitWorkspace& split_workspace(int multiprocessors) {
  thread_local SplitWorkspace ws;
  int device = 0;
  FP4SERVE_CUDA_CHECK(cudaGetDevice(&device));
  if (ws.device != device) {
    ws.partial = DeviceBuffer<float>(static_cast<size_t>(split_k_workspace_floats(multiprocessors)));
    ws.device = device;
  }
  return ws;
}

// "NVFP4", "MXFP4" for FP4 layers, else the encoding's name.
std::string label_of(WeightEncoding encoding, quant::BlockFormat format) {
  return encoding == WeightEncoding::Fp4 ? std::string(quant::block_format_name(format))
                                         : std::string(quant::weight_encoding_name(encoding));
}
std::string label_of(const DeviceLinear& w) { return label_of(w.layout, w.block_format); }

std::string shape_of(const DeviceLinear& w) {
  return "[" + std::to_string(w.out_features) + ", " + std::to_string(w.in_features) + "] " + label_of(w) + " layer";
}

// A W4A4 layer: its format's activations keep a stored global scale (NVFP4) and the checkpoint gave one, or they
// have per-call scales only (MXFP4) and the layer was uploaded for W4A4.
bool is_w4a4(const DeviceLinear& w) {
  if (w.layout != WeightEncoding::Fp4) return false;
  return w4a4_input_global_scale(w.block_format) ? w.input_global_scale > 0.f : w.dynamic_w4a4;
}

// The W4A4 activation fake quant of quantize_activations_nvfp4 / _mxfp4 in groups of `format`; `what` names the
// caller in messages.
void quantize_activations(quant::BlockFormat format, const bf16* x, int64_t m, int64_t k, float input_global_scale,
                          bf16* out, Stream& stream, const char* what) {
  const int64_t group = quant::block_format_traits(format).group_size;
  const std::string name(quant::block_format_name(format));
  if (k % group != 0 || m < 0) {
    throw UsageError(name + " W4A4 emulation needs K to be a multiple of " + std::to_string(group) +
                     " and m >= 0, got K = " + std::to_string(k) + ", m = " + std::to_string(m));
  }
  if (w4a4_input_global_scale(format) && (!std::isfinite(input_global_scale) || input_global_scale <= 0.f)) {
    throw UsageError(name + " W4A4 emulation needs a finite input_global_scale > 0, got " +
                     std::to_string(input_global_scale));
  }
  if (m == 0) return;
  if (x == nullptr || out == nullptr) throw UsageError(std::string(what) + ": null x or out with m > 0");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    throw UsageError(std::string(what) + ": x and out must be 16-byte aligned");
  }
  launch_quantize_activations(format, x, m, k, input_global_scale, out, stream.get());
}

void check_call(const DeviceLinear& w, const void* x, int64_t m, const void* y, const char* what) {
  if (m < 0) throw UsageError(std::string(what) + ": m = " + std::to_string(m) + " is negative");
  if (m == 0) return;
  if (x == nullptr || y == nullptr) throw UsageError(std::string(what) + ": null x or y with m > 0");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    throw UsageError(std::string(what) + ": x must be 16-byte aligned for the " + shape_of(w));
  }
  if (w.out_features <= 0) throw UsageError(std::string(what) + ": the layer was not uploaded");
}

// The per-row global scales of an FP4 layer, as stored, padded with 1 to `rows`.
std::vector<float> padded_global_scale(const Fp4Rows& w, int64_t rows) {
  std::vector<float> g(static_cast<size_t>(rows), 1.f);
  for (int64_t n = 0; n < w.out_features(); ++n) g[static_cast<size_t>(n)] = w.global_scale(n);
  return g;
}

// A dense layer's row blocks ([N, K] BF16 / F16 / F32) → [N, K] bf16 row-major (RNE from F16 / F32).
std::vector<bf16> dense_rows(const quant::LinearWeights& w) {
  std::vector<bf16> out;
  out.reserve(static_cast<size_t>(w.out_features() * w.in_features));
  for (const quant::WeightRows& r : w.rows) {
    const int64_t k = quant::check_dense_rows(r.weight, r.name);
    if (k != w.in_features) {
      quant::fail_tensor(r.name, "weight", "has K = " + std::to_string(k) + ", the layer " + std::to_string(w.in_features));
    }
    const int64_t count = r.weight.numel();
    for (int64_t i = 0; i < count; ++i) {
      __nv_bfloat16_raw raw;
      raw.x = r.weight.dtype == core::DType::BF16
                  ? r.weight.load<uint16_t>(static_cast<size_t>(i))
                  : quant::float_to_bf16(quant::load_float(r.weight, static_cast<size_t>(i), r.name));
      out.push_back(raw);
    }
  }
  return out;
}

// The layer's biases in output order, fp32 (rows without one: 0); empty when no row block has one.
std::vector<float> bias_rows(const quant::LinearWeights& w) {
  bool any = false;
  for (const quant::WeightRows& r : w.rows) any = any || r.has_bias;
  if (!any) return {};
  std::vector<float> out;
  out.reserve(static_cast<size_t>(w.out_features()));
  for (const quant::WeightRows& r : w.rows) {
    const int64_t n = r.out_features();
    if (!r.has_bias) {
      out.insert(out.end(), static_cast<size_t>(n), 0.f);
      continue;
    }
    const core::DType dtypes[] = {core::DType::BF16, core::DType::F16, core::DType::F32};
    quant::check_tensor_dtype(r.bias, dtypes, r.name, "bias");
    quant::check_tensor_shape(r.bias, {n}, r.name, "bias");
    for (int64_t i = 0; i < n; ++i) out.push_back(quant::load_float(r.bias, static_cast<size_t>(i), r.name));
  }
  return out;
}

void run(const DeviceLinear& w, const bf16* x, int64_t m, float* y_f32, bf16* y_bf16, float activation_divisor,
         Stream& stream) {
  if (m == 0) return;
  switch (w.layout) {
    case WeightEncoding::Fp4: {
      Fp4GemmArgs a;
      a.codes = w.codes.data();
      a.scales = w.scales.data();
      a.format = w.block_format;
      a.global_scale = w.global_scale.empty() ? nullptr : w.global_scale.data();
      a.divisor = w.convention == quant::GlobalScaleConvention::Divisor;
      a.activation_divisor = activation_divisor;
      a.bias = w.bias.empty() ? nullptr : w.bias.data();
      a.x = x;
      a.m = m;
      a.n = w.out_features;
      a.k = w.in_features;
      a.row_tiles = w.padded_rows / kGpuRowTile;
      a.col_chunks = w.padded_cols / kGpuColChunk;
      a.y_f32 = y_f32;
      a.y_bf16 = y_bf16;
      const int sms = multiprocessor_count();
      if (m > 16) {
        SplitWorkspace& ws = split_workspace(sms);
        a.split_partial = ws.partial.data();
        a.split_partial_floats = static_cast<int64_t>(ws.partial.size());
      }
      launch_fp4_gemm(a, sms, stream.get());
      return;
    }
    case WeightEncoding::Dense: {
      // Row-major y[m, N] = x[m, K]·W[N, K]ᵀ is column-major yᵀ (N×m) = W (K×N, transposed) · xᵀ (K×m).
      const bool has_bias = !w.bias.empty();
      if (has_bias) launch_broadcast_bias(w.bias.data(), m, w.out_features, y_f32, y_bf16, stream.get());
      const float alpha = 1.f, beta = has_bias ? 1.f : 0.f;
      void* y = y_f32 != nullptr ? static_cast<void*>(y_f32) : static_cast<void*>(y_bf16);
      FP4SERVE_CUBLAS_CHECK(cublasGemmEx(blas_for(stream.get()), CUBLAS_OP_T, CUBLAS_OP_N,
                                         static_cast<int>(w.out_features), static_cast<int>(m),
                                         static_cast<int>(w.in_features), &alpha, w.dense.data(), CUDA_R_16BF,
                                         static_cast<int>(w.in_features), x, CUDA_R_16BF,
                                         static_cast<int>(w.in_features), &beta, y,
                                         y_f32 != nullptr ? CUDA_R_32F : CUDA_R_16BF,
                                         static_cast<int>(w.out_features), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
    case WeightEncoding::Int4:
    case WeightEncoding::Fp8:
      break;
  }
  throw UnsupportedError("CUDA linear: no kernel for the " + shape_of(w));
}

}  // namespace

int64_t DeviceLinear::weight_bytes() const {
  return static_cast<int64_t>(codes.bytes() + scales.bytes() + global_scale.bytes() + dense.bytes());
}

DeviceLinear upload_linear(const quant::LinearWeights& w, Stream& /*stream*/, bool dynamic_w4a4) {
  if (dynamic_w4a4 && (w.encoding != WeightEncoding::Fp4 || w4a4_input_global_scale(w.block_format))) {
    throw UsageError("upload_linear: W4A4 with per-call activation scales only (MXFP4) asked for a " +
                     label_of(w.encoding, w.block_format) + " layer");
  }
  DeviceLinear d;
  d.layout = w.encoding;
  d.block_format = w.block_format;
  d.out_features = w.out_features();
  d.in_features = w.in_features;
  d.convention = w.convention;
  d.input_global_scale = w.input_global_scale;
  d.dynamic_w4a4 = dynamic_w4a4;
  std::string shape = "[";
  shape += std::to_string(d.out_features);
  shape += ", ";
  shape += std::to_string(d.in_features);
  shape += "]";
  switch (w.encoding) {
    case WeightEncoding::Fp4: {
      const Fp4Rows rows(w);  // read and validated once for the repacks below
      const PackedFp4 p = pack_fp4_for_gpu(rows);
      d.padded_rows = p.padded_rows;
      d.padded_cols = p.padded_cols;
      d.group_size = p.group_size;
      d.codes = DeviceBuffer<uint32_t>::from_host(p.codes);
      d.scales = DeviceBuffer<uint8_t>::from_host(p.scales);
      int device = 0;
      FP4SERVE_CUDA_CHECK(cudaGetDevice(&device));
      const auto info = cuda_device(device);
      const bool has_native = info && native_fp4_available(*info);
      if (quant::block_format_traits(w.block_format).global_scale) {
        d.global_scale = DeviceBuffer<float>::from_host(padded_global_scale(rows, p.padded_rows));
      }
      if (is_w4a4(d) && has_native && native_fp4_supports(w.block_format) &&
          native_fp4_runs_on(w.block_format, info->sm)) {
        const NativeFp4Weight native = pack_native_fp4(rows);
        d.native_codes = DeviceBuffer<uint8_t>::from_host(native.codes);
        d.native_scales = DeviceBuffer<uint8_t>::from_host(native.scales);
      }
      break;
    }
    case WeightEncoding::Dense:
      if (w.requant != quant::DenseRequant::None) {
        throw UnsupportedError("upload_linear: the CUDA backend has no kernel for a dense layer re-encoded per row "
                               "(--lm-head-dtype fp8 / int8) yet (layer " + shape + ")");
      }
      if (d.out_features > INT32_MAX || d.in_features > INT32_MAX) {
        throw UnsupportedError("upload_linear: Dense layer too large for cuBLAS int dimensions");
      }
      d.padded_rows = d.out_features;
      d.padded_cols = d.in_features;
      d.dense = DeviceBuffer<bf16>::from_host(dense_rows(w));
      break;
    case WeightEncoding::Int4:
    case WeightEncoding::Fp8:
      throw UnsupportedError(std::string("upload_linear: the CUDA backend has no kernel for ") +
                             quant::weight_encoding_name(w.encoding) + " layers yet (layer " + shape + ")");
  }
  if (std::vector<float> bias = bias_rows(w); !bias.empty()) d.bias = DeviceBuffer<float>::from_host(bias);
  return d;
}

void linear(const DeviceLinear& w, const bf16* x, int64_t m, float* y, Stream& stream) {
  check_call(w, x, m, y, "cuda::linear");
  run(w, x, m, y, nullptr, 0.f, stream);
}

void linear(const DeviceLinear& w, const bf16* x, int64_t m, bf16* y, Stream& stream) {
  check_call(w, x, m, y, "cuda::linear");
  run(w, x, m, nullptr, y, 0.f, stream);
}

void quantize_activations_nvfp4(const bf16* x, int64_t m, int64_t k, float input_global_scale, bf16* out,
                                Stream& stream) {
  quantize_activations(quant::BlockFormat::Nvfp4, x, m, k, input_global_scale, out, stream,
                       "quantize_activations_nvfp4");
}

void quantize_activations_mxfp4(const bf16* x, int64_t m, int64_t k, bf16* out, Stream& stream) {
  quantize_activations(quant::BlockFormat::Mxfp4, x, m, k, 0.f, out, stream, "quantize_activations_mxfp4");
}

void linear_w4a4_emulated(const DeviceLinear& w, const bf16* x, int64_t m, float* y, DeviceBuffer<bf16>& scratch,
                          Stream& stream) {
  if (!is_w4a4(w)) {
    throw UsageError("W4A4 emulation needs an NVFP4 layer with an input_global_scale or an MXFP4 layer uploaded for "
                     "W4A4; the " + shape_of(w) + " has input_global_scale " + std::to_string(w.input_global_scale));
  }
  check_call(w, x, m, y, "cuda::linear_w4a4_emulated");
  if (m == 0) return;
  const size_t need = static_cast<size_t>(m * w.in_features);
  if (scratch.size() < need) scratch = DeviceBuffer<bf16>(need);
  // The stored activation global scale (NVFP4) enters the quantizer and leaves through the epilogue (acc / igs);
  // a format with per-call scales only (MXFP4) has no activation factor.
  const float igs = w4a4_input_global_scale(w.block_format) ? w.input_global_scale : 0.f;
  quantize_activations(w.block_format, x, m, w.in_features, igs, scratch.data(), stream, "cuda::linear_w4a4_emulated");
  run(w, scratch.data(), m, y, nullptr, igs, stream);
}

}  // namespace fp4serve::kernels::cuda
