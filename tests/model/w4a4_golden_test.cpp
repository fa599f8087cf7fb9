// SPDX-License-Identifier: Apache-2.0
// W4A4 emulation against compressed-tensors' own activation fake quant: every NVFP4 W4A4 fixture stores a seeded
// activation `w4a4.x` for layer 0 q_proj, its fake-quantized form `w4a4.x_fq` (forward_quantize) and
// `w4a4.y = x_fq · dequant(W)ᵀ` (tools/reference/fx_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "kernels/linear.h"
#include "prepare/repack.h"

namespace fp4serve {
namespace {

namespace fs = std::filesystem;
const fs::path kRef = fs::path(FP4SERVE_TEST_DATA) / "ref";
const std::string kModule = "model.layers.0.self_attn.q_proj";

std::vector<std::string> nvfp4_w4a4_fixtures() {
  std::vector<std::string> out;
  for (const char* name : {"llama-nvfp4", "llama-i352-nvfp4", "qwen2-nvfp4", "qwen3-nvfp4", "granite-nvfp4",
                           "llama-modelopt-nvfp4"}) {
    if (fs::exists(kRef / name / "golden.safetensors")) out.emplace_back(name);
  }
  return out;
}

std::vector<float> floats(const core::TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = v.load<float>(i);
  return out;
}

class W4A4Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(W4A4Golden, EmulatedActivationsAndOutputMatchCompressedTensors) {
  const auto ckpt = checkpoint::Checkpoint::open(kRef / GetParam());
  const checkpoint::SafetensorsFile golden(kRef / GetParam() / "golden.safetensors");
  const bool modelopt = ckpt.hf_quant_config().is_object();
  const auto convention = modelopt ? prepare::GlobalScaleConvention::Multiplier : prepare::GlobalScaleConvention::Divisor;
  const std::string packed = modelopt ? ".weight" : ".weight_packed";
  const std::string global = modelopt ? ".weight_scale_2" : ".weight_global_scale";
  const std::string input = modelopt ? ".input_scale" : ".input_global_scale";
  prepare::PreparedLinear w = prepare::prepare_nvfp4(ckpt.tensor(kModule + packed), ckpt.tensor(kModule + ".weight_scale"),
                                                     ckpt.tensor(kModule + global).load<float>(0), convention, kModule);
  prepare::set_input_global_scale(w, ckpt.tensor(kModule + input).load<float>(0), convention);
  if (ckpt.contains(kModule + ".bias")) prepare::attach_bias(w, ckpt.tensor(kModule + ".bias"), kModule);

  const auto x_view = golden.view(*golden.find("w4a4.x"));
  const int64_t m = x_view.shape[0], k = x_view.shape[1];
  std::vector<float> x = floats(x_view);
  const std::vector<float> x_fq = floats(golden.view(*golden.find("w4a4.x_fq")));
  std::vector<float> emulated = x;
  kernels::emulate_nvfp4_activations(emulated.data(), m, k, w.input_global_scale);
  int64_t differ = 0;
  double max_diff = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (emulated[i] != x_fq[i]) ++differ;
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(emulated[i] - x_fq[i])));
  }
  EXPECT_EQ(differ, 0) << "of " << x.size() << " activations differ bitwise; max |Δ| " << max_diff;

  const std::vector<float> y_ref = floats(golden.view(*golden.find("w4a4.y")));
  std::vector<float> y(y_ref.size(), std::nanf(""));
  kernels::linear(w, x.data(), m, y.data(), kernels::ActivationQuant::EmulateNvfp4);
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(y_ref[i])));
    max_err = std::max(max_err, static_cast<double>(std::fabs(y[i] - y_ref[i])));
  }
  // The reference multiplies bf16-rounded weights in fp32; ours keeps fp32 weights: a few bf16 ulps apart.
  EXPECT_LE(max_err, 1e-2 * max_ref) << "max |Δy| " << max_err << " of max |y| " << max_ref;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, W4A4Golden, ::testing::ValuesIn(nvfp4_w4a4_fixtures()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace fp4serve
