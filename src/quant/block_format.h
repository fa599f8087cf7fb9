// SPDX-License-Identifier: Apache-2.0
// The block formats: FP4 elements with one scale per fixed group of K (docs/FORMATS.md "Block formats").
// One row per format holds every fact the rest of the engine needs (element, group size, scale element and its
// decode, the global scale, bits per weight, how compressed-tensors and ModelOpt describe it, how it is stored).
// The config parser, the plan's predicates and contracts, repack, dequant, the quantizer and the CPU and CUDA
// kernels read the row; kernels that specialise take the format as a template parameter through
// visit_block_format, the one switch over BlockFormat. Adding a format = one row here + the kernels that want
// their own specialisation.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/quant_config.h"

namespace fp4serve::quant {

enum class BlockFormat : uint8_t {
  Nvfp4,  ///< E2M1, E4M3 scale per 16, fp32 global scale
  Mxfp4,  ///< E2M1, E8M0 scale per 32 (OCP MX), no global scale
};

/// How a checkpoint stores a format's per-tensor global scale (FORMATS.md §2.1, §3.2).
enum class GlobalScaleConvention : uint8_t {
  Divisor,     ///< compressed-tensors `weight_global_scale` = 448·6/amax: w = q · (s / gs), the division in fp32
  Multiplier,  ///< ModelOpt `weight_scale_2` = amax/(448·6): w = q · (s · ws2), the product in fp32
};
std::string_view global_scale_convention_name(GlobalScaleConvention c);
/// The convention `producer` writes: ModelOpt multipliers, everything else (compressed-tensors) divisors.
GlobalScaleConvention global_scale_convention_of(Producer producer);

inline constexpr std::array<core::DType, 1> kE4m3ScaleDtypes{core::DType::F8_E4M3};
/// compressed-tensors stores E8M0 scales as U8 (older releases) or F8_E8M0.
inline constexpr std::array<core::DType, 2> kE8m0ScaleDtypes{core::DType::U8, core::DType::F8_E8M0};

struct BlockFormatTraits {
  BlockFormat format;
  std::string_view name;        ///< "NVFP4", as the producers and SCHEMES.md spell it
  ElementFormat element;        ///< element code: E2M1, two per byte, low nibble = even column
  ElementFormat scale;          ///< block-scale element: E4M3 or E8M0 (one byte)
  int64_t group_size;           ///< elements per block scale, along K
  bool global_scale;            ///< an fp32 per-tensor scale above the block scales (convention by producer)
  // How a compressed-tensors QuantizationArgs describes the format (rule 1 of docs/SCHEMES.md):
  Strategy strategy;            ///< `strategy` of weights and W4A4 activations
  Dynamic input_dynamic;        ///< `dynamic` of W4A4 activations: local = only the global scale stored
  ScaleDtype scale_dtype;       ///< `scale_dtype`, when a config states it
  StorageFormat storage;        ///< the compressed-tensors storage
  std::string_view ct_format;   ///< its compressed-tensors `format` string
  std::span<const core::DType> scale_dtypes;  ///< safetensors dtypes accepted for `weight_scale`

  /// 4 + 8/group_size (+ the global scale's 32 bits per tensor, not counted).
  constexpr double bits_per_weight() const {
    return static_cast<double>(format_traits(element).bits) + 8.0 / static_cast<double>(group_size);
  }
  /// Bytes of packed elements per group (two E2M1 per byte).
  constexpr int64_t packed_bytes_per_group() const { return group_size / 2; }
};

inline constexpr std::array<BlockFormatTraits, 2> kBlockFormats{{
    {BlockFormat::Nvfp4, "NVFP4", ElementFormat::E2M1, ElementFormat::E4M3, 16, true, Strategy::TensorGroup,
     Dynamic::Local, ScaleDtype::E4M3, StorageFormat::Nvfp4Packed, "nvfp4-pack-quantized", kE4m3ScaleDtypes},
    {BlockFormat::Mxfp4, "MXFP4", ElementFormat::E2M1, ElementFormat::E8M0, 32, false, Strategy::Group,
     Dynamic::Dynamic, ScaleDtype::E8M0, StorageFormat::Mxfp4Packed, "mxfp4-pack-quantized", kE8m0ScaleDtypes},
}};

constexpr const BlockFormatTraits& block_format_traits(BlockFormat f) { return kBlockFormats[static_cast<size_t>(f)]; }
inline std::string_view block_format_name(BlockFormat f) { return block_format_traits(f).name; }

/// The block format a storage format holds (GPT-OSS `_blocks` are MXFP4); nullopt for non-block storage.
std::optional<BlockFormat> block_format_of(StorageFormat storage);

/// Value of one block-scale byte: E4M3 (NaN codes decode to NaN) or E8M0 (2^(b−127), 255 → +inf).
float decode_block_scale(BlockFormat f, uint8_t byte);

/// Calls fn.template operator()<F>() with F = f: the one place that turns a run-time format into a template
/// argument for the kernels that specialise on it.
template <class Fn>
decltype(auto) visit_block_format(BlockFormat f, Fn&& fn) {
  switch (f) {
    case BlockFormat::Nvfp4: return fn.template operator()<BlockFormat::Nvfp4>();
    case BlockFormat::Mxfp4: return fn.template operator()<BlockFormat::Mxfp4>();
  }
  return fn.template operator()<BlockFormat::Nvfp4>();  // unreachable: every enumerator is listed above
}

}  // namespace fp4serve::quant
