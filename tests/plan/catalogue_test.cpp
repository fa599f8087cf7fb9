// SPDX-License-Identifier: Apache-2.0
// The device kernel catalogues (backends/cpu/catalogue.h, backends/cuda/catalogue.h) as the plan asks them: what
// each device runs, and the refusals the plan turns into "no scheme" — the answers `explain` prints and the loader
// plans with. (Here beside the plan tests: they are the plan's view of the backends.)
#include <gtest/gtest.h>

#include <string>

#include "backends/cuda/catalogue.h"
#include "backends/cuda/kernels/limits.h"
#include "backends/registry.h"
#include "plan/device_caps.h"
#include "plan/kernel_catalogue.h"

namespace fp4serve::plan {
namespace {

constexpr SchemeId kAll[] = {SchemeId::W4A4Nvfp4,         SchemeId::W4A16Nvfp4, SchemeId::W4A4Nvfp4Emulated,
                             SchemeId::W4A4Mxfp4,         SchemeId::W4A4Mxfp4Emulated, SchemeId::W4A16Mxfp4,
                             SchemeId::W4A16Int4,         SchemeId::W8A8Fp8,    SchemeId::W8A16Fp8,
                             SchemeId::Unquantized};

LinearQuery query(SchemeId scheme, int64_t n = 96, int64_t k = 352) {
  LinearQuery q;
  q.scheme = scheme;
  q.out_features = n;
  q.in_features = k;
  return q;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

TEST(CpuCatalogue, RunsEveryWeightOnlyAndEmulatedSchemeAndRefusesMatrixUnitSchemes) {
  const auto cpu = backends::catalogue_for(resolve_device(DeviceChoice::Cpu));
  EXPECT_TRUE(cpu->backend().starts_with("cpu-"));
  for (SchemeId s : kAll) {
    const KernelChoice k = cpu->linear(query(s));
    const bool native = scheme_traits(s).activations == ActivationMode::Native;
    EXPECT_EQ(k.ok(), !native) << scheme_name(s) << ": " << k.why_not;
    EXPECT_EQ(k.why_not.empty(), k.ok()) << scheme_name(s);
    if (native) {
      EXPECT_TRUE(contains(k.why_not, "matrix units")) << k.why_not;
    }
  }
  EXPECT_TRUE(cpu->attention({512, 8, 2}).ok());
  EXPECT_TRUE(cpu->online_transform({8192}).ok());
}

TEST(CudaCatalogue, Sm90RunsFp4AndBf16AndRefusesInt4Fp8AndNativeW4A4) {
  const auto sm90 = backends::catalogue_for(dry_run_device(90));
  EXPECT_EQ(sm90->backend(), "cuda-sm90");
  for (SchemeId s : {SchemeId::W4A16Nvfp4, SchemeId::W4A16Mxfp4, SchemeId::W4A4Mxfp4Emulated, SchemeId::Unquantized}) {
    const KernelChoice k = sm90->linear(query(s));
    EXPECT_TRUE(k.ok()) << scheme_name(s) << ": " << k.why_not;
    EXPECT_FALSE(k.hardware_verified) << scheme_name(s);  // no CUDA kernel has run on a GPU yet
  }
  EXPECT_TRUE(contains(sm90->linear(query(SchemeId::W4A16Int4)).why_not, "no CUDA int4 kernel"));
  EXPECT_TRUE(contains(sm90->linear(query(SchemeId::W8A16Fp8)).why_not, "no CUDA FP8 kernel"));
  EXPECT_TRUE(contains(sm90->linear(query(SchemeId::W8A8Fp8)).why_not, "no CUDA FP8 kernel"));
  EXPECT_TRUE(contains(sm90->linear(query(SchemeId::W4A4Nvfp4)).why_not, "no FP4 matrix units"));
  // The NVFP4 emulation loads as bf16 weights (the producer's decompression), which the GPU's W4A4 path cannot take.
  EXPECT_TRUE(contains(sm90->linear(query(SchemeId::W4A4Nvfp4Emulated)).why_not, "no NVFP4 W4A4 emulation"));
}

TEST(CudaCatalogue, NativeW4A4FollowsTheMatrixUnitsOfEachFamily) {
  const auto sm100 = backends::catalogue_for(dry_run_device(100));
  const auto sm120 = backends::catalogue_for(dry_run_device(120));
  EXPECT_TRUE(contains(sm100->linear(query(SchemeId::W4A4Nvfp4)).kernel, "native"));
  EXPECT_TRUE(contains(sm100->linear(query(SchemeId::W4A4Mxfp4)).kernel, "native"));
  // An emulated MXFP4 W4A4 layer (FP4 weights) runs on the native units where they exist (linear_w4a4 picks cuBLASLt).
  EXPECT_TRUE(contains(sm100->linear(query(SchemeId::W4A4Mxfp4Emulated)).kernel, "native"));
  EXPECT_FALSE(sm100->linear(query(SchemeId::W4A4Nvfp4Emulated)).ok());
  EXPECT_TRUE(sm120->linear(query(SchemeId::W4A4Nvfp4)).ok());
  const KernelChoice mx = sm120->linear(query(SchemeId::W4A4Mxfp4));
  EXPECT_FALSE(mx.ok());
  EXPECT_TRUE(contains(mx.why_not, "sm100 family")) << mx.why_not;
  EXPECT_TRUE(contains(sm120->linear(query(SchemeId::W4A4Mxfp4Emulated)).kernel, "fake-quant"));
}

TEST(CudaCatalogue, ShapeAndLayoutLimitsAreRefusedWithTheLimit) {
  const auto sm90 = backends::catalogue_for(dry_run_device(90));
  LinearQuery g_idx = query(SchemeId::W4A16Nvfp4);
  g_idx.activation_order = true;
  EXPECT_TRUE(contains(sm90->linear(g_idx).why_not, "column permutation"));
  EXPECT_TRUE(sm90->attention({kernels::cuda::kMaxAttentionHeadDim, 8, 2}).ok());
  const KernelChoice wide = sm90->attention({kernels::cuda::kMaxAttentionHeadDim * 2, 8, 2});
  EXPECT_TRUE(contains(wide.why_not, std::to_string(kernels::cuda::kMaxAttentionHeadDim))) << wide.why_not;
  EXPECT_TRUE(sm90->online_transform({kernels::cuda::kMaxTransformBlock}).ok());
  EXPECT_FALSE(sm90->online_transform({kernels::cuda::kMaxTransformBlock * 2}).ok());
  EXPECT_FALSE(sm90->linear(query(SchemeId::Unquantized, int64_t{1} << 32, 64)).ok());  // cuBLAS int dimensions
}

TEST(CudaCatalogue, BelowSm80AndBuildsWithoutKernelsRunNothing) {
  const auto sm75 = backends::catalogue_for(dry_run_device(75));
  EXPECT_TRUE(contains(sm75->linear(query(SchemeId::Unquantized)).why_not, "below sm80"));
  EXPECT_FALSE(sm75->attention({64, 8, 2}).ok());
  DeviceCaps h200 = dry_run_device(90);
  h200.detected = true;  // a GPU found on this machine, asked of a build without the CUDA kernels
  const backends::cuda::CudaCatalogue without(h200, false);
  EXPECT_TRUE(contains(without.linear(query(SchemeId::W4A16Nvfp4)).why_not, "without CUDA kernels"));
  EXPECT_FALSE(without.attention({64, 8, 2}).ok());
}

}  // namespace
}  // namespace fp4serve::plan
