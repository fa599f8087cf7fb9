// SPDX-License-Identifier: Apache-2.0
// What the execution device can do, detected at run time (CPU ISA via cpuid; NVIDIA GPU via the driver library
// loaded with dlopen, so the build needs no CUDA) or a dry run for a compute capability (`explain --device smNN`).
// Scheme selection (select.h) asks only the questions below; the device buckets follow docs/SCHEMES.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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
  /// Has block-scaled FP4 MMA units (sm100/101/103/110, sm120/121): a hardware fact, for the plan's reasons.
  /// Which FP4 formats the project's kernels run on them is the CUDA catalogue's answer
  /// (backends/cuda/kernels/limits.h native_fp4_runs_on), not this.
  bool has_nvfp4_mma() const { return kind == DeviceKind::Cuda && sm >= 100; }
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

/// The device a command runs on (`--device`, parsed by the app): a GPU when one is present, else the CPU (Auto);
/// the CPU; the detected GPU.
enum class DeviceChoice : uint8_t { Auto, Cpu, Cuda };
std::string_view device_choice_name(DeviceChoice choice);  ///< "auto", "cpu", "cuda"

/// The device `choice` names, detected. Throws UsageError for Cuda when no GPU is found.
DeviceCaps resolve_device(DeviceChoice choice);

/// A dry run for compute capability `sm` (major × 10 + minor: 80, 86, 89, 90, 100, 120; below 80 too, so that the
/// plan can refuse it with a reason): a CUDA DeviceCaps with `detected` false and the host's CPU features.
/// Throws UsageError outside 10 … 199.
DeviceCaps dry_run_device(int sm);

}  // namespace fp4serve::plan
