// SPDX-License-Identifier: Apache-2.0
// W4A4 emulation against compressed-tensors' own activation fake quant: every NVFP4 W4A4 fixture stores a seeded
// activation `w4a4.x` for layer 0 q_proj, its fake-quantized form `w4a4.x_fq` (forward_quantize) and
// `w4a4.y = x_fq · dequant(W)ᵀ` (tools/reference/fx_golden.py). MXFP4: the same for llama-mxfp4, and
// compressed-tensors' MXFP4 fake quant of recorded and edge-case activations (tests/data/mxfp4-activations,
// tools/reference/fx_mxfp4_activations.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "backends/cpu/cpu_linear.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/registry.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "model/planned_weights.h"
#include "plan/layer_plan.h"
#include "backends/cpu/prepare/repack.h"
#include "test_support.h"

namespace fp4serve {
namespace {

using model::test_support::kRef;

namespace fs = std::filesystem;
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
  kernels::linear(w, x.data(), m, y.data(), kernels::ActivationEmulation::EmulateNvfp4);
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(y_ref[i])));
    max_err = std::max(max_err, static_cast<double>(std::fabs(y[i] - y_ref[i])));
  }
  // The reference multiplies bf16-rounded weights in fp32; ours keeps fp32 weights: a few bf16 ulps apart.
  EXPECT_LE(max_err, 1e-2 * max_ref) << "max |Δy| " << max_err << " of max |y| " << max_ref;
}

// A W4A4 plan for a device with FP4 matrix units (sm100: native W4A4_NVFP4) loads: the packed weights with the
// checkpoint's input_global_scale and the activations quantized in the weights' format, which the CUDA backend runs
// on cuBLASLt's block-scaled FP4 and the CPU kernels emulate. PlannedWeights refused every native scheme before the
// kernel catalogues, so `explain --device sm100` promised a plan that no load accepted.
TEST_P(W4A4Golden, NativeW4A4PlanLoadsAndComputesTheReference) {
  const auto ckpt = checkpoint::Checkpoint::open(kRef / GetParam());
  const auto sm100 = backends::catalogue_for(plan::dry_run_device(100));
  const plan::LayerPlan p = plan::build_plan(ckpt, plan::PlanOptions{sm100.get()});
  ASSERT_EQ(p.find(kModule)->scheme, plan::SchemeId::W4A4Nvfp4);
  model::LoadProgress progress(1, 1, {});
  const model::PlannedWeights weights(ckpt, p, progress);
  const std::string attn = "model.layers.0.self_attn";
  model::LinearGroup qkv = weights.linear_group({attn + ".q_proj", attn + ".k_proj", attn + ".v_proj"});
  ASSERT_FALSE(qkv.parts().empty());
  const model::LinearPart& q = qkv.parts()[0];
  EXPECT_EQ(q.activation_quant, model::ActivationEmulation::EmulateNvfp4);
  EXPECT_EQ(q.weight.encoding, quant::WeightEncoding::Fp4);
  EXPECT_GT(q.weight.input_global_scale, 0.f);

  const checkpoint::SafetensorsFile golden(kRef / GetParam() / "golden.safetensors");
  const auto x_view = golden.view(*golden.find("w4a4.x"));
  const int64_t m = x_view.shape[0];
  const std::vector<float> x = floats(x_view);
  const std::vector<float> y_ref = floats(golden.view(*golden.find("w4a4.y")));  // [m, N of q_proj]
  const int64_t n_q = static_cast<int64_t>(y_ref.size()) / m;
  const int64_t qkv_out = qkv.out_features();
  std::vector<float> y(static_cast<size_t>(m * qkv_out), std::nanf(""));
  std::vector<float> scratch;
  backends::cpu::linear_forward(backends::cpu::prepare_linear_group(std::move(qkv)), x.data(), m, y.data(), scratch);
  double max_ref = 0.0, max_err = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n_q; ++j) {
      const double want = y_ref[static_cast<size_t>(i * n_q + j)];
      max_ref = std::max(max_ref, std::fabs(want));
      max_err = std::max(max_err, std::fabs(y[static_cast<size_t>(i * qkv_out + j)] - want));
    }
  }
  EXPECT_LE(max_err, 1e-2 * max_ref) << "max |Δy| " << max_err << " of max |y| " << max_ref;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, W4A4Golden, ::testing::ValuesIn(nvfp4_w4a4_fixtures()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// Equal as the reference computed them: the same bits, except that a NaN matches any NaN and the sign of an
// exact zero is not compared (torch.sign(-0.0) * 0 may give +0 where fp32 keeps -0; both read as 0).
bool same_value(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == 0.f && b == 0.f) return true;
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

struct FqCompare {
  int64_t values = 0, differ = 0, nan = 0, zero_groups = 0, subnormal_scale_groups = 0, inf_scale_groups = 0;
  std::string first;
};

FqCompare compare_mxfp4(const core::TensorView& xv, const core::TensorView& want) {
  FqCompare c;
  std::vector<float> x = floats(xv);
  const std::vector<float> ref = floats(want);
  const int64_t k = xv.shape.back();
  const int64_t m = xv.numel() / k;
  std::vector<float> got = x;
  kernels::emulate_mxfp4_activations(got.data(), m, k);
  for (size_t i = 0; i < got.size(); ++i) {
    ++c.values;
    c.nan += std::isnan(ref[i]) ? 1 : 0;
    if (!same_value(got[i], ref[i])) {
      if (c.differ++ == 0) c.first = "element " + std::to_string(i) + ": x " + std::to_string(x[i]) + " got " +
                                     std::to_string(got[i]) + " want " + std::to_string(ref[i]);
    }
  }
  for (size_t g = 0; g < x.size(); g += 32) {
    float amax = 0.f;
    for (size_t j = 0; j < 32; ++j) amax = std::isnan(amax) ? amax : (std::isnan(x[g + j]) ? x[g + j] : std::fmax(amax, std::fabs(x[g + j])));
    const uint8_t e = kernels::mxfp4_activation_exponent(amax);
    c.zero_groups += amax == 0.f ? 1 : 0;
    c.subnormal_scale_groups += (e == 0 && amax != 0.f) ? 1 : 0;
    c.inf_scale_groups += e == 255 ? 1 : 0;
  }
  return c;
}

const fs::path kMxAct = fs::path(FP4SERVE_TEST_DATA) / "mxfp4-activations" / "fq.safetensors";

TEST(Mxfp4ActivationFakeQuant, RecordedActivationsMatchCompressedTensorsBitForBit) {
  const checkpoint::SafetensorsFile fq(kMxAct);
  int64_t tensors = 0, values = 0;
  for (const checkpoint::TensorEntry& entry : fq.header().tensors) {
    const std::string& name = entry.name;
    if (name.rfind("recorded.", 0) != 0) continue;
    SCOPED_TRACE(name);
    const std::string module = name.substr(std::strlen("recorded."));
    const FqCompare c = compare_mxfp4(fq.view(*fq.find(name)), fq.view(*fq.find("recorded_fq." + module)));
    EXPECT_EQ(c.differ, 0) << "of " << c.values << "; first: " << c.first;
    values += c.values;
    ++tensors;
  }
  EXPECT_EQ(tensors, 3);
  RecordProperty("recorded_values", std::to_string(values));
}

TEST(Mxfp4ActivationFakeQuant, EdgeGroupsMatchCompressedTensorsBitForBit) {
  const checkpoint::SafetensorsFile fq(kMxAct);
  const auto edge = fq.view(*fq.find("edge"));
  const FqCompare c = compare_mxfp4(edge, fq.view(*fq.find("edge_fq")));
  EXPECT_EQ(c.differ, 0) << "of " << c.values << "; first: " << c.first;
  // The fixture really covers the boundaries it claims (a fixture that stopped doing so would pass vacuously).
  EXPECT_GE(c.zero_groups, 2);
  EXPECT_GE(c.subnormal_scale_groups, 4);
  EXPECT_GE(c.inf_scale_groups, 5);
  EXPECT_GE(c.nan, 5 * 32);
  // The E8M0 byte per group equals the one compressed-tensors' observer derived.
  const auto want_e = fq.view(*fq.find("edge_scale_exponent"));
  const std::vector<float> x = floats(edge);
  ASSERT_EQ(want_e.numel() * 32, static_cast<int64_t>(x.size()));
  int64_t exponent_differ = 0;
  for (int64_t g = 0; g < want_e.numel(); ++g) {
    float amax = 0.f;
    bool nan = false;
    for (int j = 0; j < 32; ++j) {
      nan = nan || std::isnan(x[static_cast<size_t>(g * 32 + j)]);
      amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(g * 32 + j)]));
    }
    const uint8_t got = kernels::mxfp4_activation_exponent(nan ? std::nanf("") : amax);
    if (got != want_e.load<uint8_t>(static_cast<size_t>(g))) ++exponent_differ;
  }
  EXPECT_EQ(exponent_differ, 0);
}

TEST(Mxfp4ActivationFakeQuant, FixtureW4A4ActivationAndOutputMatchCompressedTensors) {
  const auto ckpt = checkpoint::Checkpoint::open(kRef / "llama-mxfp4");
  const checkpoint::SafetensorsFile golden(kRef / "llama-mxfp4" / "golden.safetensors");
  const prepare::PreparedLinear w = prepare::prepare_mxfp4(ckpt.tensor(kModule + ".weight_packed"),
                                                           ckpt.tensor(kModule + ".weight_scale"), kModule);
  const auto x_view = golden.view(*golden.find("w4a4.x"));
  const FqCompare c = compare_mxfp4(x_view, golden.view(*golden.find("w4a4.x_fq")));
  EXPECT_EQ(c.differ, 0) << "of " << c.values << "; first: " << c.first;
  const int64_t m = x_view.shape[0];
  const std::vector<float> x = floats(x_view);
  const std::vector<float> y_ref = floats(golden.view(*golden.find("w4a4.y")));
  std::vector<float> y(y_ref.size(), std::nanf(""));
  kernels::linear(w, x.data(), m, y.data(), kernels::ActivationEmulation::EmulateMxfp4);
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(y_ref[i])));
    max_err = std::max(max_err, static_cast<double>(std::fabs(y[i] - y_ref[i])));
  }
  // Same weights (MXFP4 is exact in BF16), same activations: only the fp32 summation order differs.
  EXPECT_LE(max_err, 1e-6 * max_ref) << "max |Δy| " << max_err << " of max |y| " << max_ref;
  // Served weight-only, the same layer is off by the activation-quantization effect: the check has teeth.
  std::vector<float> y_wo(y_ref.size());
  kernels::linear(w, x.data(), m, y_wo.data());
  double wo_err = 0.0;
  for (size_t i = 0; i < y.size(); ++i) wo_err = std::max(wo_err, static_cast<double>(std::fabs(y_wo[i] - y_ref[i])));
  EXPECT_GT(wo_err, 1e-2 * max_ref);
}

}  // namespace
}  // namespace fp4serve
