// SPDX-License-Identifier: Apache-2.0
// The run-time approximations of LoadOptions (activation_precision = int8 | bf16 | auto, lm_head_dtype = fp8 | int8,
// kv_cache_dtype = bf16 | fp16 | auto) on the reference fixtures: logits of both prompts against transformers'
// fp32 golden within a bound that covers the approximation, and different from the exact path's logits (the
// option must reach the kernels). Bounds, relative to max|golden logit|: the weight-only path is within 1.2e-3 on these fixtures (docs/quality.md); int8 activations add an
// error per linear of ≤ Σ|w|·d/2 (backends/cpu/kernels/linear.h): measured 1.9–2.7e-3 in all (FP4 and int4, whose
// auto is int8 too: 1.8–2.7e-3), bound 5e-3; the per-row
// lm_head copies move each logit by ≤ Σ_k |x_k|·s/2 (int8: measured 7.1–8.4e-3, bound 1.2e-2) or ≈ 2^−4·Σ|x·w| (fp8:
// measured 2.9–3.0e-2, bound 4e-2). A 16-bit KV cache rounds each key and value by ≤ 2^−8 (bf16) or 2^−11 (fp16)
// of itself: measured 4.2–11e-4 (bf16, fp16, auto = bf16 on these bfloat16 fixtures), bound 3e-3. bf16
// activations round each linear's input by ≤ 2^−8 of itself: measured 7.1e-4–1.5e-3 (the weight-only path alone
// is within 1.2e-3), bound 3e-3; on an unquantized checkpoint only the lm_head takes them (its other layers and
// MoE routers keep fp32 x): 1.7e-3 on llama-bf16, bound 3e-3. FP8 layers under bf16 also round their weights
// (e4m3 · scale) to bf16: 1.7–2.2e-3 against the exact path on llama-fp8-block / -dynamic, bound 3e-3. bf16 with a
// bf16 cache also runs the prefill's attention on bf16 dot products (q and the softmax weights rounded to bf16, on
// AVX512-BF16 CPUs): 1.7–2.3e-3, bound 3e-3. The exact
// path runs fp32 activations and an fp32 cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>

#include "backends/cpu/cpu_kv_storage.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/load_model.h"
#include "checkpoint/safetensors.h"
#include "fp4serve/error.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using test_support::kRef;

namespace fs = std::filesystem;

std::vector<float> prompt_logits(const LoadedModel& loaded, const std::vector<int32_t>& ids) {
  KvCache cache = loaded.decoder->make_cache(64, 1);
  const int slot = cache.acquire();
  SequenceChunk chunk{slot, 0, ids, true};
  return loaded.decoder->forward(std::span(&chunk, 1), cache);
}

using prepare::ActivationPrecision;
constexpr std::optional<ActivationPrecision> kAutoPrecision;  // --activation-precision auto
constexpr std::optional<KvCacheDtype> kAutoKv;                 // --kv-cache-dtype auto

struct PrecisionCase {
  std::string fixture;
  std::optional<ActivationPrecision> activation_precision;
  LmHeadDtype lm_head_dtype;
  double tolerance;  // max|Δ| vs the golden, relative to max|golden logit|
  std::optional<KvCacheDtype> kv_cache_dtype = KvCacheDtype::F32;
  // The golden includes FP8 activation quantization (the W8A8 llama-fp8-* fixtures), which the CPU's weight-only
  // path leaves out (up to 6e-2 apart, decoder_parity_test.cpp): the option is measured against the exact path's
  // logits instead, with the same kind of bound.
  bool against_exact = false;
};

std::string choice_name(std::optional<ActivationPrecision> p) {
  return p ? std::string(prepare::activation_precision_name(*p)) : "auto";
}
std::string choice_name(std::optional<KvCacheDtype> d) { return d ? std::string(kv_cache_dtype_name(*d)) : "auto"; }

class RunPrecision : public ::testing::TestWithParam<PrecisionCase> {};

TEST_P(RunPrecision, LogitsStayNearTheGoldenAndDifferFromTheExactPath) {
  const PrecisionCase& c = GetParam();
  const fs::path dir = kRef / c.fixture;
  if (!fs::exists(dir / "golden.safetensors")) GTEST_SKIP() << dir << " is not present";
  // auto gives int4 (W4A16) layers int8 wherever the SIMD int8 kernel runs, AVX512-BF16 or not.
  const bool int4_fixture = c.fixture == "llama-w4a16" || c.fixture == "llama-w4a16-asym";
  if (!c.activation_precision && !kernels::bf16_dot_active() && !(int4_fixture && kernels::int8_kernel_active())) {
    GTEST_SKIP() << "auto is fp32 on this CPU (no AVX512-BF16): nothing differs from the exact path";
  }
  // An unquantized checkpoint's only bf16 layer is its lm_head, and an FP8 one's other layers are FP8: both keep
  // fp32 x where there are no bf16 dot products (kernels/linear.h), so then nothing differs either.
  const bool no_fp4 = c.fixture.find("-bf16") != std::string::npos || c.fixture.find("-fp8") != std::string::npos;
  if (no_fp4 && c.activation_precision == ActivationPrecision::Bf16 && !kernels::bf16_dot_active()) {
    GTEST_SKIP() << "bf16 on a checkpoint without FP4 layers (unquantized or FP8) keeps fp32 x on this CPU (no "
                    "AVX512-BF16)";
  }
  LoadOptions exact_options;
  exact_options.activation_precision = ActivationPrecision::Fp32;
  exact_options.kv_cache_dtype = KvCacheDtype::F32;
  LoadOptions options = exact_options;
  options.activation_precision = c.activation_precision;
  options.lm_head_dtype = c.lm_head_dtype;
  options.kv_cache_dtype = c.kv_cache_dtype;
  const LoadedModel exact = load_model(dir, exact_options);
  const LoadedModel approx = load_model(dir, options);
  const checkpoint::SafetensorsFile golden(dir / "golden.safetensors");
  for (const std::string prompt : {"prompt0", "prompt1"}) {
    SCOPED_TRACE(prompt);
    const auto ids_view = golden.view(*golden.find(prompt));
    std::vector<int32_t> ids(static_cast<size_t>(ids_view.numel()));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(ids_view.load<int64_t>(i));
    const auto want = golden.view(*golden.find("logits." + prompt));
    const std::vector<float> got = prompt_logits(approx, ids);
    const std::vector<float> ref = prompt_logits(exact, ids);
    ASSERT_EQ(got.size(), static_cast<size_t>(want.numel()));
    double max_ref = 0, max_diff = 0, max_vs_exact = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double r = c.against_exact ? ref[i] : want.load<float>(i);
      max_ref = std::max(max_ref, std::fabs(r));
      max_diff = std::max(max_diff, std::fabs(r - got[i]));
      max_vs_exact = std::max(max_vs_exact, std::fabs(static_cast<double>(got[i]) - ref[i]));
    }
    EXPECT_LE(max_diff, c.tolerance * max_ref) << "max|Δ| = " << max_diff << ", max|logit| = " << max_ref;
    EXPECT_GT(max_vs_exact, 1e-6 * max_ref) << "the option changed nothing: it did not reach the kernels";
    RecordProperty(prompt + "_max_rel_diff", std::to_string(max_diff / max_ref));
  }
}

constexpr auto kFp32 = ActivationPrecision::Fp32;
constexpr auto kBf16 = ActivationPrecision::Bf16;
constexpr auto kInt8 = ActivationPrecision::Int8;
INSTANTIATE_TEST_SUITE_P(
    Fixtures, RunPrecision,
    ::testing::Values(PrecisionCase{"llama-nvfp4a16", kInt8, LmHeadDtype::Bf16, 5e-3},
                      PrecisionCase{"llama-mxfp4a16", kInt8, LmHeadDtype::Bf16, 5e-3},
                      PrecisionCase{"qwen3-nvfp4a16", kInt8, LmHeadDtype::Bf16, 5e-3},
                      PrecisionCase{"llama-w4a16", kInt8, LmHeadDtype::Bf16, 5e-3},
                      PrecisionCase{"llama-w4a16-asym", kInt8, LmHeadDtype::Bf16, 5e-3},
                      PrecisionCase{"llama-w4a16-asym", kAutoPrecision, LmHeadDtype::Bf16, 5e-3},
                      PrecisionCase{"llama-bf16", kFp32, LmHeadDtype::Int8, 1.2e-2},
                      PrecisionCase{"llama-bf16", kFp32, LmHeadDtype::Fp8, 4e-2},
                      PrecisionCase{"llama-nvfp4a16", kInt8, LmHeadDtype::Int8, 1.2e-2},
                      PrecisionCase{"llama-bf16", kFp32, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::Bf16},
                      PrecisionCase{"llama-nvfp4a16", kFp32, LmHeadDtype::Bf16, 3e-3, kAutoKv},
                      PrecisionCase{"qwen3-nvfp4a16", kFp32, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::F16},
                      PrecisionCase{"mixtral-nvfp4a16", kFp32, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::Bf16},
                      PrecisionCase{"llama-bf16", kBf16, LmHeadDtype::Bf16, 3e-3},
                      PrecisionCase{"granitemoe-bf16", kBf16, LmHeadDtype::Bf16, 3e-3},
                      PrecisionCase{"llama-nvfp4a16", kBf16, LmHeadDtype::Bf16, 3e-3},
                      PrecisionCase{"llama-mxfp4a16", kBf16, LmHeadDtype::Bf16, 3e-3},
                      PrecisionCase{"qwen3-nvfp4a16", kBf16, LmHeadDtype::Bf16, 3e-3},
                      PrecisionCase{"mixtral-nvfp4a16", kBf16, LmHeadDtype::Bf16, 3e-3},
                      // A bf16 cache under bf16: the prefill's attention on bf16 dot products too.
                      PrecisionCase{"llama-bf16", kBf16, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::Bf16},
                      PrecisionCase{"llama-nvfp4a16", kBf16, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::Bf16},
                      PrecisionCase{"qwen3-nvfp4a16", kBf16, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::Bf16},
                      PrecisionCase{"llama-fp8-block", kBf16, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::F32, true},
                      PrecisionCase{"llama-fp8-dynamic", kBf16, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::F32, true},
                      PrecisionCase{"llama-fp8-block", kAutoPrecision, LmHeadDtype::Bf16, 3e-3, KvCacheDtype::F32, true},
                      PrecisionCase{"llama-nvfp4a16", kAutoPrecision, LmHeadDtype::Bf16, 3e-3}),
    [](const ::testing::TestParamInfo<PrecisionCase>& p) {
      std::string n = p.param.fixture + "_a_" + choice_name(p.param.activation_precision) + "_lm_head_" +
                      std::string(lm_head_dtype_name(p.param.lm_head_dtype)) + "_kv_" +
                      choice_name(p.param.kv_cache_dtype);
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

// The GPU runs fp32 activations, the stored lm_head and an fp32 KV cache: a CPU-only choice with --device cuda is
// refused, naming the option, before any GPU is looked for or any weight read (so this runs without a GPU).
TEST(RunPrecision, CpuOnlyChoicesOnTheGpuAreUsageErrors) {
  const auto message_of = [](const LoadOptions& options) {
    try {
      (void)load_model(kRef / "llama-nvfp4a16", options);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no UsageError");
  };
  LoadOptions options;
  options.device = plan::DeviceChoice::Cuda;
  options.activation_precision = ActivationPrecision::Int8;
  EXPECT_NE(message_of(options).find("--activation-precision int8 / --lm-head-dtype bf16 are CPU"), std::string::npos) << message_of(options);
  options.activation_precision = kAutoPrecision;
  options.lm_head_dtype = LmHeadDtype::Fp8;
  EXPECT_NE(message_of(options).find("--lm-head-dtype fp8 are CPU decode paths"), std::string::npos) << message_of(options);
  options.lm_head_dtype = LmHeadDtype::Bf16;
  options.kv_cache_dtype = KvCacheDtype::Bf16;
  EXPECT_NE(message_of(options).find("--kv-cache-dtype bf16: the GPU backend keeps an fp32"), std::string::npos) << message_of(options);
  options.kv_cache_dtype = kAutoKv;
  options.batch_invariant = true;
  EXPECT_NE(message_of(options).find("--device cuda: --batch-invariant is a mode of the CPU kernels"), std::string::npos)
      << message_of(options);
}

// auto follows the checkpoint's dtype on the CPU (as vLLM's auto), and is fp32 on the GPU, whose cache is fp32;
// a 16-bit choice for the GPU is refused rather than ignored.
TEST(RunPrecision, KvCacheDtypeChoices) {
  using plan::DeviceKind;
  EXPECT_EQ(resolve_kv_cache_dtype(kAutoKv, DeviceKind::Cpu, "bfloat16"), KvCacheDtype::Bf16);
  EXPECT_EQ(resolve_kv_cache_dtype(kAutoKv, DeviceKind::Cpu, "float16"), KvCacheDtype::F16);
  EXPECT_EQ(resolve_kv_cache_dtype(kAutoKv, DeviceKind::Cpu, "float32"), KvCacheDtype::F32);
  EXPECT_EQ(resolve_kv_cache_dtype(kAutoKv, DeviceKind::Cpu, ""), KvCacheDtype::F32);
  EXPECT_EQ(resolve_kv_cache_dtype(kAutoKv, DeviceKind::Cuda, "bfloat16"), KvCacheDtype::F32);
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::F32, DeviceKind::Cpu, "bfloat16"), KvCacheDtype::F32);
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::F16, DeviceKind::Cpu, "bfloat16"), KvCacheDtype::F16);
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::Bf16, DeviceKind::Cpu, "float32"), KvCacheDtype::Bf16);
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::F32, DeviceKind::Cuda, ""), KvCacheDtype::F32);
  EXPECT_THROW(resolve_kv_cache_dtype(KvCacheDtype::Bf16, DeviceKind::Cuda, ""), UsageError);
  EXPECT_THROW(resolve_kv_cache_dtype(KvCacheDtype::F16, DeviceKind::Cuda, ""), UsageError);
  // The loaded model says what its caches store, and they store it.
  LoadOptions options;
  const LoadedModel loaded = load_model(kRef / "llama-nvfp4a16", options);
  EXPECT_EQ(loaded.config.dtype, "bfloat16");
  EXPECT_EQ(loaded.kv_element, KvCacheDtype::Bf16);
  KvCache cache = loaded.decoder->make_cache(8, 1);
  EXPECT_EQ(cache.element(), KvCacheDtype::Bf16);
  const int slot = cache.acquire();
  backends::cpu::CpuKvStorage& host = backends::cpu::host_kv(cache);
  EXPECT_THROW(backends::cpu::host_key(cache, slot, 0, 0, 0), UsageError);  // fp32 rows only
  EXPECT_EQ(static_cast<char*>(host.key_data(0, 0, 0, 1)) - static_cast<char*>(host.key_data(0, 0, 0, 0)),
            cache.head_dim() * 2);
}

TEST(RunPrecision, ActivationPrecisionChoices) {
  // auto: for a bfloat16 checkpoint on a CPU whose kernels run bf16 dot products, what the measurement of that
  // shape chose (bf16, or int8 for batched rows; kernels::probe_activation_precision); fp32 elsewhere.
  using plan::DeviceKind;
  const std::array<int64_t, 2> shape{1536, 576};
  if (kernels::bf16_dot_active()) {
    const ActivationPrecision got = resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16", shape);
    EXPECT_TRUE(got == ActivationPrecision::Bf16 || got == ActivationPrecision::Bf16DecodeInt8)
        << prepare::activation_precision_name(got);
    // Measured once per process, thread count and shape: asked again, the same answer.
    EXPECT_EQ(resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16", shape), got);
  } else {
    EXPECT_EQ(resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16", shape), ActivationPrecision::Fp32);
  }
  EXPECT_EQ(resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "float16"), ActivationPrecision::Fp32);
  EXPECT_EQ(resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "float32"), ActivationPrecision::Fp32);
  EXPECT_EQ(resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, ""), ActivationPrecision::Fp32);
  EXPECT_EQ(resolve_activation_precision(kAutoPrecision, DeviceKind::Cuda, "bfloat16"), ActivationPrecision::Fp32);
  // --activation-quant emulate is the numerical reference: auto keeps fp32 activations (the lm_head too); an
  // explicit choice still holds.
  const ActivationPrecisionChoice emulating =
      choose_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16", shape, /*emulating=*/true);
  EXPECT_EQ(emulating.precision, ActivationPrecision::Fp32);
  EXPECT_NE(emulating.reason.find("emulate"), std::string::npos) << emulating.reason;
  EXPECT_EQ(resolve_activation_precision(kBf16, DeviceKind::Cpu, "bfloat16", shape, /*emulating=*/true),
            ActivationPrecision::Bf16);
  EXPECT_EQ(resolve_activation_precision(kFp32, DeviceKind::Cpu, "bfloat16"), ActivationPrecision::Fp32);
  EXPECT_EQ(resolve_activation_precision(kBf16, DeviceKind::Cpu, "float32"), ActivationPrecision::Bf16);
  EXPECT_EQ(resolve_activation_precision(kInt8, DeviceKind::Cpu, ""), ActivationPrecision::Int8);
  EXPECT_EQ(resolve_activation_precision(ActivationPrecision::Int8Decode, DeviceKind::Cpu, ""),
            ActivationPrecision::Int8Decode);
  EXPECT_EQ(prepare::activation_precision_name(ActivationPrecision::Bf16), "bf16");
  EXPECT_EQ(prepare::activation_precision_name(ActivationPrecision::Int8Decode), "int8-decode");
  // The reasons explain prints: each rule by name, and for auto the measurement behind the choice.
  EXPECT_EQ(choose_activation_precision(kInt8, DeviceKind::Cpu, "", shape).reason, "set by --activation-precision");
  EXPECT_NE(choose_activation_precision(kAutoPrecision, DeviceKind::Cuda, "bfloat16", shape).reason.find("GPU"),
            std::string::npos);
  const ActivationPrecisionChoice f16 = choose_activation_precision(kAutoPrecision, DeviceKind::Cpu, "float16", shape);
  EXPECT_EQ(f16.precision, ActivationPrecision::Fp32);
  if (kernels::bf16_dot_active()) {
    EXPECT_NE(f16.reason.find("dtype is float16"), std::string::npos) << f16.reason;
    const ActivationPrecisionChoice measured = choose_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16", shape);
    EXPECT_EQ(measured.precision, resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16", shape));
    if (measured.reason.find("no SIMD int8 kernel") == std::string::npos) {
      EXPECT_NE(measured.reason.find("[1536, 576]"), std::string::npos) << measured.reason;
      // "within" the margin exactly when the batched rows run int8.
      EXPECT_EQ(measured.reason.find("within the 0.80 margin") != std::string::npos,
                measured.precision == ActivationPrecision::Bf16DecodeInt8)
          << measured.reason;
    }
  }
  // Without bf16 dot products auto falls back to fp32 on the same CPU.
  kernels::set_bf16_dot_allowed(false);
  EXPECT_EQ(resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16"), ActivationPrecision::Fp32);
  EXPECT_NE(choose_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16", shape).reason.find("AVX512-BF16"),
            std::string::npos);
  kernels::set_bf16_dot_allowed(true);
  // The loaded model says what its linears take: auto resolved for its shape.
  const LoadedModel loaded = load_model(kRef / "llama-nvfp4a16", LoadOptions{});
  EXPECT_EQ(loaded.activation_precision,
            resolve_activation_precision(kAutoPrecision, DeviceKind::Cpu, "bfloat16",
                                         {std::max(loaded.config.intermediate_size, loaded.config.hidden_size),
                                          loaded.config.hidden_size}));
  LoadOptions fp32;
  fp32.activation_precision = kFp32;
  EXPECT_EQ(load_model(kRef / "llama-nvfp4a16", fp32).activation_precision, ActivationPrecision::Fp32);
}

// Int4 (W4A16) linears: a given choice is theirs too; auto is int8 on a CPU with the SIMD int8 kernel (fp32 x is
// 3-4x slower, bf16 dot products about 2x per GEMM), the FP4 linears' choice elsewhere, under emulation and on the GPU.
TEST(RunPrecision, Int4ActivationPrecisionChoices) {
  using plan::DeviceKind;
  for (ActivationPrecision given : {kFp32, kBf16, kInt8, ActivationPrecision::Bf16DecodeInt8}) {
    EXPECT_EQ(choose_int4_activation_precision(given, DeviceKind::Cpu, ActivationPrecision::Bf16).precision, given);
  }
  EXPECT_NE(choose_int4_activation_precision(kBf16, DeviceKind::Cpu, kBf16).reason.find("fp32 x"), std::string::npos);
  const ActivationPrecisionChoice cpu = choose_int4_activation_precision(kAutoPrecision, DeviceKind::Cpu, kBf16);
  EXPECT_EQ(cpu.precision, kernels::int8_kernel_active() ? kInt8 : kBf16) << cpu.reason;
  EXPECT_EQ(choose_int4_activation_precision(kAutoPrecision, DeviceKind::Cpu, kFp32, /*emulating=*/true).precision, kFp32);
  EXPECT_EQ(choose_int4_activation_precision(kAutoPrecision, DeviceKind::Cuda, kFp32).precision, kFp32);
  // The loaded model carries it, and its int4 layers run it. Against a given bf16 (the lm_head's precision at a
  // prompt's rows under auto too, while int4 layers take bf16 dot products), auto's logits differ exactly where auto
  // gave the int4 layers int8; RunPrecision above bounds them against the golden.
  const LoadedModel loaded = load_model(kRef / "llama-w4a16", LoadOptions{});
  EXPECT_EQ(loaded.int4_activation_precision, kernels::int8_kernel_active() ? kInt8 : loaded.activation_precision);
  LoadOptions bf16;
  bf16.activation_precision = kBf16;
  const LoadedModel given = load_model(kRef / "llama-w4a16", bf16);
  EXPECT_EQ(given.int4_activation_precision, kBf16);
  if (kernels::int8_kernel_active() && kernels::bf16_dot_active()) {
    const std::vector<int32_t> ids{1, 17, 42, 99, 5, 250, 7, 64};
    const std::vector<float> a = prompt_logits(loaded, ids), b = prompt_logits(given, ids);
    double max_diff = 0, max_logit = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      max_logit = std::max(max_logit, std::fabs(static_cast<double>(b[i])));
    }
    EXPECT_GT(max_diff, 1e-6 * max_logit) << "the int4 layers did not take auto's int8";
  }
  // A checkpoint without int4 layers reports its FP4 precision for them (the start-up line names only that).
  EXPECT_EQ(load_model(kRef / "llama-nvfp4a16", LoadOptions{}).int4_activation_precision,
            load_model(kRef / "llama-nvfp4a16", LoadOptions{}).activation_precision);
  EXPECT_EQ(activation_precision_summary(given), "bf16");
  if (kernels::int8_kernel_active()) {
    EXPECT_EQ(activation_precision_summary(loaded),
              std::string(prepare::activation_precision_name(loaded.activation_precision)) + ", int4 layers int8");
  }
}

}  // namespace
}  // namespace fp4serve::model
