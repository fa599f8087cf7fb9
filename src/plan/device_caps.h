// SPDX-License-Identifier: Apache-2.0
// What the execution device can do, detected at run time (CPU ISA via cpuid; NVIDIA GPU via the driver library
// loaded with dlopen, so the build needs no CUDA) or named on the command line for dry runs (`--device`).
// Scheme selection (select.h) asks only the questions below; the device buckets follow docs/SCHEMES.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "quant/block_format.h"

namespace fp4serve::plan {

enum class DeviceKind : uint8_t { Cpu, Cuda };

/// x86 / arm CPU features that the CPU kernels dispatch on.
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool amx_bf16 = false;
  bool neon = false;
  bool sve = false;  ///< Arm SVE (any vector length): the kernels' SVE / SVE_256 Highway targets
};

struct DeviceCaps {
  DeviceKind kind = DeviceKind::Cpu;
  int sm = 0;                ///< CUDA compute capability × 10 + minor (90 for H100), 0 for a CPU
  std::string name;          ///< "NVIDIA H200", "x86-64 CPU (avx2 fma f16c)", or "sm90 (dry run)"
  bool detected = false;     ///< true when read from the hardware, false for a --device dry run
  CpuFeatures cpu;           ///< host features (filled for CPU devices)
  uint64_t memory_bytes = 0; ///< GPU memory when detected, else 0

  /// "cpu", "sm80", "sm90", … for tables and messages.
  std::string label() const;
  /// Block-scaled FP4 MMA with NVFP4 scales (sm100/101/103/110 and sm120/121).
  bool has_nvfp4_mma() const { return kind == DeviceKind::Cuda && sm >= 100; }
  /// Block-scaled FP4 MMA with MXFP4 (E8M0) scales that fp4serve uses: the sm100 family only; on sm120 the
  /// table serves MXFP4 weight-only (SCHEMES.md decision table).
  bool has_mxfp4_mma() const { return kind == DeviceKind::Cuda && sm >= 100 && sm < 120; }
  /// FP4 MMA that fp4serve runs for block format `f` (the two above; a new format states its own).
  bool has_fp4_mma(quant::BlockFormat f) const {
    switch (f) {
      case quant::BlockFormat::Nvfp4: return has_nvfp4_mma();
      case quant::BlockFormat::Mxfp4: return has_mxfp4_mma();
    }
    return false;
  }
  /// FP8 tensor-core MMA (sm89 and later).
  bool has_fp8_mma() const { return kind == DeviceKind::Cuda && sm >= 89; }
  /// Runs 16-bit weight-only kernels: any CPU, CUDA from sm80 (below: no 4-bit float support, SCHEMES.md).
  bool runs_weight_only() const { return kind == DeviceKind::Cpu || sm >= 80; }
};

/// The host CPU (cpuid / __builtin_cpu_supports). Never throws.
DeviceCaps detect_cpu();

/// The first CUDA device, read through the driver library (libcuda.so.1, loaded at run time); std::nullopt when
/// no driver or no device is present. Never throws. The driver library stays loaded for the rest of the process
/// (it is never dlclose-d after cuInit).
std::optional<DeviceCaps> detect_cuda();

/// Parses `--device`: "auto" (a GPU when one is present, else the CPU), "cpu", "cuda" (the detected GPU), or
/// "smNN" / "smNNN" (a dry run for that compute capability, e.g. sm80, sm86, sm89, sm90, sm100, sm120; sm75 and
/// below parse so that the plan can refuse them with a reason). Throws UsageError for any other text and for
/// "cuda" when no GPU is found.
DeviceCaps resolve_device(std::string_view text);

}  // namespace fp4serve::plan
