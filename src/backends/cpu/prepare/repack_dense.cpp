// SPDX-License-Identifier: Apache-2.0
// FP8 E4M3 and unquantized checkpoint tensors → row-interleaved kernel layouts (prepared_linear.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "backends/cpu/prepare/repack.h"
#include "backends/cpu/prepare/repack_util.h"
#include "quant/dequant.h"
#include "quant/formats.h"

namespace fp4serve::prepare {
namespace {

using detail::fail;

int64_t check_matrix(const core::TensorView& t, std::initializer_list<core::DType> dtypes, std::string_view name,
                     std::string_view role) {
  detail::check_dtype(t, dtypes, name, role);
  if (t.shape.size() != 2 || t.shape[0] == 0 || t.shape[1] == 0) {
    fail(name, role, fmt::format("has shape {}, expected [N, K] with N, K > 0", core::shape_to_string(t.shape)));
  }
  return t.shape[0];
}

}  // namespace

PreparedLinear prepare_fp8(const core::TensorView& weight, const core::TensorView& weight_scale,
                           std::array<int64_t, 2> block, std::string_view name) {
  const int64_t n = check_matrix(weight, {core::DType::F8_E4M3}, name, "weight");
  const int64_t k = weight.shape[1];
  detail::check_dtype(weight_scale, {core::DType::BF16, core::DType::F16, core::DType::F32}, name, "weight_scale");
  const auto& ss = weight_scale.shape;
  enum class Kind { Tensor, Channel, Block } kind = Kind::Tensor;
  int64_t bh = n, bw = k;  // a block scale covers rows [bh·i, …) and columns [bw·j, …)
  if (block[0] != 0 || block[1] != 0) {
    if (block[0] <= 0 || block[1] <= 0) {
      fail(name, "block structure", fmt::format("is [{}, {}], expected two positive sizes", block[0], block[1]));
    }
    kind = Kind::Block;
    bh = block[0];
    bw = block[1];
    detail::check_shape(weight_scale, {(n + bh - 1) / bh, (k + bw - 1) / bw}, name, "weight_scale");
  } else if (ss.empty() || (ss.size() == 1 && ss[0] == 1)) {
    kind = Kind::Tensor;
  } else if ((ss.size() == 1 && ss[0] == n) || (ss.size() == 2 && ss[0] == n && ss[1] == 1)) {
    kind = Kind::Channel;
  } else {
    fail(name, "weight_scale",
         fmt::format("has shape {}, expected [] or [1] (tensor), [{}] or [{}, 1] (channel), or a block structure",
                     core::shape_to_string(ss), n, n));
  }
  const int64_t groups = (k + bw - 1) / bw;
  const int64_t scale_cols = (k + bw - 1) / bw;
  PreparedLinear w;
  detail::init_tiles(w, WeightLayout::Fp8, n, k, bw, static_cast<size_t>(k) * kTileRows,
                     static_cast<size_t>(groups) * kTileRows * sizeof(float), 0);
  const auto* src = reinterpret_cast<const uint8_t*>(weight.bytes.data());
  auto* codes = w.codes.as<uint8_t>();
  auto* scales = w.scales.as<float>();
  // The kernel decodes an E4M3 byte as the fp32 whose bits are (sign << 31) | (magnitude << 20), which is
  // the value · 2^−120 for normals and subnormals alike; the 2^120 is folded into the stored scale.
  const float fold = std::ldexp(1.f, 120);
  for (int64_t row = 0; row < n; ++row) {
    const int64_t t = row / kTileRows, r = row % kTileRows;
    for (int64_t col = 0; col < k; ++col) codes[(t * k + col) * kTileRows + r] = src[row * k + col];
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t si = kind == Kind::Tensor ? 0 : kind == Kind::Channel ? row : (row / bh) * scale_cols + g;
      const float s = quant::load_float(weight_scale, static_cast<size_t>(si), name);
      if (std::isfinite(s) && std::fabs(s) > std::ldexp(1.f, 7)) {
        throw UnsupportedError(fmt::format("{}: weight_scale value {} exceeds 2^7, which the FP8 kernel cannot fold "
                                           "into fp32",
                                           name, s));
      }
      scales[(t * groups + g) * kTileRows + r] = s * fold;
    }
  }
  return w;
}

PreparedLinear prepare_dense(const core::TensorView& weight, std::string_view name) {
  const int64_t n = check_matrix(weight, {core::DType::BF16, core::DType::F16, core::DType::F32}, name, "weight");
  const int64_t k = weight.shape[1];
  const bool bf16 = weight.dtype == core::DType::BF16;
  PreparedLinear w;
  detail::init_tiles(w, WeightLayout::Dense, n, k, 0, static_cast<size_t>(k) * kTileRows * (bf16 ? 2 : 4), 0, 0);
  w.dense_storage = bf16 ? DenseStorage::Bf16 : DenseStorage::F32;
  if (bf16) {
    // Rows write disjoint elements; in parallel on the engine's threads (lm_head and the attention projections
    // of a bf16 model are the bulk of its load-time repack). No exception can leave the loop.
    // Tile by tile, each written front to back while its 8 source rows are read front to back.
    const auto* src = reinterpret_cast<const unsigned char*>(weight.bytes.data());
    auto* dst = w.codes.as<uint16_t>();
    const int64_t tiles = (n + kTileRows - 1) / kTileRows;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t rows = std::min(kTileRows, n - t * kTileRows);  // padded rows stay zero
      uint16_t* tile = dst + static_cast<size_t>(t * k * kTileRows);
      const unsigned char* first = src + static_cast<size_t>(t * kTileRows * k) * 2;
      for (int64_t col = 0; col < k; ++col) {
        for (int64_t r = 0; r < rows; ++r) {
          uint16_t v;
          std::memcpy(&v, first + static_cast<size_t>(r * k + col) * 2, 2);  // safetensors does not align
          tile[col * kTileRows + r] = v;
        }
      }
    }
    return w;
  }
  for (int64_t row = 0; row < n; ++row) {
    const int64_t t = row / kTileRows, r = row % kTileRows;
    for (int64_t col = 0; col < k; ++col) {
      const auto src = static_cast<size_t>(row * k + col);
      w.codes.as<float>()[static_cast<size_t>((t * k + col) * kTileRows + r)] = quant::load_float(weight, src, name);
    }
  }
  return w;
}

PreparedLinear prepare_dense_as_fp8_rows(const core::TensorView& weight, std::string_view name) {
  const int64_t n = check_matrix(weight, {core::DType::BF16, core::DType::F16, core::DType::F32}, name, "weight");
  const int64_t k = weight.shape[1];
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  std::vector<float> scales(static_cast<size_t>(n));
  // Rows are independent (a row's scale and codes depend on that row alone), so they run in parallel with the same
  // result on any number of threads: a Llama-3.2-3B lm_head (394M weights) took 12.9 s on one thread.
  // load_float cannot throw here: check_matrix accepted only BF16, F16 and F32.
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      float amax = 0.f;
      for (int64_t c = 0; c < k; ++c) {
        row[static_cast<size_t>(c)] = quant::load_float(weight, static_cast<size_t>(r * k + c), name);
        amax = std::max(amax, std::fabs(row[static_cast<size_t>(c)]));
      }
      // amax/448 maps the row's largest magnitude to E4M3's largest finite value; an all-zero row keeps scale 1.
      const float scale = amax > 0.f ? amax / 448.f : 1.f;
      scales[static_cast<size_t>(r)] = scale;
      for (int64_t c = 0; c < k; ++c) {
        codes[static_cast<size_t>(r * k + c)] = quant::float_to_e4m3(row[static_cast<size_t>(c)] / scale);
      }
    }
  }
  const core::TensorView code_view{core::DType::F8_E4M3, {n, k}, std::as_bytes(std::span<const uint8_t>(codes))};
  const core::TensorView scale_view{core::DType::F32, {n, 1}, std::as_bytes(std::span<const float>(scales))};
  return prepare_fp8(code_view, scale_view, {0, 0}, name);
}

PreparedLinear prepare_dense_as_int8_rows(const core::TensorView& weight, std::string_view name) {
  const int64_t n = check_matrix(weight, {core::DType::BF16, core::DType::F16, core::DType::F32}, name, "weight");
  const int64_t k = weight.shape[1];
  PreparedLinear w;
  detail::init_tiles(w, WeightLayout::Int8, n, k, k, static_cast<size_t>(k) * kTileRows, kTileRows * sizeof(float), 0);
  // Rows in parallel, as in prepare_dense_as_fp8_rows (each writes its own scale and codes).
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = r / kTileRows, lane = r % kTileRows;
      float amax = 0.f;
      for (int64_t c = 0; c < k; ++c) {
        row[static_cast<size_t>(c)] = quant::load_float(weight, static_cast<size_t>(r * k + c), name);
        amax = std::max(amax, std::fabs(row[static_cast<size_t>(c)]));
      }
      const float scale = amax > 0.f ? amax / 127.f : 1.f;
      w.scales.as<float>()[t * kTileRows + lane] = scale;
      for (int64_t c = 0; c < k; ++c) {
        const float q = std::nearbyint(std::clamp(row[static_cast<size_t>(c)] / scale, -127.f, 127.f));
        w.codes.as<int8_t>()[(t * k + c) * kTileRows + lane] = static_cast<int8_t>(q);
      }
    }
  }
  return w;
}

}  // namespace fp4serve::prepare
