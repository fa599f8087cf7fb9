// SPDX-License-Identifier: Apache-2.0
// A Linear layer's weights in the layout the CPU GEMM kernels read (src/backends/cpu/kernels/linear.h). Built once at
// load by the functions in repack.h from checkpoint tensors; kernels never see checkpoint layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "quant/block_format.h"

namespace fp4serve::prepare {

/// Kernel layout of a prepared weight; the block format of an Fp4 layout is `PreparedLinear::block_format`.
enum class WeightLayout : uint8_t { Fp4, Int4, Fp8, Int8, Dense };

using quant::GlobalScaleConvention;

/// Storage of Dense weights: bf16 checkpoints stay bf16 (half the bytes per token); f16 and f32 become f32.
enum class DenseStorage : uint8_t { Bf16, F32 };

/// How linear() multiplies x with Fp4 (block-format) weights (other layouts always run fp32 activations).
enum class ActivationPrecision : uint8_t {
  Fp32,  ///< x stays fp32 and each E2M1 code is decoded to fp32: the reference path
  /// x quantized once per call to int8 per row and weight group (d = amax/127, the group size of the weights:
  /// 16 for NVFP4, 32 for MXFP4; the groups that dominate a row's rounding error get a 16-bit grid held in two
  /// int8), E2M1·2 codes used as integers, integer dot products per group, each group's sum scaled by block
  /// scale · d in fp32 (backends/cpu/kernels/linear.h quantize_activations_int8)
  Int8,
  /// Int8 for calls whose rows the SIMD int8 kernel serves in one pass over the weights (m ≤ 4 on AVX2, ≤ 8 on
  /// AVX-512: decode steps), Fp32 above (prefill, where Int8 re-reads the weights per 4 / 8 rows and runs slower
  /// than the fp32 panel GEMM) and where no SIMD int8 kernel exists (Arm: int8 is a scalar loop there)
  Int8Decode,
  /// x rounded to bf16 (nearest even) at the input of each call, then the fp32 math: the products are exact and
  /// sum in fp32, so the only error beyond Fp32's is x's rounding (≤ 2^−8·|x| per element), what a bf16 model
  /// computes on a GPU. On CPUs with AVX512-BF16 the products run as bf16 dot products (vdpbf16ps: two per lane
  /// and instruction, twice the FMA's), which is what makes prefill faster; they read subnormal values (below
  /// 2^−126) as 0. Elsewhere x is rounded and the fp32 kernels run.
  Bf16,
  /// Bf16 for the rows of a decode step (≤ the rows the SIMD int8 kernel serves in one pass), Int8 above (prefill,
  /// batched decode): what `auto` picks where the int8 kernel measured clearly faster than the bf16 one at 64 rows
  /// (kernels::probe_activation_precision). Decode stays bf16: it is memory-bound, both paths read the same bytes.
  Bf16DecodeInt8,
};
/// "fp32", "int8", "int8-decode", "bf16", "bf16-decode-int8": the --activation-precision value of `precision`.
std::string_view activation_precision_name(ActivationPrecision precision);

/// Rows are grouped in tiles of kTileRows: inside a tile the kernel layouts interleave the rows so that the same
/// column of the 8 rows is contiguous. The tile is a target-neutral layout unit, not a register shape: each
/// Highway target reads a column as one vector of 8 rows (AVX2, AVX-512, 256-bit SVE) or two of 4 (NEON, 128-bit
/// SVE), and picks its own panel width and rows per work item (backends/cpu/kernels/gemm_simd.cpp, gemm_gemv.cpp).
inline constexpr int64_t kTileRows = 8;

/// Fp4 and Int4 layouts store their tiles in pairs: tiles 2p and 2p + 1 lie side by side per column octet of
/// `codes` (and, for Fp4, per scale group of `scales`), so each of those buffers is read as one stream and the
/// AVX-512 kernels load a column octet of 16 rows (64 bytes) or a group's 16 scale bytes with one instruction. Their
/// padded_rows is a multiple of kPairedTiles · kTileRows. bench_gemm_fp4 M = 1, one thread, cold weights, AMD EPYC
/// (Zen 4), bw_ratio (against a streaming read of the same bytes), old and new binaries alternating, medians of 4
/// rounds, 4096² / 11008×4096: NVFP4 fp32 activations 0.78 / 0.75 → 0.86 / 0.88, bf16 0.87 / 0.91 → 0.91 / 0.92;
/// MXFP4 fp32 0.81 / 0.80 → 0.89 / 0.89 (with ItemAheadPrefetch reading a pair as one stream too).
inline constexpr int64_t kPairedTiles = 2;
/// Bytes from column octet c to c + 1 of one tile in Fp4 / Int4 `codes`.
inline constexpr int64_t kOctetStride = 32 * kPairedTiles;
/// Bytes from scale group g to g + 1 of one tile in Fp4 `scales`.
inline constexpr int64_t kScaleGroupStride = kTileRows * kPairedTiles;
/// Byte offset of tile t's octet 0 in Fp4 / Int4 `codes` with K = in_features.
inline constexpr int64_t code_tile_offset(int64_t in_features, int64_t t) {
  return (t / kPairedTiles) * (in_features / 8) * kOctetStride + (t % kPairedTiles) * 32;
}
/// Byte offset of tile t's group 0 in Fp4 `scales` with `groups` scale groups per row.
inline constexpr int64_t scale_tile_offset(int64_t groups, int64_t t) {
  return (t / kPairedTiles) * groups * kScaleGroupStride + (t % kPairedTiles) * kTileRows;
}

class HugePageArena;

/// 64-byte aligned, zero-initialised, owned bytes.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /// Throws std::bad_alloc when the allocation fails.
  explicit AlignedBuffer(size_t bytes);
  /// A copy of `source` carved out of `arena` (which may be destroyed before the copy: the chunk lives as long as
  /// a buffer in it). Throws std::bad_alloc.
  static AlignedBuffer copy_into(HugePageArena& arena, const AlignedBuffer& source);
  /// `bytes` zero bytes carved out of `arena` (its chunks are fresh anonymous mappings, zero already, so nothing is
  /// written: the pages become resident when the repack fills them). Throws std::bad_alloc.
  static AlignedBuffer zeroed_in(HugePageArena& arena, size_t bytes);
  /// A view of `bytes` bytes at `data` (64-byte aligned) that `owner` keeps alive as long as the buffer: memory
  /// this buffer does not allocate, such as a mapped weight cache file (weight_cache.h). The bytes may be mapped
  /// read-only: weights are only read after load. Throws UsageError when `owner` is null or `data` is not 64-byte
  /// aligned.
  static AlignedBuffer view(std::shared_ptr<const void> owner, const std::byte* data, size_t bytes);
  /// A deep copy (a new allocation of the same size and bytes). Throws std::bad_alloc.
  AlignedBuffer(const AlignedBuffer& other);
  AlignedBuffer& operator=(const AlignedBuffer& other);
  AlignedBuffer(AlignedBuffer&&) noexcept = default;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept = default;
  size_t size() const { return size_; }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(data_.get()); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data_.get()); }

 private:
  struct Free {
    std::shared_ptr<void> chunk;  // set when the bytes belong to a HugePageArena chunk or a view's owner: freed with it
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], Free> data_;
  size_t size_ = 0;
};

/// Bump allocator of 64-byte aligned blocks inside 2 MiB-aligned chunks advised MADV_HUGEPAGE (transparent huge
/// pages, where the kernel allows them), for weights that live as long as the model. A decode step streams every
/// weight byte once; with 4 KiB pages each page also costs a TLB miss per token. Measured on the default model
/// (bench model -p 128 -n 64, alternating binaries): the bf16 lm_head alone on huge pages decoded 1.10× / 1.08×
/// at one / two threads, every weight 1.00× / 1.11× more. Space is never reused: only for final weights.
/// Thread-safe. A chunk is freed when the arena and every buffer carved from it are gone.
class HugePageArena {
 public:
  explicit HugePageArena(size_t chunk_bytes = size_t{32} << 20);
  /// `bytes` (> 0) at a 64-byte boundary, and the chunk that owns them. Throws std::bad_alloc.
  std::byte* allocate(size_t bytes, std::shared_ptr<void>& chunk);
  /// Bytes handed out so far (each block rounded up to 64).
  size_t used_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// While alive, the repack functions (repack.h) called on this thread build the weight buffers of the layouts
/// they make (codes, scales, offsets) in `arena` instead of on the heap: the repack writes the final resident
/// copy directly, with no heap buffer copied into the arena afterwards (that churn used to leave freed heap pages
/// resident beside the weights and doubled the bytes written at load). Scopes nest; the innermost wins.
class ScopedWeightArena {
 public:
  explicit ScopedWeightArena(HugePageArena* arena);
  ~ScopedWeightArena();
  ScopedWeightArena(const ScopedWeightArena&) = delete;
  ScopedWeightArena& operator=(const ScopedWeightArena&) = delete;
  /// The arena of the innermost scope on this thread, or null (heap buffers).
  static HugePageArena* current();

 private:
  HugePageArena* previous_;
};

struct PreparedLinear;

/// Moves w's weight buffers (codes, scales, offsets: the bytes a GEMV streams) into `arena` (copies; the originals
/// are freed). Throws std::bad_alloc.
void move_weights_into(PreparedLinear& w, HugePageArena& arena);

/// One Linear layer y = x·Wᵀ (+ bias), W = [out_features N, in_features K], in kernel layout.
///
/// Kernel layouts (T = padded_rows / kTileRows tiles; row r of tile t is output row 8t + r; padded rows are
/// zero and never written to the output):
/// - Fp4 (every block format: NVFP4, MXFP4): `codes` = [T/2][K/8][2][32] bytes (tile pairs: kPairedTiles,
///   code_tile_offset). The 32 bytes of (tile t, column octet c) hold columns
///   8c..8c+7 of the tile's 8 rows as eight little-endian 32-bit words: word r (bytes 4r..4r+3) is row r,
///   and its nibble j (bits 4j..4j+3) is column 8c+j — i.e. the row's 4 checkpoint bytes unchanged. One
///   256-bit load thus gives one SIMD lane per row, and a shift by 4j plus a 16-entry table lookup (vpermps
///   reads only the low 4 bits of each lane) decodes column 8c+j for all 8 rows at once (the decode-path
///   GEMV, backends/cpu/kernels/gemm_gemv.cpp). Nibbles are the checkpoint's E2M1 codes unchanged (4 bits/weight).
///   `scales` = [T/2][K/g][2][8] bytes (scale_tile_offset), the checkpoint's block-scale bytes unchanged (the row of `block_format`
///   in quant/block_format.h gives g and the scale element: E4M3 per 16 for NVFP4, E8M0 per 32 for MXFP4):
///   8/g bits/weight. A format with a global scale adds `global_scale` [padded_rows] (+ `convention`),
///   applied to each output element in the epilogue, so fused rows keep their own global scale at no cost.
/// - Int4: `codes` as FP4 (tile pairs) but each nibble is the stored int4 value q + 8 (columns permuted by `k_perm` when
///   the checkpoint has an activation-order g_idx). `scales` and `offsets` = [T][K/g][8] fp32 with
///   w = nibble·scale + offset, offset = −(8 + zero_point)·scale (exact in fp32).
/// - Fp8: `codes` = [T][K][8] E4M3 bytes; `scales` = [T][ceil(K/g)][8] fp32 (tensor and channel scales use
///   g = K; block scales g = block width).
/// - Int8: `codes` = [T][K][8] int8; `scales` = [T][1][8] fp32, one per row (group_size = K): w = code · scale.
///   Made only in memory from an unquantized weight (prepare_dense_as_int8_rows, `--lm-head-dtype int8`).
/// - Dense: `codes` = [T][K][8] bf16 bits or fp32 values (`dense_storage`).
struct PreparedLinear {
  WeightLayout layout = WeightLayout::Dense;
  quant::BlockFormat block_format = quant::BlockFormat::Nvfp4;  ///< Fp4 layout only: the format of codes and scales
  int64_t out_features = 0;  ///< N
  int64_t in_features = 0;   ///< K
  std::vector<float> bias;   ///< [N] fp32, empty when the layer has none
  /// W4A4 checkpoints only, compressed-tensors (divisor) convention; 0 = absent.
  float input_global_scale = 0.f;

  int64_t padded_rows = 0;  ///< N rounded up to a multiple of kTileRows
  int64_t group_size = 0;   ///< columns per scale group along K (0 for Dense)
  AlignedBuffer codes;
  AlignedBuffer scales;
  AlignedBuffer offsets;
  std::vector<float> global_scale;  ///< formats with a global scale: [padded_rows], as stored (padding: 1)
  GlobalScaleConvention convention = GlobalScaleConvention::Divisor;
  std::vector<int32_t> k_perm;  ///< Int4 activation order: prepared column j reads input column k_perm[j]; empty = identity
  DenseStorage dense_storage = DenseStorage::F32;
  ActivationPrecision activation_precision = ActivationPrecision::Fp32;  ///< chosen at load, not by the checkpoint

  PreparedLinear() = default;
  PreparedLinear(PreparedLinear&&) noexcept = default;
  PreparedLinear& operator=(PreparedLinear&&) noexcept = default;
  PreparedLinear& operator=(const PreparedLinear&) = delete;

  /// A deep copy with every field (a layer's weights are large: copies are explicit, never implicit). Throws
  /// std::bad_alloc.
  PreparedLinear clone() const { return PreparedLinear(*this); }

  int64_t tiles() const { return padded_rows / kTileRows; }
  /// Number of scale groups along K: ceil(K / group_size) (0 for Dense).
  int64_t groups() const { return group_size > 0 ? (in_features + group_size - 1) / group_size : 0; }

 private:
  // Member-wise, so that a field added later is copied too (a hand-written copy in bench_gemm_fp4 dropped
  // block_format, and its MXFP4 rows then ran the NVFP4 kernel over half of K).
  PreparedLinear(const PreparedLinear&) = default;
};

/// Fp4 / Int4: the 4-bit code of row n, prepared column k (the E2M1 code for Fp4, q + 8 for Int4), read with the
/// layout above. For element-wise readers (reference decoder, scalar fallbacks, GPU repacking), not kernels.
inline uint8_t prepared_nibble(const PreparedLinear& w, int64_t n, int64_t k) {
  const uint8_t byte = w.codes.as<uint8_t>()[code_tile_offset(w.in_features, n / kTileRows) + (k / 8) * kOctetStride +
                                             4 * (n % kTileRows) + (k % 8) / 2];
  return k % 2 == 0 ? static_cast<uint8_t>(byte & 0x0F) : static_cast<uint8_t>(byte >> 4);
}
/// Fp4: the block-scale byte of row n, scale group g.
inline uint8_t prepared_scale_byte(const PreparedLinear& w, int64_t n, int64_t g) {
  return w.scales.as<uint8_t>()[scale_tile_offset(w.groups(), n / kTileRows) + g * kScaleGroupStride + n % kTileRows];
}

/// Bytes the weights occupy in kernel layout (codes + scales + offsets + global scales).
size_t weight_bytes(const PreparedLinear& w);

/// "Fp4", "Int4", ... for messages.
const char* layout_name(WeightLayout layout);
/// "NVFP4", "MXFP4" for Fp4 layouts, else layout_name: for messages.
std::string_view format_label(const PreparedLinear& w);

}  // namespace fp4serve::prepare
