// SPDX-License-Identifier: Apache-2.0
// Dequantization parity with the reference tools: every `dequant_sha256.<module>` digest in
// tests/data/ref/*/golden was computed from compressed-tensors' own decompression (or ModelOpt's, per
// MANIFEST.json) of the fixture's checkpoint; our reference dequantizer must reproduce those bytes exactly
// (tools/reference/make_fixtures.py, tools/reference/slim_goldens.py for the digest-plus-rows form).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "fp4serve/error.h"
#include "quant/dequant.h"
#include "quant/dequant_digest.h"  // tests/quant (tests/ is on the include path)
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
    if (!entry.name.starts_with(digest::kDigestPrefix)) continue;
    const std::string module = entry.name.substr(digest::kDigestPrefix.size());
    const DequantizedWeight got = dequantize_module(ckpt, module);
    ASSERT_EQ(digest::digest_dtype(golden, module), got.dtype) << module;
    const std::vector<uint8_t> ours = digest::reference_bytes(got.dtype, got.values);
    const digest::DigestComparison r = digest::compare_with_digest(golden, module, ours, got.rows, got.cols);
    EXPECT_TRUE(r.shape_equal) << module << ": our [" << got.rows << ", " << got.cols << "] vs dequant_shape";
    EXPECT_TRUE(r.hash_equal) << module << ": SHA-256 of our bytes differs from the reference's"
                              << (r.elements_differing == 0 ? " (the sampled rows agree: the difference is elsewhere)"
                                                            : "");
    EXPECT_EQ(r.elements_differing, 0) << module << ": first difference at " << r.first_difference;
    EXPECT_GT(r.rows_compared, 0) << module;
    ++compared;
    RecordProperty(module, static_cast<int>(got.values.size()));
  }
  EXPECT_GT(compared, 0) << "no dequant_sha256.* goldens in " << dir;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DequantParity, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

TEST(DequantParityCorpus, FixturesArePresent) { EXPECT_GE(fixture_names().size(), 10u); }

// The digest check is as strict as the full tensor: one flipped bit in an element of a row that is not sampled
// still fails (only the hash catches it), and one in a sampled row is reported with its position.
TEST(DequantParityCorpus, OneFlippedBitFailsTheComparison) {
  const fs::path dir = kRef / "llama-nvfp4";
  if (!fs::exists(dir)) GTEST_SKIP() << "reference fixtures not present";
  const auto ckpt = checkpoint::Checkpoint::open(dir);
  const checkpoint::SafetensorsFile golden(dir / "golden.safetensors");
  const std::string module = "model.layers.0.mlp.down_proj";
  const DequantizedWeight got = dequantize_module(ckpt, module);
  std::vector<uint8_t> ours = digest::reference_bytes(got.dtype, got.values);
  ASSERT_TRUE(digest::compare_with_digest(golden, module, ours, got.rows, got.cols).ok());

  const core::TensorView index = golden.view(*golden.find("dequant_row_index." + module));
  std::vector<int64_t> sampled;
  for (int64_t k = 0; k < index.numel(); ++k) sampled.push_back(index.load<int64_t>(static_cast<size_t>(k)));
  ASSERT_LT(static_cast<int64_t>(sampled.size()), got.rows);
  int64_t unsampled = 1;
  while (std::find(sampled.begin(), sampled.end(), unsampled) != sampled.end()) ++unsampled;
  const size_t esize = ours.size() / got.values.size();
  const int64_t col = got.cols / 3 + 1;

  const size_t hidden = static_cast<size_t>(unsampled * got.cols + col) * esize;  // lowest mantissa bit
  ours[hidden] ^= 1u;
  const digest::DigestComparison r1 = digest::compare_with_digest(golden, module, ours, got.rows, got.cols);
  EXPECT_FALSE(r1.hash_equal);
  EXPECT_EQ(r1.elements_differing, 0);
  EXPECT_FALSE(r1.ok());
  ours[hidden] ^= 1u;

  const size_t shown = static_cast<size_t>(sampled.back() * got.cols + col) * esize + esize - 1;  // sign bit
  ours[shown] ^= 0x80u;
  const digest::DigestComparison r2 = digest::compare_with_digest(golden, module, ours, got.rows, got.cols);
  EXPECT_FALSE(r2.hash_equal);
  EXPECT_EQ(r2.elements_differing, 1);
  EXPECT_NE(r2.first_difference.find("row " + std::to_string(sampled.back()) + " col " + std::to_string(col) + ":"),
            std::string::npos)
      << r2.first_difference;
  ours[shown] ^= 0x80u;
  EXPECT_TRUE(digest::compare_with_digest(golden, module, ours, got.rows, got.cols).ok());
}

// An independent SHA-256 check of the OpenSSL call: the FIPS 180-4 example "abc" and the empty message.
TEST(DequantParityCorpus, Sha256KnownAnswers) {
  auto hex = [](const std::array<uint8_t, 32>& h) {
    std::string s;
    for (uint8_t b : h) s += "0123456789abcdef"[b >> 4], s += "0123456789abcdef"[b & 15];
    return s;
  };
  const std::string abc = "abc";
  EXPECT_EQ(hex(digest::sha256({reinterpret_cast<const uint8_t*>(abc.data()), abc.size()})),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(digest::sha256({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// Malformed digest entries are reported as FormatError naming the file, never a crash.
TEST(DequantParityCorpus, MissingDigestEntryIsAFormatError) {
  const fs::path dir = kRef / "llama-nvfp4";
  if (!fs::exists(dir)) GTEST_SKIP() << "reference fixtures not present";
  const checkpoint::SafetensorsFile golden(dir / "golden.safetensors");
  const std::vector<uint8_t> bytes(8, 0);
  EXPECT_THROW(digest::compare_with_digest(golden, "model.layers.0.no_such_proj", bytes, 2, 2), FormatError);
}

}  // namespace
}  // namespace fp4serve::quant
