// SPDX-License-Identifier: Apache-2.0
// Machine roofs measured in the benchmark binary itself, with the same SIMD target and thread count as the
// kernels: read bandwidth and fp32 FMA peak.
#pragma once

#include <algorithm>

#include <cstddef>

namespace fp4serve::bench {

/// Bytes/s of stream_read over `bytes` (choose > LLC) on transparent huge pages (advised), all engine
/// threads, best of `repeats`.
double measure_read_bandwidth(size_t bytes, int repeats);

/// A streaming SIMD XOR of the 32-bit words of [p, p + bytes) (p 64-byte aligned), split over all engine threads
/// as the kernels split their work: the read roof of exactly those bytes, for probes interleaved with a kernel's
/// calls. Returns the bytes read (each thread's share rounded down to 1 KiB).
size_t stream_read(const std::byte* p, size_t bytes);

/// fp32 FLOP/s (an FMA counts 2) of independent FMA chains in registers, all engine threads, best of `repeats`;
/// each thread's rate over its own CPU time, summed (the threads' rate while they run, whatever else the machine
/// runs).
double measure_fma_peak(int repeats);

/// The compute roofs of the loops this CPU has, in multiply-add ops/s (a multiply-add counts 2, whatever the
/// element type), each from independent chains in registers on all engine threads, best of `repeats`, rated by
/// CPU time as measure_fma_peak; 0 where the CPU or the dispatched target lacks the instruction. AMX tiles are
/// probed only with `amx` (the caller's kernels::amx_active(): CPUID, the OS and Linux's tile permission checked).
struct ComputeRoofs {
  double fma = 0;       ///< fp32 FMA (the Fp32 panel GEMM)
  double bf16_dot = 0;  ///< AVX512-BF16 vdpbf16ps (ActivationPrecision::Bf16)
  double int8_dot = 0;  ///< AVX512-VNNI vpdpbusd, u8·s8 → s32 (ActivationPrecision::Int8)
  double amx_bf16 = 0;  ///< AMX TDPBF16PS (ActivationPrecision::Bf16 above the GEMV's rows where AMX is usable)
  /// The compute roof: the best of the loops, the ceiling any of the kernels could reach.
  double best() const { return std::max({fma, bf16_dot, int8_dot, amx_bf16}); }
};
ComputeRoofs measure_compute_roofs(int repeats, bool amx);

}  // namespace fp4serve::bench
