// SPDX-License-Identifier: Apache-2.0
// `--activation-precision auto` on the CPU: how the FP4 linears take their activations, decided by a measurement
// that is kept per machine so that two runs of one binary on one machine choose alike (and give the same tokens).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "backends/cpu/prepare/prepared_linear.h"
#include "model/model_config.h"
#include "plan/device_caps.h"

namespace fp4serve::model {

/// The activation precision `choice` means on `device` for a checkpoint whose dtype is `model_dtype`
/// (ModelConfig::dtype), with the reason (for `explain` and the start-up line). A given choice is itself ("set by
/// --activation-precision"). Auto (std::nullopt) on a bfloat16 checkpoint, on a CPU whose kernels run bf16 dot
/// products (kernels::bf16_dot_active(): AVX512-BF16), is chosen by measurement: bf16, whose prefill runs as the
/// checkpoint's own dtype at twice the fp32 FMA's products per instruction, against int8 dot products where the SIMD
/// int8 kernel exists (kernels::probe_activation_precision on `probe_shape`, the model's [intermediate, hidden]):
/// Bf16, or Bf16DecodeInt8 where int8 is clearly faster for batched rows; the reason gives the CPU times, their
/// ratio against the 0.8 margin and the thread count. Anything else (another dtype, a CPU without AVX512-BF16,
/// where bf16 would only add a rounding pass, or the GPU) is Fp32.
///
/// The measurement is made once per CPU model, thread count, shape and fp4serve executable, and kept in
/// precision_cache_file() (read at the first use in a process, rewritten through a temporary file and a rename):
/// a near-tie measured again on a loaded machine could otherwise choose the other path, and the two paths round
/// differently. A cache that cannot be read or written is ignored (the probe runs, its answer is kept in memory).
struct ActivationPrecisionChoice {
  prepare::ActivationPrecision precision = prepare::ActivationPrecision::Fp32;
  std::string reason;
};
/// `emulating`: `--activation-quant emulate`, the numerical reference of W4A4 checkpoints: auto is Fp32 then, so that
/// the layers it does not emulate and the lm_head keep exact activations too.
ActivationPrecisionChoice choose_activation_precision(std::optional<prepare::ActivationPrecision> choice,
                                                      plan::DeviceKind device, const std::string& model_dtype,
                                                      std::array<int64_t, 2> probe_shape, bool emulating = false);

/// The activation precision of the int4 (W4A16: GPTQ, AWQ) linears, given `fp4`, choose_activation_precision's
/// precision for the same choice. A given choice is itself, as for the FP4 linears (bf16 and the bf16 half of
/// bf16-decode-int8 run bf16 dot products on (q − z)·s rounded to bf16 where the CPU has AVX512-BF16, AMX tiles where
/// usable, and fp32 x elsewhere). Auto, on a CPU with the SIMD int8 kernel (kernels::int8_kernel_active) outside
/// emulation: Int8 at every row count, since the alternatives are slower on the CPUs measured: fp32 x runs the int4
/// GEMV at 0.30 of the bandwidth and the GEMM at 0.15–0.19 of the compute roof, bf16 dot products the GEMM at
/// 0.16–0.40, against int8's 0.87 and 0.50–0.55 on Zen 4 (docs/performance.md "Int4 (W4A16) layers on the int8
/// kernel"), and int8 stays within the 1e-3 mean-KLD bar (6.3e-4 on the default model quantized to int4). AMX tiles
/// (bf16) are not weighed against it: no AMX CPU has measured them. Otherwise `fp4`.
ActivationPrecisionChoice choose_int4_activation_precision(std::optional<prepare::ActivationPrecision> choice,
                                                           plan::DeviceKind device, prepare::ActivationPrecision fp4,
                                                           bool emulating = false);

/// choose_activation_precision's precision alone.
prepare::ActivationPrecision resolve_activation_precision(std::optional<prepare::ActivationPrecision> choice,
                                                          plan::DeviceKind device, const std::string& model_dtype,
                                                          std::array<int64_t, 2> probe_shape = {1536, 576},
                                                          bool emulating = false);

/// The probe shape load_model passes for a model: its MLP, [max(intermediate, hidden), hidden].
std::array<int64_t, 2> activation_probe_shape(const ModelConfig& config);

/// The cache file's key of a measurement with `threads` threads on `probe_shape` in this process: the CPU model,
/// this executable (size and modification time), the GEMM target, the thread count and the shape.
std::string precision_cache_key(int threads, std::array<int64_t, 2> probe_shape);

/// fp4serve's cache folder: $FP4SERVE_CACHE_DIR, else $XDG_CACHE_HOME/fp4serve, else $HOME/.cache/fp4serve; empty
/// when none of them is set.
std::filesystem::path cache_directory();

/// This executable as caches of its results name it: its size and modification time (nanoseconds), so that any
/// rebuild or upgrade invalidates what an older binary measured or wrote.
std::string executable_identity();

/// Where auto's measurements are kept: cache_directory() / activation-precision.json; empty when it is.
std::filesystem::path precision_cache_file();

}  // namespace fp4serve::model
