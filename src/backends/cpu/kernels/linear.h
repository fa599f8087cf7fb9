// SPDX-License-Identifier: Apache-2.0
// y = x·Wᵀ (+ bias) for every prepared weight layout (NVFP4, MXFP4, int4, FP8, dense) on the CPU.
// The SIMD code is compiled for several targets (Highway: AVX-512 and AVX2 on x86, NEON, SVE and SVE_256 on
// Arm, and a portable fallback that runs the scalar reference) and chosen at run time; threads come from
// core::set_num_threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/prepare/prepared_linear.h"

namespace fp4serve::kernels {

/// What linear() does to its input x before the GEMM (not plan::ActivationQuant, the --activation-quant policy
/// that decides, per layer, which of these a scheme gets).
enum class ActivationEmulation : uint8_t {
  None,          ///< activations stay fp32
  EmulateNvfp4,  ///< W4A4 emulation: x is quantized to NVFP4 exactly as compressed-tensors does, then dequantized
  EmulateMxfp4,  ///< W4A4 emulation: x is quantized to MXFP4 (E8M0 per 32, dynamic) as compressed-tensors does
};

/// y[m, n] = Σ_k x[m, k] · W[n, k] (+ bias[n]), fp32 accumulation.
/// x: [m, K] fp32 row-major (K = w.in_features); y: [m, N] fp32 row-major (N = w.out_features); m ≥ 0.
/// Block scales are applied per weight group, the NVFP4 global scale once per output element (divided for the
/// Divisor convention, multiplied for Multiplier). NVFP4/MXFP4 with m ≤ 4 (AVX2, NEON, SVE) / 8 (AVX-512) run a fused
/// GEMV that decodes E2M1 codes in registers and applies each block scale once per 16/32-column partial sum,
/// threads splitting N; bf16 Dense, FP8 and Int8 layers with m ≤ 4 run a GEMV that multiplies the
/// loaded weights in registers (backends/cpu/kernels/gemm_gemv.cpp); other cases with m ≤ 6 (AVX2) / 12 (AVX-512) run
/// the streaming decode path (weights
/// decoded in L1-sized chunks, each used by all m rows); larger m decodes a whole row panel once and runs a
/// register-blocked fp32 micro-kernel over it.
/// With w.activation_precision == Int8 (Fp4 (block-format) and Int4 layers; other layouts ignore it) and aq == None, each row
/// of x is quantized per weight group (16 / 32 columns) by quantize_activations_int8 with
/// kInt8ActivationFineRatio and the products are integer dot products: y[m, n] = Σ_g d[m, g] · s[n, g] ·
/// Σ_{k∈g} (256·q + r)[m, k] · e2m1[n, k], fp32 per group (the error against the fp32 path is bounded by
/// Σ_k |W[n, k]| · the half step of x's block, see quantize_activations_int8); any m, in chunks of 4 (AVX2) /
/// 8 (AVX-512) rows. Int4 layers whose K and weight group are multiples of 16 (int8_takes_int4) take Int8 too, x
/// in blocks of 16 columns inside each weight group: y[m, n] = Σ_g (s[n, g] · Σ_{b∈g} d[m, b] · Σ_{k∈b} Q·nibble
/// + o[n, g] · Σ_{k∈g} x̂[m, k]), w = nibble·s + o (prepared_linear.h); other Int4 layers keep fp32 x.
/// Int8Decode: the same for m ≤ the rows the SIMD int8 kernel serves in one pass over the
/// weights (4 on AVX2, 8 on AVX-512: decode steps), the fp32 path above it and on targets without that kernel.
/// Bf16DecodeInt8: bf16 for those decode rows and int8 above (precision_for_rows).
/// A bf16 Dense layer (an lm_head, a tied embedding) with Bf16 or Bf16DecodeInt8 (any m) and aq == None, outside
/// batch-invariant mode: m ≤ 4 runs the fused GEMV on fp32 x as above; larger m, where AVX512-BF16 dot products run
/// (bf16_dot_active) and K % 16 == 0, multiplies x rounded to bf16 (nearest even) with the exact bf16 weights in
/// vdpbf16ps (fp32 accumulation), as GPU engines compute a bf16 lm_head: straight on the stored tiles up to 64 rows
/// (16 per pass; a server's decode steps), on decoded panels above (on AMX tiles where usable, for every m > 4);
/// elsewhere fp32 x. An Fp8 layer (an FP8 checkpoint's, or a `--lm-head-dtype fp8` copy) or an Int8 lm_head copy
/// under the same conditions (and an even scale group) multiplies x in bf16 with code · scale rounded to bf16
/// (nearest even: the bf16 weights compressed-tensors and ModelOpt dequantize FP8 to), as engines run FP8 weights
/// on GPUs without FP8 units: m ≤ 4 keeps the fp32-x GEMV (whatever the scales), 5–16 rows run on the stored
/// bytes, more on decoded panels (AMX tiles where usable, for every m > 4). An Int4 layer under the same
/// conditions (K % 16 == 0, groups of whole octets) multiplies x in bf16 with (q − z)·s rounded to bf16 on decoded
/// panels at every m (AMX tiles where usable; int4 has no GEMV), its act-order x permuted first; Int4 rows that
/// Bf16DecodeInt8 gives to int8 take the int8 kernel above. Fp32, Int8, Int8Decode: fp32 x.
/// EmulateNvfp4 (W4A4, docs/FORMATS.md §2.1): per row and 16-column group,
/// s_a = E4M3(clamp(igs·amax/6, ±448)) (0 → 0.125), x_q = E2M1(clamp(x / (s_a/igs), ±6)), and the GEMM runs
/// on x_q·s_a/igs; igs = w.input_global_scale.
/// EmulateMxfp4 (W4A4 MXFP4): per row and 32-column group, emulate_mxfp4_activations, then the GEMM on the
/// fake-quantized x (the MXFP4 weights are exact in the reference's BF16 decompression, so no dense copy).
/// In batch-invariant mode (batch_invariant.h) the kernel and the activation precision do not depend on m: each row
/// of y is bit for bit what linear() gives for that row alone, on any number of threads.
/// Throws UsageError when x or y is null with m > 0, m < 0, EmulateNvfp4 is asked for a layer that is not
/// NVFP4 or has no input_global_scale, or EmulateMxfp4 for a layer that is not MXFP4 (or dense).
void linear(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y,
            ActivationEmulation aq = ActivationEmulation::None);

/// The precision linear() runs a call of m rows with: Fp32, Int8 or Bf16 (the decode / batched halves of
/// Int8Decode and Bf16DecodeInt8 split at the rows the SIMD int8 kernel serves in one pass; where there is no SIMD
/// int8 kernel every call takes the non-int8 half).
prepare::ActivationPrecision precision_for_rows(prepare::ActivationPrecision precision, int64_t m);

/// What `--activation-precision auto` measured on this CPU (probe_activation_precision).
struct PrecisionProbe {
  prepare::ActivationPrecision choice = prepare::ActivationPrecision::Bf16;  ///< Bf16 or Bf16DecodeInt8
  /// CPU seconds (all threads) per call, the least of 3 samples, on the probe layer at the decode rows (4), at a
  /// server's batched decode step (16 rows) and at prefill-sized blocks (64 rows).
  double bf16_decode_s = 0, int8_decode_s = 0, bf16_step_s = 0, int8_step_s = 0, bf16_batched_s = 0,
         int8_batched_s = 0;
  bool measured = false;  ///< false: no SIMD int8 or bf16-dot kernel here, so nothing to compare (choice Bf16)
  int64_t out_features = 0, in_features = 0;  ///< the shape measured (the one asked for, at least 256 × 256)
  /// int8's time against bf16's over the batched sizes: the geometric mean of the ratios at 16 and at 64 rows.
  double int8_ratio() const;
};
/// `auto`'s choice between the bf16 and the int8 activation paths of FP4 layers, by measurement: both run an NVFP4
/// layer of the model's own shape [out_features, in_features] (the caller passes its MLP's; at least 256 × 256) at
/// 4, 16 and 64 rows, interleaved; each time is the least of 3 samples of CPU time (all threads) per call, a sample
/// being ≥ 20 ms of calls. Int8 is taken for the batched rows (Bf16DecodeInt8) where int8_ratio() ≤ 0.8 (both a
/// server's decode steps of 9–32 streams and prefill chunks run those rows), else Bf16; decode rows stay bf16
/// (memory-bound: the 4-row times are reported, not acted on). The margin keeps a near-tie on bf16, the default
/// before the probe; `--activation-precision` pins it, and the caller keeps the answer per machine
/// (backends/activation_precision.h) so that runs choose alike.
/// The balance differs by CPU, shape and rows: on a 2-core AMD EPYC (Zen 4), [1536, 576], int8 took 0.60–0.66× bf16's
/// CPU time at 16 rows and 0.77–1.0× at 64 (0.64× at 64 rows on [4096, 4096]; `bench model` prefill ran 1.11× /
/// 1.31× faster with int8 on the default model / a Llama-3.2-3B-shaped one); an Intel Xeon with VNNI was measured
/// at 2.6× for int8. Costs about a third of a second of CPU time. Both paths meet the accuracy bar (mean KLD ≤ 1e-3
/// against the 16-bit path on the default model, kInt8ActivationFineRatio). Measured with the thread count the
/// model will run with.
PrecisionProbe probe_activation_precision(int64_t out_features, int64_t in_features);

/// Writes the dequantized weight [N, K] fp32 (global scale included) in the checkpoint's column order.
/// NVFP4: q·(s / gs) with the division in fp32 (Divisor; compressed-tensors' op order) or q·(s·ws2)
/// (Multiplier; ModelOpt's), so bf16(out) equals the producers' bf16 references bit for bit. MXFP4:
/// q·2^(b−127). Int4: (q − z)·scale. FP8: e4m3·scale. Dense: the stored value. A test and benchmark helper.
void dequantize(const prepare::PreparedLinear& w, float* out);

/// The plain scalar reference for linear() (no SIMD, one thread, ActivationEmulation::None): the fallback
/// target's implementation and a test oracle.
void linear_reference(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// In place, rows of x [m, K]: the NVFP4 activation quantize–dequantize of ActivationEmulation::EmulateNvfp4.
/// K must be a multiple of 16 and igs finite > 0 (throws UsageError).
void emulate_nvfp4_activations(float* x, int64_t m, int64_t k, float input_global_scale);

/// The activation quantization of ActivationPrecision::Int8, per row of x [m, k] and block of `block` columns
/// (llama.cpp's Q8_0 rule on the weight's group, with a 16-bit grid on the blocks that dominate the row's
/// rounding error): with a = max |x| of the block, a block is *fine* when (a/127)² ≥ fine_ratio² · mean of
/// (a/127)² over the row's blocks with a finite a > 0. Every block gets d = a/32512 (= a/127 / 256) and
/// x ≈ (256·q + r)·d: a coarse block has q = round-to-nearest-even(x · 127/a) ∈ [−127, 127] and r = 0, a fine
/// one Q = RNE(x · 32512/a) ∈ [−32512, 32512] split as q = ⌊(Q + 128)/256⌋ ∈ [−127, 127], r = Q − 256·q
/// ∈ [−128, 127]. Rounding error ≤ 128·d (coarse) resp. d/2 (fine) per element. A block whose a is 0 (inf,
/// NaN) gets q = r = 0 and d = 0 (inf, NaN), so non-finite inputs reach the outputs. fine_ratio 0 makes every
/// block fine, +inf none (plain Q8_0). q, r: [m, k] int8; d, fine (1 / 0; may be null): [m, k/block].
/// Throws UsageError when block < 1, k is not a multiple of block, m < 0 or fine_ratio is NaN or negative.
void quantize_activations_int8(const float* x, int64_t m, int64_t k, int64_t block, float fine_ratio, int8_t* q,
                               int8_t* r, float* d, uint8_t* fine = nullptr);

/// The fine_ratio linear() uses for ActivationPrecision::Int8. Measured on the default model (mean KLD against
/// the fp32 path over docs/quality.md's 2048-token perplexity text, one thread): ratio inf (plain Q8_0) 1.49e-3,
/// 3: 6.6e-4, 2: 5.1e-4, 1.5: 3.9e-4, 1: 2.7e-4; decode speed fell with lower ratios (more second dots), so 2.
inline constexpr float kInt8ActivationFineRatio = 2.f;

/// Whether the best supported target has the SIMD int8-activation kernel (AVX2 or AVX-512): elsewhere Int8 runs a
/// scalar loop.
bool int8_kernel_active();

/// Highway targets the int8-activation kernels are compiled for (also AVX3_DL, i.e. AVX-512 VNNI) and this CPU
/// supports, best first, and the one they dispatch to now.
std::vector<int64_t> int8_gemm_targets();
const char* int8_gemm_target_name();

/// In place, rows of x [m, K]: the MXFP4 activation quantize–dequantize of compressed-tensors 0.19 for dynamic
/// `group` activations with group_size 32 and uint8 (E8M0) scales (`calculate_qparams` → `generate_mx_scales`,
/// `_quantize_dequantize`), per 32-column group:
///   amax = max |x| (NaN propagates); p = bits(amax) + 2^21 masked to sign+exponent (`round_to_power_2`:
///   rounds up from mantissa 1.75); e = clamp(127 + log2(p) − 2, 0, 255) (p = 0 → 0, p = inf → 255);
///   s = 2^(e − 127) (e = 0: the fp32 subnormal 2^-127; e = 255: +inf); x ← E2M1(clamp(x / s, ±6)) · s,
///   a NaN quotient staying NaN. So a group whose amax rounds to inf (an ±inf element, or amax ≥ 1.75·2^127)
///   becomes all NaN, and a group holding a NaN gets e = 0 (what torch's NaN → uint8 cast gives on x86): its NaN
///   stays NaN and every other element saturates to ±6·2^-127 — both as the reference computes them.
/// K must be a multiple of 32 (throws UsageError).
void emulate_mxfp4_activations(float* x, int64_t m, int64_t k);

/// The E8M0 exponent byte compressed-tensors' MXFP4 activation observer derives from a group's amax (above;
/// NaN → 0).
uint8_t mxfp4_activation_exponent(float amax);

/// The fused NVFP4/MXFP4 GEMV of the AVX-512 target (m ≤ 8, ActivationPrecision::Fp32) multiplies with
/// AVX512-BF16 dot products (vdpbf16ps) on CPUs that have them, x carried as hi = bf16(x) plus lo = bf16(x − hi)
/// (|x − hi − lo| ≤ 2^−17·|x|, so y gains at most 2^−17·Σ_k |x[k]·W[n, k]| over the fp32 path's error; vdpbf16ps
/// reads subnormals as 0, so lo is lost for |x| below ≈ 2^−117). The same switch governs ActivationPrecision::Bf16's
/// dot-product kernels. On by default; off, the same CPU runs the FMA kernels, which keep x exact (tests and
/// bench_gemm_fp4 compare the two). A process-wide switch, read at every call.
void set_bf16_dot_allowed(bool allowed);

/// Whether linear() on the current target takes that path now: the AVX-512 target, a CPU with AVX512-BF16, the
/// switch on (and a GCC build).
bool bf16_dot_active();

/// Intel AMX for ActivationPrecision::Bf16 (FP4 layers, and bf16 Dense, FP8, Int8 and Int4 layers where the
/// precision allows bf16 x) at more rows than the fused GEMVs serve (m > 8 for FP4, m > 4 for Dense, FP8 and Int8,
/// every m for Int4): the bf16 panel GEMM's decoded weight panels (exact in bf16; FP8 / Int8: code · scale, Int4:
/// (q − z)·s, rounded to bf16) multiplied with x
/// rounded to bf16 on TDPBF16PS tiles (16 rows × 32 columns of K per instruction, fp32 sums), so the numbers are
/// those of the vdpbf16ps panel up to summation order.
/// - Hardware (default): where amx_status().usable.
/// - Off: never (the vdpbf16ps panel GEMM serves those rows).
/// - Emulated: the same driver with each tile instruction replaced by C++ that follows the Intel SDM's pseudo-code
///   (TILELOADD, TILEZERO, TDPBF16PS with DAZ, TILESTORED), so tests check the blocking, padding and tile addressing
///   against float64 on CPUs without AMX. Slow: for tests only. Needs AVX512-BF16 (x rounding) like Hardware.
/// A process-wide switch, read at every call.
enum class AmxUse { Hardware, Off, Emulated };
void set_amx_use(AmxUse use);

/// What this CPU and kernel can do with AMX, found once by trying: CPUID (AMX-TILE, AMX-BF16, AVX512-BF16), XCR0
/// (the OS saves tile state), Linux's permission (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without it a
/// tile instruction raises SIGILL), then in a forked child the kernel's micro-step (TDPBF16PS on real tiles) on
/// small integers whose exact results are checked, so a CPU or hypervisor that claims AMX and cannot run it, or a
/// kernel bug on real tiles, costs the child and turns AMX off, not the process or its logits. FP4SERVE_AMX=off
/// skips all of it.
/// usable: every step passed (x86-64 GCC builds only). reason: one line for `--version` / `explain`.
struct AmxStatus {
  bool usable = false;
  std::string reason;
};
const AmxStatus& amx_status();

/// Whether bf16 GEMMs above the GEMV rows run on AMX tiles now: amx_status().usable, set_amx_use Hardware, and
/// bf16 dot products active (bf16_dot_active).
bool amx_active();

/// Highway targets (HWY_AVX3, HWY_AVX2, HWY_EMU128, ...) compiled into the GEMM and supported by this CPU,
/// best first; tests iterate over them with hwy::SetSupportedTargetsForTest.
std::vector<int64_t> gemm_targets();

/// Name of the target linear() dispatches to now, e.g. "AVX3".
const char* gemm_target_name();

}  // namespace fp4serve::kernels
