// SPDX-License-Identifier: Apache-2.0
// Dequantization parity with the reference tools: every `dequant.<module>` tensor in tests/data/ref/*/golden
// was produced by compressed-tensors' own decompression (or ModelOpt's, per MANIFEST.json) from the fixture's
// checkpoint; our reference dequantizer must reproduce it bit for bit (tools/reference/make_fixtures.py).
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "quant/dequant.h"
#include "quant/formats.h"

namespace fp4serve::quant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kRef = fs::path(FP4SERVE_TEST_DATA) / "ref";

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kRef, ec)) {
    if (!fs::exists(e.path() / "golden.safetensors")) continue;
    const json config = checkpoint::read_json_object_file(e.path() / "config.json");
    const bool quantized = config.contains("quantization_config") || fs::exists(e.path() / "hf_quant_config.json");
    if (quantized) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The weight args of the (single) config group of a compressed-tensors fixture.
json weight_args(const json& config) {
  const json& qc = config["quantization_config"];
  for (const auto& [name, group] : qc["config_groups"].items()) {
    if (group.contains("weights") && group["weights"].is_object()) return group["weights"];
  }
  return json::object();
}

// Bits of `value` rounded to `dtype`; the golden tensors store BF16/F16 (or F32) exactly.
uint32_t golden_bits(const core::TensorView& t, size_t i) {
  if (t.dtype == core::DType::BF16 || t.dtype == core::DType::F16) return t.load<uint16_t>(i);
  if (t.dtype == core::DType::F32) return t.load<uint32_t>(i);
  ADD_FAILURE() << "unexpected golden dtype " << core::dtype_name(t.dtype);
  return 0;
}

uint32_t our_bits(core::DType dtype, float v) {
  if (dtype == core::DType::BF16) return float_to_bf16(v);
  if (dtype == core::DType::F16) return float_to_f16(v);
  return std::bit_cast<uint32_t>(v);
}

DequantizedWeight dequantize_module(const checkpoint::Checkpoint& ckpt, const std::string& module) {
  const json& config = ckpt.config();
  const std::string method = config["quantization_config"]["quant_method"];
  auto t = [&](const std::string& suffix) { return ckpt.tensor(module + "." + suffix); };
  auto has = [&](const std::string& suffix) { return ckpt.contains(module + "." + suffix); };
  if (method == "modelopt") {  // NVFP4 naming (FORMATS.md §3.2): weight U8, weight_scale E4M3, weight_scale_2
    return dequantize_nvfp4(t("weight"), t("weight_scale"), t("weight_scale_2").load<float>(0),
                            GlobalScaleConvention::Multiplier, module);
  }
  if (method == "mxfp4") {  // GPT-OSS native (FORMATS.md §5): experts stacked, blocks [E, N, K/32, 16]
    const core::TensorView blocks = ckpt.tensor(module + "_blocks");
    const core::TensorView scales = ckpt.tensor(module + "_scales");
    const int64_t experts = blocks.shape[0], n = blocks.shape[1], k = blocks.shape[2] * 32;
    DequantizedWeight all{core::DType::BF16, experts * n, k, {}};
    for (int64_t e = 0; e < experts; ++e) {
      core::TensorView b{core::DType::U8, {n, k / 2}, blocks.bytes.subspan(static_cast<size_t>(e * n * k / 2), static_cast<size_t>(n * k / 2))};
      core::TensorView sc{core::DType::U8, {n, k / 32}, scales.bytes.subspan(static_cast<size_t>(e * n * k / 32), static_cast<size_t>(n * k / 32))};
      const DequantizedWeight one = dequantize_mxfp4(b, sc, module);
      all.values.insert(all.values.end(), one.values.begin(), one.values.end());
    }
    return all;
  }
  const std::string format = config["quantization_config"]["format"];
  const json args = weight_args(config);
  if (format == "nvfp4-pack-quantized") {
    return dequantize_nvfp4(t("weight_packed"), t("weight_scale"), t("weight_global_scale").load<float>(0),
                            GlobalScaleConvention::Divisor, module);
  }
  if (format == "mxfp4-pack-quantized") return dequantize_mxfp4(t("weight_packed"), t("weight_scale"), module);
  if (format == "pack-quantized") {
    const core::TensorView shape = t("weight_shape");
    const core::TensorView zp = has("weight_zero_point") ? t("weight_zero_point") : core::TensorView{};
    const core::TensorView gidx = has("weight_g_idx") ? t("weight_g_idx") : core::TensorView{};
    const int64_t group = args["group_size"].is_number() ? args["group_size"].get<int64_t>() : -1;
    return dequantize_int4(t("weight_packed"), t("weight_scale"), has("weight_zero_point") ? &zp : nullptr,
                           has("weight_g_idx") ? &gidx : nullptr, shape.load<int64_t>(1), group, module);
  }
  if (format == "float-quantized" || format == "naive-quantized") {
    int64_t br = 0, bc = 0;
    if (args.contains("block_structure") && args["block_structure"].is_array()) {
      br = args["block_structure"][0];
      bc = args["block_structure"][1];
    }
    return dequantize_fp8(t("weight"), t("weight_scale"), br, bc, module);
  }
  ADD_FAILURE() << "fixture format " << format << " has no dequantizer";
  return {};
}

class DequantParity : public ::testing::TestWithParam<std::string> {};

TEST_P(DequantParity, MatchesTheReferenceDecompressionBitForBit) {
  const fs::path dir = kRef / GetParam();
  const auto ckpt = checkpoint::Checkpoint::open(dir);
  const checkpoint::SafetensorsFile golden(dir / "golden.safetensors");
  int compared = 0;
  for (const auto& entry : golden.header().tensors) {
    if (entry.name.rfind("dequant.", 0) != 0) continue;
    const std::string module = entry.name.substr(8);
    const core::TensorView want = golden.view(entry);
    const DequantizedWeight got = dequantize_module(ckpt, module);
    ASSERT_EQ(want.numel(), got.rows * got.cols) << module;
    ASSERT_EQ(want.shape.back(), got.cols) << module;
    ASSERT_EQ(want.dtype, got.dtype) << module;
    int64_t mismatches = 0;
    for (size_t i = 0; i < got.values.size(); ++i) {
      if (golden_bits(want, i) != our_bits(got.dtype, got.values[i])) {
        if (++mismatches <= 5) ADD_FAILURE() << module << "[" << i << "]: reference bits " << golden_bits(want, i)
                                             << ", ours " << our_bits(got.dtype, got.values[i]);
      }
    }
    EXPECT_EQ(mismatches, 0) << module;
    ++compared;
    RecordProperty(module, static_cast<int>(got.values.size()));
  }
  EXPECT_GT(compared, 0) << "no dequant.* goldens in " << dir;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DequantParity, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

TEST(DequantParityCorpus, FixturesArePresent) { EXPECT_GE(fixture_names().size(), 10u); }

}  // namespace
}  // namespace fp4serve::quant
