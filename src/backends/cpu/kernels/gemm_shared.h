// SPDX-License-Identifier: Apache-2.0
// Declarations shared by the GEMM translation units (not a public API): the scalar element decoder and
// epilogue that both the reference and the SIMD kernels use, and the per-target entry point.
#pragma once

#include <hwy/cache_control.h>

#include <cstdint>
#include <vector>

#include "backends/cpu/prepare/prepared_linear.h"

namespace fp4serve::kernels {

/// W[n, k] in PREPARED column order without the NVFP4 global scale (block scales, int4 offsets included).
float decode_weight(const prepare::PreparedLinear& w, int64_t n, int64_t k);

/// Software prefetch distance, in bytes ahead of the one weight stream they read, of the dense decode kernels
/// (bf16 / FP8 / int8 rows: an lm_head). On an AMD EPYC with DRAM behind a 32 MiB L3, bench_gemm_fp4 bf16 M = 1,
/// one thread, 1 KiB → 8 KiB: 4096² 1368–1473 → 1079–1144 µs, the default model's lm_head 49152×576 1876–2007 →
/// 1801–1855 µs (2 and 4 KiB in between). (Where it began: the FP4 GEMVs, then one stream per tile, on an Intel
/// VM: no prefetch → 1 KiB took NVFP4 4096² from 1410 to 903 µs; they now use ItemAheadPrefetch.)
inline constexpr uintptr_t kPrefetchAhead = 8192;

/// How far ahead, in bytes of codes, the fused FP4 GEMVs prefetch whole work items (ItemAheadPrefetch in
/// fp4_scales-inl.h; their measurements are there).
inline constexpr int64_t kItemAheadBytes = 8192;

/// The software prefetch of the weight streams (the decode GEMVs, and the panel decoders and int8 tiles of the
/// batched GEMMs): the line at p into L2 (prefetcht1 on x86, PLDL2KEEP on Arm), not L1. A prefetcht0 holds one of
/// the L1's few miss buffers until its line arrives from DRAM; with a line requested per line read the buffers stay
/// full and the core's own loads queue behind them (the KV cache's prefetches found the same: kv_rows-inl.h).
/// bench_gemm_fp4 M = 1 on the Zen 4 VM, cold weights, weight GB/s, prefetcht0 against prefetcht1 alternating over 3
/// rounds in one session, one thread: bf16 4096×11008 (fp32 x) 15.4–16.9 → 20.2–22.1, NVFP4 4096² (bf16 x) 16.2–16.8
/// → 16.5–23.9, MXFP4 5760×2880 (bf16 x) 14.4–16.9 → 22.2–23.9, (int8 x) 17.6–20.1 → 18.3–23.5; two threads mostly
/// 1.2–1.5× where the VM's bandwidth allowed (docs/performance.md, "Prefetching the weights into L2"); gpt-oss-20b's
/// prefill tokens/s were level in bench-scale rounds before and after. Distances of 4–32 KiB with prefetcht1
/// measured within the noise of 8 KiB. Arm was not measured. Always inline: as a plain inline function GCC 12 left
/// the prefetch out of line for the per-target kernels, found it free of side effects and deleted every call.
HWY_INLINE void prefetch_weights(const void* p) { __builtin_prefetch(p, 0, 2); }

/// prefetch_weights of the line kPrefetchAhead bytes after p (a hint: past the end of the weights it is harmless,
/// and the address is formed as an integer so that no pointer leaves its array).
HWY_INLINE void prefetch_ahead(const void* p) {
  prefetch_weights(reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) + kPrefetchAhead));
}

/// acc (Σ x·w for output row n) → final value: NVFP4 global scale, then bias. Inline: the fused decode kernels
/// call it once per output element (an out-of-line call was 2% of a decode step).
inline float apply_epilogue(const prepare::PreparedLinear& w, int64_t n, float acc) {
  if (!w.global_scale.empty()) {
    const float g = w.global_scale[static_cast<size_t>(n)];
    acc = w.convention == prepare::GlobalScaleConvention::Divisor ? acc / g : acc * g;
  }
  return w.bias.empty() ? acc : acc + w.bias[static_cast<size_t>(n)];
}

/// Scalar GEMM on x already in prepared column order (k_perm applied): the fallback target's kernel.
void reference_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// The fused small-m NVFP4/MXFP4 GEMV (gemm_gemv.cpp) for the best supported target, x in prepared column
/// order. Returns false (and writes nothing) when the layout or target has no fused path or m is outside
/// [1, gemv_max_rows()].
bool gemv_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// Whether the kernels may run AVX512-BF16 dot products now: the CPU has them (cpuid; x86 GCC builds only) and
/// set_bf16_dot_allowed (backends/cpu/kernels/linear.h) has not switched them off. Read at every call.
bool bf16_dot_usable();

/// ActivationPrecision::Bf16 through the fused GEMV with AVX512-BF16 (x rounded to bf16; Fp4 layouts, m ≤
/// gemv_max_rows()). Returns false (and writes nothing) where that path does not exist or is switched off.
bool gemv_bf16_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// ActivationPrecision::Bf16 for any m ≥ 1 (gemm_simd.cpp): that GEMV, else the bf16-pair panel GEMM, else x
/// rounded to bf16 and the fp32 kernels.
void bf16_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// A bf16 Dense layer (an lm_head, a tied embedding), an FP8 layer, an FP8 / Int8 lm_head copy or an Int4 layer
/// whose ActivationPrecision allows x in bf16 (Bf16, Bf16DecodeInt8; not in batch-invariant mode): the fused GEMV on
/// fp32 x where it serves m (m ≤ 4, not Int4; it streams the weights, so bf16 dot products would not make it
/// faster), else x rounded to bf16 on AMX tiles, or vdpbf16ps on the stored tiles (bf16_direct_gemm's rows), or the
/// bf16-pair panel GEMM. bf16 weights are exact there; FP8 / Int8 ones are code · scale and Int4 ones (q − z)·s
/// rounded to bf16, the bf16 weights a bf16 dequantization gives. Returns false (and writes nothing) where none runs
/// (no AVX512-BF16 or switched off, K % 16 != 0, f32 storage, an odd scale group, an Int4 group of part of an
/// octet): the caller then keeps fp32 x.
bool bf16_dot_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// Rows of x up to which bf16_direct_gemm serves a call (in passes of 16); more take the panel GEMM. 11008×4096 at
/// M = 64 ran level with the panel, at M = 256 0.88× its speed (bf16 Dense, Zen 4).
inline constexpr int64_t kBf16DirectMaxRows = 64;

/// ActivationPrecision::Bf16 on the stored tiles of a bf16 Dense, FP8 or Int8 layer (gemm_bf16_direct.cpp): y [m, N]
/// from xp [m][K/2], x already rounded to bf16 pairs (x[2q] in the low half), vdpbf16ps on the weights as they lie
/// (FP8 / Int8: code · scale rounded to bf16, as decode_bf16_panel gives them), the epilogue (bias) applied.
/// Returns false (and writes nothing) where the target has no such kernel (not AVX-512 with GCC; the caller checks
/// bf16_dot_usable) or the layer does not fit: another layout, f32 storage, K % 16 != 0, an odd scale group,
/// m < 1 or m > kBf16DirectMaxRows (FP8 / Int8: m > 16, where the panel GEMM's single decode wins).
bool bf16_direct_gemm(const prepare::PreparedLinear& w, const uint32_t* xp, int64_t m, float* y);

/// The bf16-pair panel of the bf16 panel GEMM (gemm_simd.cpp), for the dispatched Highway target: columns
/// [k0, k0 + kc) of panel p of w (Fp4; Dense with bf16 storage, FP8 and Int8 with an even scale group, Int4 with
/// groups of whole octets, these four with K % 16 == 0) as panel[(kk/2)·R + r] = bf16(W[p·R + r, k0 + kk]) |
/// bf16(W[p·R + r, k0 + kk + 1]) << 16 for even kk < kc, R the returned panel width (32 on AVX-512: Fp4 and Dense
/// weights exact, block scales applied, the NVFP4 global scale left out; FP8 / Int8 code · scale and Int4 (q − z)·s
/// rounded to nearest even; rows past N zero). k0 a multiple of 8, kc even (Int4: a multiple of 8), the panel
/// kc/2 · R words. Returns 0 (and writes nothing) where the target or the
/// layout has no such panel.
int64_t decode_bf16_panel(const prepare::PreparedLinear& w, int64_t p, int64_t k0, int64_t kc, uint32_t* panel);

/// ActivationPrecision::Bf16 on AMX tiles (gemm_amx.cpp): x rounded to bf16 times decode_bf16_panel's panels with
/// TDPBF16PS, where set_amx_use (linear.h) and the CPU allow it (amx_status), bf16 dot products are usable and the
/// target has the panel. Returns false (and writes nothing) otherwise.
bool amx_bf16_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// The AMX kernel's micro-step on small exact integers (the check amx_status's forked probe runs on the hardware
/// tiles) on emulated tiles: true where it gives the exact integer result. False in builds without the AMX kernel.
bool amx_tile_step_check_emulated();

/// Largest m the fused GEMV serves on the current target: 4 (AVX2, NEON, SVE), 8 (AVX-512), 0 (EMU128).
int64_t gemv_max_rows();

/// ActivationPrecision::Int8 for Fp4 layouts and the Int4 layouts int8_takes_int4 accepts (gemm_int8.cpp), any
/// m ≥ 1, x in prepared column order: quantizes x in blocks of int8_activation_block(w) columns, then the
/// integer-dot kernel of the best supported target (a scalar loop of the same math on targets without one).
void int8_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// Columns per int8 activation block of Int4 weights: NVFP4's 16, whatever the weight group (a block of 32 doubled
/// the int8 path's mean KLD on the default model, 64 tripled it: performance.md "Why NVFP4 stops near 0.6").
inline constexpr int64_t kInt4ActivationBlock = 16;

/// The int8 activation block of w: its weight group for Fp4 (16 NVFP4, 32 MXFP4), kInt4ActivationBlock for Int4.
inline int64_t int8_activation_block(const prepare::PreparedLinear& w) {
  return w.layout == prepare::WeightLayout::Int4 ? kInt4ActivationBlock : w.group_size;
}

/// Whether int8_gemm serves an Int4 layer: the weight group a multiple of kInt4ActivationBlock (an activation
/// block never straddles two weight groups) and K a multiple of the group (no partial last group, which
/// prepare_int4 accepts). Others (a channel-wise group of odd K) keep fp32 x.
inline bool int8_takes_int4(const prepare::PreparedLinear& w) {
  return w.layout == prepare::WeightLayout::Int4 && w.group_size > 0 && w.group_size % kInt4ActivationBlock == 0 &&
         w.in_features % w.group_size == 0;
}

/// Per row of x [m, k] and block of `block` columns (k a multiple of block), amax = max |x| of the block:
/// a block is fine when (amax/127)² ≥ fine_ratio² · the mean of (amax/127)² over the row's blocks with a finite
/// amax > 0, coarse otherwise. Coarse: d = amax/127, Q = round-to-nearest-even(x · 127/amax) ∈ [−127, 127];
/// fine: d = amax/32512, Q = RNE(x · 32512/amax) ∈ [−32512, 32512], stored as hi = ⌊(Q + 128)/256⌋ ∈ [−127, 127]
/// in q and lo = Q − 256·hi ∈ [−128, 127] in r (r = 0 in coarse blocks). Q = 0 in a block whose amax is 0, inf
/// or NaN, with d = 0, inf, NaN. q, r [m, k] in column order, or per octet of columns as [c0 c2 c4 c6 c1 c3 c5 c7]
/// with octet_order; d, neg_off (−12·Σ Q), fine (0 / 1) [m, k/block]; neg_off and fine may be null.
void quantize_int8_blocks(const float* x, int64_t m, int64_t k, int64_t block, bool octet_order, float fine_ratio,
                          int8_t* q, int8_t* r, float* d, int32_t* neg_off, uint8_t* fine);

/// Rows of x the SIMD int8 kernel of the best supported target serves in one pass over the weights: 4 (AVX2),
/// 8 (AVX-512), 0 where it has none (int8_gemm then runs a scalar loop): ActivationPrecision::Int8Decode's bound.
int64_t int8_one_pass_rows();

/// Highway targets compiled into gemm_int8.cpp (AVX3_DL included) and supported by this CPU, best first.
std::vector<int64_t> int8_targets();
const char* int8_target_name();

/// The SIMD GEMM for the best supported target, x in prepared column order (defined in gemm_simd.cpp).
void gemm_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// The GEMV of bf16 Dense, FP8 and Int8 layers (gemm_gemv_dense.cpp) for any m ≥ 1, rows in chunks of 4 with one
/// arithmetic per row (the decode rows, and every m in batch-invariant mode): y [m, N] from fp32 x [m, K], the
/// epilogue applied. The caller checks the layout's conditions (bf16 storage with K a multiple of the vector's
/// columns for Dense). Returns false (and writes nothing) where the target has no such kernel (not x86 AVX2 /
/// AVX-512).
bool dense_rows_gemv(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// Batch-invariant mode (batch_invariant.h): the fused GEMV of the best supported target for any m ≥ 1, rows in
/// chunks of one fixed size inside each work item, one arithmetic per row for every m (gemm_gemv.cpp). bf16_input:
/// ActivationPrecision::Bf16 of an Fp4 layout. Returns false (and writes nothing) where that target has no such
/// GEMV for the layout (Int4, f32 Dense, EMU128; bf16_input without AVX512-BF16 pairs).
bool gemv_invariant_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y, bool bf16_input);

/// gemm_dispatch in batch-invariant mode: gemv_invariant_dispatch, else the panel GEMM for every m (a sequential
/// FMA chain over K per output element, whatever m and the threads), or the scalar reference (EMU128).
void invariant_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// bf16_gemm in batch-invariant mode: the pair GEMV (AVX512-BF16) for every m, else x rounded to bf16 and
/// invariant_gemm.
void invariant_bf16_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

}  // namespace fp4serve::kernels
