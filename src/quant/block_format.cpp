// SPDX-License-Identifier: Apache-2.0
#include "quant/block_format.h"

namespace fp4serve::quant {

static_assert([] {
  for (size_t i = 0; i < kBlockFormats.size(); ++i) {
    const BlockFormatTraits& t = kBlockFormats[i];
    // The kernel layouts read a group as whole column octets (prepare/prepared_linear.h) and a scale as one byte.
    if (static_cast<size_t>(t.format) != i || t.group_size % 8 != 0 || format_traits(t.scale).bits != 8) return false;
  }
  return true;
}(), "kBlockFormats rows must follow the enum order, hold whole octets per group and one-byte scales");

std::string_view global_scale_convention_name(GlobalScaleConvention c) {
  switch (c) {
    case GlobalScaleConvention::Divisor: return "divisor";
    case GlobalScaleConvention::Multiplier: return "multiplier";
  }
  return "?";
}

GlobalScaleConvention global_scale_convention_of(Producer producer) {
  return producer == Producer::ModelOpt ? GlobalScaleConvention::Multiplier : GlobalScaleConvention::Divisor;
}

std::optional<BlockFormat> block_format_of(StorageFormat storage) {
  if (storage == StorageFormat::GptOssMxfp4Blocks) return BlockFormat::Mxfp4;
  for (const BlockFormatTraits& t : kBlockFormats) {
    if (t.storage == storage) return t.format;
  }
  return std::nullopt;
}

float decode_block_scale(BlockFormat f, uint8_t byte) {
  return block_format_traits(f).scale == ElementFormat::E4M3 ? e4m3_to_float(byte) : e8m0_to_float(byte);
}

}  // namespace fp4serve::quant
