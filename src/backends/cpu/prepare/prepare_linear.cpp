// SPDX-License-Identifier: Apache-2.0
// Checkpoint-order weights (quant/linear_weights.h) → the CPU layout, row block by row block.
#include <fmt/format.h>

#include <utility>
#include <vector>

#include "backends/cpu/prepare/repack.h"
#include "fp4serve/error.h"

namespace fp4serve::prepare {

namespace {

PreparedLinear prepare_rows(const quant::LinearWeights& w, const quant::WeightRows& r) {
  switch (w.encoding) {
    case quant::WeightEncoding::Fp4:
      return prepare_fp4(w.block_format, r.weight, r.weight_scale, r.global_scale, w.convention, r.name);
    case quant::WeightEncoding::Int4:
      return prepare_int4(r.weight, r.weight_scale, r.has_zero_point ? &r.zero_point : nullptr,
                          r.has_g_idx ? &r.g_idx : nullptr, w.in_features, w.group_size, r.name);
    case quant::WeightEncoding::Fp8: return prepare_fp8(r.weight, r.weight_scale, w.fp8_block, r.name);
    case quant::WeightEncoding::Dense:
      switch (w.requant) {
        case quant::DenseRequant::None: return prepare_dense(r.weight, r.name);
        case quant::DenseRequant::Fp8Rows: return prepare_dense_as_fp8_rows(r.weight, r.name);
        case quant::DenseRequant::Int8Rows: return prepare_dense_as_int8_rows(r.weight, r.name);
      }
      break;
  }
  throw UsageError("prepare_linear: unknown weight encoding");
}

}  // namespace

PreparedLinear prepare_linear(const quant::LinearWeights& w, HugePageArena* arena) {
  if (w.rows.empty()) throw UsageError("prepare_linear: a layer with no rows");
  // One row block is prepared straight into the arena; several are prepared on the heap and only their
  // concatenation goes there (the arena never reuses space).
  const bool single = w.rows.size() == 1;
  std::vector<PreparedLinear> parts;
  parts.reserve(w.rows.size());
  for (const quant::WeightRows& r : w.rows) {
    const ScopedWeightArena scope(single ? arena : nullptr);
    PreparedLinear p = prepare_rows(w, r);
    if (p.in_features != w.in_features) {
      throw FormatError(fmt::format("{}: weight has {} input features, the layer {}", r.name, p.in_features,
                                    w.in_features));
    }
    if (r.has_bias) attach_bias(p, r.bias, r.name);
    p.input_global_scale = w.input_global_scale;
    parts.push_back(std::move(p));
  }
  const ScopedWeightArena scope(arena);
  return concat_rows(std::move(parts));
}

}  // namespace fp4serve::prepare
