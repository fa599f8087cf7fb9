// SPDX-License-Identifier: Apache-2.0
// GPU model ops (backends/cuda/kernels/ops.h) against their CPU kernels (src/backends/cpu/kernels/*.h, themselves
// checked against float64 references in tests/backends/cpu/kernels): seeded random non-zero inputs, odd sizes. Ops that
// only move or widen bits must match exactly; the others within a few fp32 ulps of the row scale (summation order and
// FMA contraction differ). Every test skips without a GPU; they run on the device machine (scripts/device-check.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels/activation.h"
#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/embedding.h"
#include "backends/cpu/kernels/norm.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "backends/cpu/kernels/rope.h"
#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/ops.h"
#include "backends/cuda/kernels/partition.h"
#include "core/tensor_view.h"
#include "model/rope_table.h"

namespace fp4serve::kernels::cuda {
namespace {

using kernels::testing::random_nonzero;
using model::RopeCache;
using model::RopeScaling;

template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  return DeviceBuffer<T>::from_host(std::span<const T>(host));
}

// Ops run on the legacy default stream (nullptr), which orders with DeviceBuffer's synchronous copies.
constexpr cudaStream_t kDefaultStream = nullptr;

// max |got − want| ≤ tol · max(1, max |want|)
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << "at " << at << ": got " << got[at] << ", want " << want[at];
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device(0)) GTEST_SKIP() << "no CUDA GPU on this machine";
  }
};

uint16_t bf16_bits_rne(float f) {  // independent round-to-nearest-even reference (no NaNs in these inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

TEST_F(CudaOps, EmbeddingGatherMatchesCpuExactly) {
  const int64_t vocab = 37, dim = 19;
  const std::vector<float> values = random_nonzero(static_cast<size_t>(vocab * dim), 1);
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = bf16_bits_rne(values[i]);
  const std::vector<int32_t> ids = {5, 0, 36, 5, 17, 2, 30, 11, 9, 36, 1};
  const core::TensorView view{core::DType::BF16, {vocab, dim},
                              std::span(reinterpret_cast<const std::byte*>(bits.data()), bits.size() * 2)};
  std::vector<float> want(ids.size() * dim);
  kernels::embedding_gather(view, ids.data(), static_cast<int64_t>(ids.size()), want.data());
  for (float& v : want) v *= 1.5f;

  const auto table = to_device(bits);
  const auto ids_dev = to_device(ids);
  DeviceBuffer<float> out(want.size());
  embedding_gather(table.data(), TableType::Bf16, vocab, dim, ids_dev.data(), static_cast<int64_t>(ids.size()), 1.5f,
                   out.data(), kDefaultStream);
  EXPECT_EQ(out.download(), want);

  std::vector<float> f32_table(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&f32_table[i], &u, 4);
  }
  const auto table32 = to_device(f32_table);
  embedding_gather(table32.data(), TableType::F32, vocab, dim, ids_dev.data(), static_cast<int64_t>(ids.size()), 1.5f,
                   out.data(), kDefaultStream);
  EXPECT_EQ(out.download(), want);
}

TEST_F(CudaOps, RmsNormMatchesCpu) {
  for (const auto& [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{7, 301}, {1, 576}, {13, 64}, {3, 4097}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    const auto x = random_nonzero(static_cast<size_t>(rows * dim), 2, 0.05f, 3.0f);
    const auto w = random_nonzero(static_cast<size_t>(dim), 3);
    std::vector<float> want(x.size());
    kernels::rms_norm(x.data(), w.data(), rows, dim, 1e-5f, want.data());
    const auto x_dev = to_device(x);
    const auto w_dev = to_device(w);
    DeviceBuffer<float> out(x.size());
    rms_norm(x_dev.data(), w_dev.data(), rows, dim, 1e-5f, out.data(), kDefaultStream);
    expect_close(out.download(), want, 1e-5);
    auto in_place = to_device(x);  // out may alias x
    rms_norm(in_place.data(), w_dev.data(), rows, dim, 1e-5f, in_place.data(), kDefaultStream);
    expect_close(in_place.download(), want, 1e-5);
  }
}

TEST_F(CudaOps, RopeMatchesCpuForEveryScaling) {
  RopeScaling llama3;
  llama3.kind = RopeScaling::Kind::Llama3;
  llama3.factor = 8;
  llama3.original_max_position_embeddings = 64;
  RopeScaling yarn;
  yarn.kind = RopeScaling::Kind::Yarn;
  yarn.factor = 4;
  yarn.original_max_position_embeddings = 128;
  RopeScaling linear;
  linear.kind = RopeScaling::Kind::Linear;
  linear.factor = 2;
  for (const RopeScaling& scaling : {RopeScaling{}, linear, llama3, yarn}) {
    SCOPED_TRACE(static_cast<int>(scaling.kind));
    const int64_t tokens = 5, heads = 3, head_dim = 34, max_pos = 1000;
    const RopeCache cache(head_dim, 10000.0, scaling, max_pos);
    const std::vector<int64_t> positions = {0, 7, 999, 123, 500};
    const auto x = random_nonzero(static_cast<size_t>(tokens * heads * head_dim), 4, 0.05f, 2.0f);
    std::vector<float> want = x;
    apply_rope(want.data(), tokens, heads, head_dim, positions.data(),
               RopeTable{cache.cos(0), cache.sin(0), cache.rotary_dim(), cache.max_positions()}, RopeLayout::NeoX);
    const size_t table = static_cast<size_t>(max_pos * head_dim / 2);
    const auto cos_dev = DeviceBuffer<float>::from_host(std::span(cache.cos(0), table));
    const auto sin_dev = DeviceBuffer<float>::from_host(std::span(cache.sin(0), table));
    const auto pos_dev = to_device(positions);
    auto x_dev = to_device(x);
    apply_rope_neox(x_dev.data(), tokens, heads, head_dim, head_dim, pos_dev.data(), cos_dev.data(), sin_dev.data(),
                    kDefaultStream);
    expect_close(x_dev.download(), want, 2e-6);
  }
}

TEST_F(CudaOps, SiluAndMulMatchesCpu) {
  const int64_t m = 5, inter = 77;
  const auto x = random_nonzero(static_cast<size_t>(m * 2 * inter), 5, 0.05f, 6.0f);
  const auto x_dev = to_device(x);
  DeviceBuffer<float> out(static_cast<size_t>(m * inter));
  std::vector<float> want(out.size());
  // expf on the GPU and the CPU's vectorized exp differ by a few ulps.
  kernels::silu_and_mul(x.data(), m, inter, want.data());
  silu_and_mul(x_dev.data(), m, inter, out.data(), kDefaultStream);
  expect_close(out.download(), want, 1e-5);
}

TEST_F(CudaOps, AddScaledAndRowCopies) {
  const int64_t n = 1031;
  const auto x = random_nonzero(static_cast<size_t>(n), 6);
  const auto d = random_nonzero(static_cast<size_t>(n), 7);
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<double>(x[i]) + 0.25 * d[i];
  auto x_dev = to_device(x);
  const auto d_dev = to_device(d);
  add_scaled(x_dev.data(), d_dev.data(), 0.25f, n, kDefaultStream);
  const auto got = x_dev.download();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1.2e-7 * 2) << i;

  // Rows 3, 0, 4 of a [5, 7] matrix (stride 9) to rows 2, 6, 1 of a [8, 7] matrix (stride 7).
  const auto src = random_nonzero(5 * 9, 8);
  const std::vector<int64_t> src_rows = {3, 0, 4}, dst_rows = {2, 6, 1};
  std::vector<float> dst(8 * 7, 0.5f);
  std::vector<float> expect = dst;
  for (size_t r = 0; r < 3; ++r) {
    for (size_t c = 0; c < 7; ++c) expect[dst_rows[r] * 7 + c] = src[src_rows[r] * 9 + c];
  }
  const auto src_dev = to_device(src);
  const auto sr = to_device(src_rows);
  const auto dr = to_device(dst_rows);
  auto dst_dev = to_device(dst);
  copy_rows(src_dev.data(), 9, sr.data(), dst_dev.data(), 7, dr.data(), 3, 7, kDefaultStream);
  EXPECT_EQ(dst_dev.download(), expect);
}

TEST_F(CudaOps, Bf16ConversionRoundsToNearestEven) {
  std::vector<float> x = random_nonzero(999, 9, 1e-3f, 1e3f);
  x.push_back(1.0f + 1.0f / 256.0f);        // a tie: rounds to the even 1.0
  x.push_back(1.0f + 3.0f / 256.0f);        // a tie: rounds up to the even neighbour
  const auto x_dev = to_device(x);
  DeviceBuffer<__nv_bfloat16> bits(x.size());
  f32_to_bf16(x_dev.data(), static_cast<int64_t>(x.size()), bits.data(), kDefaultStream);
  const auto got_bf16 = bits.download();
  std::vector<uint16_t> got(got_bf16.size());
  std::memcpy(got.data(), got_bf16.data(), got.size() * 2);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], bf16_bits_rne(x[i])) << i << ": " << x[i];
}

struct AttentionCase {
  int64_t t, start_pos, heads, kv_heads, head_dim, window;
};

TEST_F(CudaOps, AttentionMatchesCpuForPrefillDecodeGqaAndWindows) {
  for (const AttentionCase& c : std::vector<AttentionCase>{{5, 3, 6, 2, 40, 0},
                                                           {1, 200, 6, 2, 40, 0},
                                                           {9, 0, 4, 4, 64, 4},
                                                           {1, 300, 8, 1, 128, 17},
                                                           {17, 40, 14, 2, 64, 0},
                                                           {3, 10, 2, 1, 256, 0}}) {
    SCOPED_TRACE(::testing::Message() << "t " << c.t << " start " << c.start_pos << " H " << c.heads << " KVH "
                                    << c.kv_heads << " D " << c.head_dim << " W " << c.window);
    const int64_t len = c.start_pos + c.t;
    const int64_t stride = c.kv_heads * c.head_dim + 3;  // a padded row stride, as a cache slice may have
    const auto q = random_nonzero(static_cast<size_t>(c.t * c.heads * c.head_dim), 10, 0.05f, 2.0f);
    const auto k = random_nonzero(static_cast<size_t>(len * stride), 11, 0.05f, 2.0f);
    const auto v = random_nonzero(static_cast<size_t>(len * stride), 12);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want(q.size());
    kernels::attention(q.data(), c.t, c.start_pos, k.data(), v.data(), stride,
                       AttentionParams{c.heads, c.kv_heads, c.head_dim, scale, c.window, nullptr}, want.data());
    const auto q_dev = to_device(q);
    const auto k_dev = to_device(k);
    const auto v_dev = to_device(v);
    DeviceBuffer<float> out(q.size());
    attention(q_dev.data(), c.t, c.start_pos, k_dev.data(), v_dev.data(), stride,
              AttentionShape{c.heads, c.kv_heads, c.head_dim, scale, c.window, nullptr}, out.data(), kDefaultStream);
    expect_close(out.download(), want, 1e-5);
  }
}

// Split-KV decode attention (attention_decode) against the CPU kernel, one decode row per sequence: rows of
// different lengths (short, one split; long, many splits) sharing one cache at different base rows, GQA, a
// sliding window, GPT-OSS sinks, the planned split count and forced ones (1, 7 — uneven ranges, some empty for the
// short rows — and kMaxKvSplits).
TEST_F(CudaOps, SplitDecodeAttentionMatchesCpuOverLongContextsWindowsAndSinks) {
  struct Case {
    int64_t heads, kv_heads, head_dim, window;
    bool sinks;
  };
  const std::vector<int32_t> lens = {1, 37, 3000, 4097, 600};
  for (const Case& c : std::vector<Case>{{9, 3, 64, 0, false}, {8, 1, 128, 1000, false}, {4, 4, 40, 0, true},
                                         {6, 2, 256, 0, false}}) {
    const int64_t stride = c.kv_heads * c.head_dim + 5;
    std::vector<int64_t> base;
    int64_t rows_total = 0;
    for (const int32_t len : lens) {
      base.push_back(rows_total + 3);  // gaps between the sequences' cache rows
      rows_total += len + 3;
    }
    const auto rows = static_cast<int64_t>(lens.size());
    const auto q = random_nonzero(static_cast<size_t>(rows * c.heads * c.head_dim), 20, 0.05f, 2.0f);
    const auto k = random_nonzero(static_cast<size_t>(rows_total * stride), 21, 0.05f, 2.0f);
    const auto v = random_nonzero(static_cast<size_t>(rows_total * stride), 22);
    const auto sinks = random_nonzero(static_cast<size_t>(c.heads), 23, 0.5f, 3.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want(q.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t qd = c.heads * c.head_dim;
      kernels::attention(q.data() + r * qd, 1, lens[static_cast<size_t>(r)] - 1, k.data() + base[static_cast<size_t>(r)] * stride,
                         v.data() + base[static_cast<size_t>(r)] * stride, stride,
                         AttentionParams{c.heads, c.kv_heads, c.head_dim, scale, c.window,
                                         c.sinks ? sinks.data() : nullptr},
                         want.data() + r * qd);
    }
    const auto q_dev = to_device(q);
    const auto k_dev = to_device(k);
    const auto v_dev = to_device(v);
    const auto base_dev = to_device(base);
    const auto len_dev = to_device(lens);
    const auto sinks_dev = to_device(sinks);
    const DecodeAttentionBatch batch{q_dev.data(), k_dev.data(), v_dev.data(), stride, base_dev.data(),
                                     len_dev.data(), rows, 4097};
    const AttentionShape shape{c.heads, c.kv_heads, c.head_dim, scale, c.window, c.sinks ? sinks_dev.data() : nullptr};
    const int sms = cuda_device(0)->multiprocessors;
    for (const int64_t splits : {plan_kv_splits(rows, c.heads, 4097, sms), int64_t{1}, int64_t{7}, kMaxKvSplits}) {
      SCOPED_TRACE(::testing::Message() << "H " << c.heads << " KVH " << c.kv_heads << " D " << c.head_dim << " W "
                                        << c.window << " sinks " << c.sinks << " splits " << splits);
      const int64_t floats = attention_decode_workspace_floats(rows, c.heads, c.head_dim, splits);
      DeviceBuffer<float> workspace(static_cast<size_t>(floats));
      DeviceBuffer<float> out(q.size());
      FP4SERVE_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));  // NaN: an unwritten output fails
      attention_decode(batch, shape, splits, workspace.data(), floats, out.data(), kDefaultStream);
      expect_close(out.download(), want, 1e-5);
    }
    DeviceBuffer<float> small(8);
    DeviceBuffer<float> out(q.size());
    EXPECT_THROW(attention_decode(batch, shape, 2, small.data(), 8, out.data(), kDefaultStream), UsageError);
  }
}

// Decode attention of one query over keys seq_base … seq_base + len − 1 in float64 (softmax with the max
// subtracted; the sink joins the denominator only), written out here from the formula of ops.h.
std::vector<double> attention_f64(const float* q, const float* k, const float* v, int64_t stride, int64_t len,
                                  int64_t heads, int64_t kv_heads, int64_t d, double scale, int64_t window,
                                  const float* sinks) {
  std::vector<double> out(static_cast<size_t>(heads * d), 0.0);
  const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kvh = h / (heads / kv_heads);
    std::vector<double> score(static_cast<size_t>(len - first));
    double big = sinks != nullptr ? sinks[h] : -INFINITY;
    for (int64_t p = first; p < len; ++p) {
      double dot = 0.0;
      for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(q[h * d + j]) * k[p * stride + kvh * d + j];
      score[static_cast<size_t>(p - first)] = scale * dot;
      big = std::max(big, scale * dot);
    }
    double denom = sinks != nullptr ? std::exp(sinks[h] - big) : 0.0;
    for (double& sc : score) denom += (sc = std::exp(sc - big));
    for (int64_t p = first; p < len; ++p) {
      const double w = score[static_cast<size_t>(p - first)] / denom;
      for (int64_t j = 0; j < d; ++j) out[static_cast<size_t>(h * d + j)] += w * v[p * stride + kvh * d + j];
    }
  }
  return out;
}

// The split-KV decode attention at long contexts (up to 32768 keys, where each split walks ~1000 keys and the
// merge adds 32 partial softmaxes) against float64: the error must stay at fp32 rounding of the output scale,
// for the planned split count as for 1 and 32 splits, with a window and with sinks.
TEST_F(CudaOps, SplitDecodeAttentionMatchesAFloat64ReferenceAtLongContexts) {
  constexpr int64_t kHeads = 8, kKvHeads = 2, kDim = 128;
  const std::vector<int32_t> lens = {32768, 9000, 1, 20001};
  const int64_t stride = kKvHeads * kDim;
  std::vector<int64_t> base;
  int64_t total = 0;
  for (const int32_t len : lens) {
    base.push_back(total);
    total += len;
  }
  const auto rows = static_cast<int64_t>(lens.size());
  const auto q = random_nonzero(static_cast<size_t>(rows * kHeads * kDim), 31, 0.5f, 4.0f);  // peaked softmax
  const auto k = random_nonzero(static_cast<size_t>(total * stride), 32, 0.05f, 1.0f);
  const auto v = random_nonzero(static_cast<size_t>(total * stride), 33);
  const auto sinks = random_nonzero(static_cast<size_t>(kHeads), 34, 0.5f, 3.0f);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  const auto q_dev = to_device(q);
  const auto k_dev = to_device(k);
  const auto v_dev = to_device(v);
  const auto base_dev = to_device(base);
  const auto len_dev = to_device(lens);
  const auto sinks_dev = to_device(sinks);
  const int sms = cuda_device(0)->multiprocessors;
  for (const int64_t window : {int64_t{0}, int64_t{4000}}) {
    for (const bool with_sinks : {false, true}) {
      std::vector<double> want;
      for (int64_t r = 0; r < rows; ++r) {
        const auto one = attention_f64(q.data() + r * kHeads * kDim, k.data() + base[static_cast<size_t>(r)] * stride,
                                       v.data() + base[static_cast<size_t>(r)] * stride, stride,
                                       lens[static_cast<size_t>(r)], kHeads, kKvHeads, kDim, scale, window,
                                       with_sinks ? sinks.data() : nullptr);
        want.insert(want.end(), one.begin(), one.end());
      }
      const DecodeAttentionBatch batch{q_dev.data(), k_dev.data(), v_dev.data(), stride, base_dev.data(),
                                       len_dev.data(), rows, 32768};
      const AttentionShape shape{kHeads, kKvHeads, kDim, static_cast<float>(scale), window,
                                 with_sinks ? sinks_dev.data() : nullptr};
      for (const int64_t splits : {plan_kv_splits(rows, kHeads, 32768, sms), int64_t{1}, kMaxKvSplits}) {
        SCOPED_TRACE(::testing::Message() << "window " << window << " sinks " << with_sinks << " splits " << splits);
        const int64_t floats = attention_decode_workspace_floats(rows, kHeads, kDim, splits);
        DeviceBuffer<float> workspace(static_cast<size_t>(floats));
        DeviceBuffer<float> out(q.size());
        FP4SERVE_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));  // NaN: an unwritten output fails
        attention_decode(batch, shape, splits, workspace.data(), floats, out.data(), kDefaultStream);
        const std::vector<float> got = out.download();
        double worst = 0.0;
        for (size_t i = 0; i < want.size(); ++i) {
          const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
          worst = std::isnan(d) ? INFINITY : std::max(worst, d);
        }
        // |v| ≤ 1, so every output is a convex combination within [−1, 1]; fp32 scores (σ ≈ 1.4, max ≈ 6) carry
        // ~1e-6 relative error into the weights, the sums of up to 32768 terms a few 1e-6 more.
        EXPECT_LE(worst, 2e-5) << "max |GPU − float64| over " << want.size() << " outputs";
      }
    }
  }
}

TEST(CudaOpsHost, AttentionRejectsUnsupportedShapesBeforeLaunching) {
  // Host-side argument checks run without a GPU.
  EXPECT_THROW(attention(nullptr, 1, 0, nullptr, nullptr, 512, AttentionShape{2, 1, 512, 1.0f}, nullptr, nullptr),
               UnsupportedError);
  EXPECT_THROW(attention(nullptr, 1, 0, nullptr, nullptr, 64, AttentionShape{3, 2, 32, 1.0f}, nullptr, nullptr),
               UsageError);
  EXPECT_THROW(attention(nullptr, 1, 0, nullptr, nullptr, 16, AttentionShape{2, 1, 32, 1.0f}, nullptr, nullptr),
               UsageError);
  EXPECT_THROW(apply_rope_neox(nullptr, 1, 1, 8, 9, nullptr, nullptr, nullptr, nullptr), UsageError);
  const DecodeAttentionBatch none{};
  EXPECT_THROW(attention_decode(none, AttentionShape{2, 1, 512, 1.0f}, 1, nullptr, 0, nullptr, nullptr),
               UnsupportedError);
  DecodeAttentionBatch one{};
  one.rows = 1;
  one.cache_row_stride = 64;
  EXPECT_THROW(attention_decode(one, AttentionShape{2, 1, 64, 1.0f}, 0, nullptr, 0, nullptr, nullptr), UsageError);
  EXPECT_THROW(attention_decode(one, AttentionShape{2, 1, 64, 1.0f}, kMaxKvSplits + 1, nullptr, 0, nullptr, nullptr),
               UsageError);
  // A workspace too small, and missing pointers, are refused before any launch.
  EXPECT_THROW(attention_decode(one, AttentionShape{2, 1, 64, 1.0f}, 2, nullptr, 1000, nullptr, nullptr), UsageError);
  float fake[1];
  EXPECT_THROW(attention_decode(one, AttentionShape{2, 1, 64, 1.0f}, 1, fake, 1000, nullptr, nullptr), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels::cuda
