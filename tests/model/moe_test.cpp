// SPDX-License-Identifier: Apache-2.0
// MoE unit tests against float64 references written here: the two router families, the MoE block (SiLU-gated,
// swiglu-oai on interleaved GPT-OSS rows and on halves), fused 3-D expert slicing, and the load-time errors of
// quantized MoE checkpoints (dead experts, expert counts that disagree with config.json, per-shard scales).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/load_model.h"
#include "backends/registry.h"
#include "checkpoint/safetensors_writer.h"
#include "fp4serve/error.h"
#include "model/moe.h"
#include "model/planned_weights.h"
#include "model/router.h"
#include "plan/layer_plan.h"
#include "backends/cpu/prepare/repack.h"
#include "quant/linear_weights.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using test_support::f32_view;
using test_support::kRef;

namespace fs = std::filesystem;

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// float64 references ----------------------------------------------------------------------------------------

struct Routed {
  std::vector<int> experts;
  std::vector<double> weights;
};

std::vector<int> argsort_desc(const std::vector<double>& v) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
  return idx;
}

Routed reference_route(RouterKind kind, const float* logits, int e, int k, bool renormalize, double scaling) {
  std::vector<double> l(logits, logits + e);
  Routed r;
  if (kind == RouterKind::SoftmaxTopK) {
    const double mx = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (double& x : l) sum += (x = std::exp(x - mx));
    for (double& x : l) x /= sum;
    const auto order = argsort_desc(l);
    double top_sum = 0;
    for (int j = 0; j < k; ++j) {
      r.experts.push_back(order[j]);
      r.weights.push_back(l[order[j]]);
      top_sum += l[order[j]];
    }
    if (renormalize) for (double& w : r.weights) w /= top_sum;
  } else {
    const auto order = argsort_desc(l);
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      r.experts.push_back(order[j]);
      r.weights.push_back(std::exp(l[order[j]] - l[order[0]]));
      sum += r.weights.back();
    }
    for (double& w : r.weights) w /= sum;
  }
  for (double& w : r.weights) w *= scaling;
  return r;
}

double silu(double x) { return x / (1 + std::exp(-x)); }

// y = W x for W [n, k] row-major.
std::vector<double> matvec(const std::vector<float>& w, const float* x, int64_t n, int64_t k) {
  std::vector<double> y(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) y[r] += static_cast<double>(w[r * k + c]) * x[c];
  }
  return y;
}

// Router tests ----------------------------------------------------------------------------------------------

struct RouterCase {
  RouterKind kind;
  bool renormalize;
  float scaling;
};

class RouterTest : public ::testing::TestWithParam<RouterCase> {};

// Routing as the backends run it: with the CPU's softmax and top-k.
void route(const RouterSettings& s, const float* logits, int64_t m, int32_t* experts, float* weights) {
  model::route(s, logits, m, experts, weights, backends::cpu::router_math());
}

TEST_P(RouterTest, MatchesFloat64Reference) {
  const RouterCase c = GetParam();
  const int e = 7, k = 3, m = 9;
  std::vector<float> logits = random_vector(static_cast<size_t>(m * e), 11, 2.0f);
  RouterSettings s{c.kind, e, k, c.renormalize, c.scaling};
  std::vector<int32_t> experts(m * k);
  std::vector<float> weights(m * k);
  route(s, logits.data(), m, experts.data(), weights.data());
  for (int t = 0; t < m; ++t) {
    const Routed want = reference_route(c.kind, logits.data() + t * e, e, k, c.renormalize, c.scaling);
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(experts[t * k + j], want.experts[j]) << "token " << t << " slot " << j;
      EXPECT_NEAR(weights[t * k + j], want.weights[j], 1e-6) << "token " << t << " slot " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, RouterTest,
                         ::testing::Values(RouterCase{RouterKind::SoftmaxTopK, false, 1.0f},  // Qwen norm_topk_prob=false
                                           RouterCase{RouterKind::SoftmaxTopK, true, 1.0f},   // Mixtral, Qwen3-MoE
                                           RouterCase{RouterKind::SoftmaxTopK, true, 2.5f},   // routed_scaling_factor
                                           RouterCase{RouterKind::TopKSoftmax, false, 1.0f}));  // GraniteMoe, GPT-OSS

TEST(Router, SoftmaxTopKWeightsSumToOneOnlyWhenRenormalized) {
  const int e = 6, k = 2;
  const std::vector<float> logits = random_vector(e, 5);
  std::vector<int32_t> idx(k);
  std::vector<float> w(k);
  route({RouterKind::SoftmaxTopK, e, k, false, 1.0f}, logits.data(), 1, idx.data(), w.data());
  EXPECT_LT(w[0] + w[1], 0.999f);
  route({RouterKind::SoftmaxTopK, e, k, true, 1.0f}, logits.data(), 1, idx.data(), w.data());
  EXPECT_NEAR(w[0] + w[1], 1.0f, 1e-6f);
}

TEST(Router, RejectsTopKOutsideTheExperts) {
  float logits[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  int32_t idx[5];
  float w[5];
  EXPECT_THROW(route({RouterKind::SoftmaxTopK, 4, 5, true, 1.0f}, logits, 1, idx, w), UsageError);
  EXPECT_THROW(route({RouterKind::TopKSoftmax, 4, 0, true, 1.0f}, logits, 1, idx, w), UsageError);
}

// MoE block tests -------------------------------------------------------------------------------------------

// The CPU backend the blocks below run on (a block keeps a pointer to its backend: this one outlives them all).
Backend* block_backend() {
  static const std::unique_ptr<Backend> cpu = backends::make_cpu_backend();
  return cpu.get();
}

// A dense layer that owns copies of w [n, k] and bias [n] (the block uploads it later, after the caller's vectors).
LinearGroup dense_group(const std::vector<float>& w, int64_t n, int64_t k, const std::vector<float>* bias = nullptr) {
  std::vector<LinearPart> parts(1);
  parts[0].weight = quant::dense_weights(w, n, k, "test");
  if (bias != nullptr) {
    std::vector<std::byte> bytes(bias->size() * sizeof(float));
    std::memcpy(bytes.data(), bias->data(), bytes.size());
    parts[0].weight.rows[0].bias = parts[0].weight.keep(std::move(bytes), core::DType::F32, {n});
    parts[0].weight.rows[0].has_bias = true;
  }
  return LinearGroup(std::move(parts), {"test"});
}

struct BlockCase {
  ExpertActivation activation;
  bool interleaved_source;  // the w13 rows come from a GPT-OSS style interleaved tensor via slice_expert
};

class MoeBlockTest : public ::testing::TestWithParam<BlockCase> {};

TEST_P(MoeBlockTest, MatchesFloat64Reference) {
  const BlockCase c = GetParam();
  const int64_t e = 5, k = 2, h = 24, inter = 12, m = 11;
  const int64_t rows = 2 * inter;
  const std::vector<float> router_w = random_vector(static_cast<size_t>(e * h), 1, 0.5f);
  const std::vector<float> router_b = random_vector(static_cast<size_t>(e), 2, 0.1f);
  // source_w13[x]: the expert's w13 as the checkpoint stores it (interleaved gate/up rows when asked)
  const std::vector<float> w13_all = random_vector(static_cast<size_t>(e * rows * h), 3, 0.3f);
  const std::vector<float> b13_all = random_vector(static_cast<size_t>(e * rows), 4, 0.1f);
  const std::vector<float> down_all = random_vector(static_cast<size_t>(e * h * inter), 5, 0.3f);
  const std::vector<float> x = random_vector(static_cast<size_t>(m * h), 6);

  std::vector<ExpertWeights> experts;
  const core::TensorView w13_view = f32_view(w13_all, {e, rows, h});
  const core::TensorView b13_view = f32_view(b13_all, {e, rows});
  for (int64_t i = 0; i < e; ++i) {
    ExpertSlice w = slice_expert(w13_view, i, c.interleaved_source, false, "w13");
    ExpertSlice b = slice_expert(b13_view, i, c.interleaved_source, false, "b13");
    std::vector<LinearPart> parts(1);
    quant::LinearWeights& lw = parts[0].weight;  // owns the slices: the block uploads them after this loop
    lw.in_features = h;
    quant::WeightRows r;
    r.name = "w13";
    // A slice without reordering views the source (which outlives the block); a reordered one is owned.
    r.weight = w.bytes.empty() ? w.view : lw.keep(std::move(w.bytes), w.view.dtype, w.view.shape);
    r.bias = b.bytes.empty() ? b.view : lw.keep(std::move(b.bytes), b.view.dtype, b.view.shape);
    r.has_bias = true;
    lw.rows.push_back(std::move(r));
    std::vector<float> down(down_all.begin() + i * h * inter, down_all.begin() + (i + 1) * h * inter);
    experts.push_back({LinearGroup(std::move(parts), {"w13"}), dense_group(down, h, inter)});
  }
  MoeSettings s;
  s.router = {RouterKind::TopKSoftmax, e, k, false, 1.0f};
  s.activation = c.activation;
  s.swiglu_limit = 0.8f;  // small, so the clamps are exercised by these inputs
  MoeBlock block("test MoE", s, dense_group(router_w, e, h, &router_b), std::move(experts), std::nullopt,
                 block_backend());
  std::vector<float> got(static_cast<size_t>(m * h));
  block.forward(x.data(), m, got.data(), nullptr);

  for (int64_t t = 0; t < m; ++t) {
    const float* xt = x.data() + t * h;
    std::vector<double> logits = matvec(router_w, xt, e, h);
    std::vector<float> logits_f(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) logits_f[i] = static_cast<float>(logits[i] + router_b[i]);
    const Routed r = reference_route(RouterKind::TopKSoftmax, logits_f.data(), static_cast<int>(e), static_cast<int>(k), false, 1.0);
    std::vector<double> want(static_cast<size_t>(h), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int ex = r.experts[j];
      std::vector<float> w13(w13_all.begin() + ex * rows * h, w13_all.begin() + (ex + 1) * rows * h);
      std::vector<double> z = matvec(w13, xt, rows, h);
      for (int64_t i = 0; i < rows; ++i) z[i] += b13_all[ex * rows + i];
      std::vector<float> act(static_cast<size_t>(inter));
      for (int64_t i = 0; i < inter; ++i) {
        // The checkpoint's own row convention: interleaved (gate 2i, up 2i+1) or halves (gate i, up I+i).
        const double g = c.interleaved_source ? z[2 * i] : z[i];
        const double u = c.interleaved_source ? z[2 * i + 1] : z[inter + i];
        double a = 0;
        switch (c.activation) {
          case ExpertActivation::SiluGated: a = silu(g) * u; break;
          case ExpertActivation::SwigluOai: {
            const double gc = std::min(g, 0.8), uc = std::clamp(u, -0.8, 0.8);
            a = (uc + 1) * gc / (1 + std::exp(-1.702 * gc));
            break;
          }
        }
        act[i] = static_cast<float>(a);
      }
      std::vector<float> down(down_all.begin() + ex * h * inter, down_all.begin() + (ex + 1) * h * inter);
      const std::vector<double> y = matvec(down, act.data(), h, inter);
      for (int64_t i = 0; i < h; ++i) want[i] += r.weights[j] * y[i];
    }
    for (int64_t i = 0; i < h; ++i) EXPECT_NEAR(got[t * h + i], want[i], 1e-4) << "token " << t << " column " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, MoeBlockTest,
                         ::testing::Values(BlockCase{ExpertActivation::SiluGated, false},
                                           BlockCase{ExpertActivation::SwigluOai, true},   // GPT-OSS rows
                                           BlockCase{ExpertActivation::SwigluOai, false}));  // halves

TEST(MoeBlock, W13MustHoldGateAndUpRows) {
  const int64_t e = 2, h = 8, inter = 8;
  const std::vector<float> router = random_vector(e * h, 1);
  const std::vector<float> w2i = random_vector(2 * inter * h, 2), wi = random_vector(inter * h, 3);
  const std::vector<float> down = random_vector(h * inter, 4);
  auto experts = [&](const std::vector<float>& w13, int64_t rows) {
    std::vector<ExpertWeights> out;
    for (int i = 0; i < e; ++i) out.push_back({dense_group(w13, rows, h), dense_group(down, h, inter)});
    return out;
  };
  MoeSettings gated;
  gated.router = {RouterKind::SoftmaxTopK, e, 1, true, 1.0f};
  EXPECT_NO_THROW(
      MoeBlock("g", gated, dense_group(router, e, h), experts(w2i, 2 * inter), std::nullopt, block_backend()));
  // A w13 of I rows (an up projection without its gate) is refused, naming the expert and the expected shape.
  try {
    MoeBlock("g", gated, dense_group(router, e, h), experts(wi, inter), std::nullopt, block_backend());
    ADD_FAILURE() << "an [I, H] w13 was accepted";
  } catch (const FormatError& err) {
    EXPECT_NE(std::string(err.what()).find("g expert 0: w13 [8, 8] and down [8, 8] where [16, 8]"), std::string::npos)
        << err.what();
  }
  // An expert count that disagrees with the router.
  auto three = experts(w2i, 2 * inter);
  three.push_back({dense_group(w2i, 2 * inter, h), dense_group(down, h, inter)});
  EXPECT_THROW(MoeBlock("g", gated, dense_group(router, e, h), std::move(three), std::nullopt, block_backend()),
               FormatError);
}

// The checkpoint-order weights of an expert (owned copies here, as a reordered GPT-OSS gate|up slice is) are freed
// once it is uploaded and before the next expert is read: a layer's experts never sit in memory twice (the backend's
// repacked copy is the only one), and the block gives the same output as one built from a list.
TEST(MoeBlock, LoadsOneExpertAtATimeAndFreesItsCheckpointOrderCopies) {
  const int64_t e = 4, k = 2, h = 8, inter = 8, m = 3;
  const std::vector<float> router = random_vector(e * h, 41, 0.5f);
  const std::vector<float> w13 = random_vector(2 * inter * h, 42, 0.3f), down = random_vector(h * inter, 43, 0.3f);
  const std::vector<float> x = random_vector(m * h, 44);
  MoeSettings s;
  s.router = {RouterKind::SoftmaxTopK, e, k, true, 1.0f};
  std::vector<std::weak_ptr<const void>> copies;
  int64_t calls = 0;
  const auto load = [&](int64_t i) {
    EXPECT_EQ(i, calls++);
    for (const auto& c : copies) EXPECT_TRUE(c.expired()) << "an earlier expert's copy is alive when expert " << i << " is read";
    ExpertWeights w{dense_group(w13, 2 * inter, h), dense_group(down, h, inter)};
    for (LinearGroup* g : {&w.w13, &w.down}) copies.push_back(g->parts().at(0).weight.owned.at(0));
    return w;
  };
  const MoeBlock lazy("lazy", s, dense_group(router, e, h), e, load, std::nullopt, block_backend());
  EXPECT_EQ(calls, e);
  for (const auto& c : copies) EXPECT_TRUE(c.expired());
  std::vector<ExpertWeights> list;
  for (int64_t i = 0; i < e; ++i) list.push_back({dense_group(w13, 2 * inter, h), dense_group(down, h, inter)});
  const MoeBlock listed("listed", s, dense_group(router, e, h), std::move(list), std::nullopt, block_backend());
  std::vector<float> a(static_cast<size_t>(m * h)), b(a.size());
  lazy.forward(x.data(), m, a.data(), nullptr);
  listed.forward(x.data(), m, b.data(), nullptr);
  EXPECT_EQ(a, b);
}

// Qwen2-MoE: routed experts (softmax → top-k, no renormalization) plus sigmoid(gate(h)) · shared_expert(h).
TEST(MoeBlock, SharedExpertWithSigmoidGateMatchesFloat64Reference) {
  const int64_t e = 4, k = 2, h = 16, inter = 8, si = 24, m = 7;
  const std::vector<float> router = random_vector(e * h, 21, 0.5f);
  const std::vector<float> w13 = random_vector(e * 2 * inter * h, 22, 0.3f), down = random_vector(e * h * inter, 23, 0.3f);
  const std::vector<float> s13 = random_vector(2 * si * h, 24, 0.3f), sdown = random_vector(h * si, 25, 0.3f);
  const std::vector<float> sgate = random_vector(h, 26, 0.5f);
  const std::vector<float> x = random_vector(m * h, 27);
  std::vector<ExpertWeights> experts;
  for (int64_t i = 0; i < e; ++i) {
    experts.push_back({dense_group({w13.begin() + i * 2 * inter * h, w13.begin() + (i + 1) * 2 * inter * h}, 2 * inter, h),
                       dense_group({down.begin() + i * h * inter, down.begin() + (i + 1) * h * inter}, h, inter)});
  }
  MoeSettings s;
  s.router = {RouterKind::SoftmaxTopK, e, k, false, 1.0f};
  MoeBlock block("qwen2moe", s, dense_group(router, e, h), std::move(experts),
                 SharedExpertWeights{dense_group(s13, 2 * si, h), dense_group(sdown, h, si), dense_group(sgate, 1, h)},
                 block_backend());
  std::vector<float> got(m * h);
  block.forward(x.data(), m, got.data(), nullptr);
  auto swiglu_mlp = [&](const std::vector<float>& wa, const std::vector<float>& wd, int64_t width, const float* xt) {
    const std::vector<double> z = matvec(wa, xt, 2 * width, h);
    std::vector<float> a(width);
    for (int64_t i = 0; i < width; ++i) a[i] = static_cast<float>(silu(z[i]) * z[width + i]);
    return matvec(wd, a.data(), h, width);
  };
  for (int64_t t = 0; t < m; ++t) {
    const float* xt = x.data() + t * h;
    const std::vector<double> l = matvec(router, xt, e, h);
    const std::vector<float> lf(l.begin(), l.end());
    const Routed r = reference_route(RouterKind::SoftmaxTopK, lf.data(), e, k, false, 1.0);
    std::vector<double> want(h, 0.0);
    for (int j = 0; j < k; ++j) {
      const int ex = r.experts[j];
      const std::vector<double> y = swiglu_mlp({w13.begin() + ex * 2 * inter * h, w13.begin() + (ex + 1) * 2 * inter * h},
                                               {down.begin() + ex * h * inter, down.begin() + (ex + 1) * h * inter}, inter, xt);
      for (int64_t i = 0; i < h; ++i) want[i] += r.weights[j] * y[i];
    }
    const double g = 1 / (1 + std::exp(-matvec(sgate, xt, 1, h)[0]));
    const std::vector<double> shared = swiglu_mlp(s13, sdown, si, xt);
    for (int64_t i = 0; i < h; ++i) EXPECT_NEAR(got[t * h + i], want[i] + g * shared[i], 1e-4) << t << ", " << i;
  }
}

TEST(SliceExpert, DeinterleavesAndTransposes) {
  // [E=3, R=6, C=4] with value = 100·e + 10·r + c.
  std::vector<float> v;
  for (int e = 0; e < 3; ++e)
    for (int r = 0; r < 6; ++r)
      for (int c = 0; c < 4; ++c) v.push_back(static_cast<float>(100 * e + 10 * r + c));
  const core::TensorView t = f32_view(v, {3, 6, 4});
  const ExpertSlice halves = slice_expert(t, 2, true, false, "t");
  ASSERT_EQ(halves.view.shape, (std::vector<int64_t>{6, 4}));
  const int want_rows[6] = {0, 2, 4, 1, 3, 5};
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(halves.view.load<float>(r * 4 + c), 200 + 10 * want_rows[r] + c);
  // As a GPT-OSS dense [E, K=6, N=4] weight: transposed to [N=4, K=6].
  const ExpertSlice tr = slice_expert(t, 1, false, true, "t");
  ASSERT_EQ(tr.view.shape, (std::vector<int64_t>{4, 6}));
  for (int n = 0; n < 4; ++n)
    for (int k = 0; k < 6; ++k) EXPECT_EQ(tr.view.load<float>(n * 6 + k), 100 + 10 * k + n);
  // Both: transposed to [4, 6], then its rows deinterleaved (0, 2, 1, 3).
  const ExpertSlice both = slice_expert(t, 1, true, true, "t");
  ASSERT_EQ(both.view.shape, (std::vector<int64_t>{4, 6}));
  const int want_n[4] = {0, 2, 1, 3};
  for (int n = 0; n < 4; ++n)
    for (int k = 0; k < 6; ++k) EXPECT_EQ(both.view.load<float>(n * 6 + k), 100 + 10 * k + want_n[n]);
  // Neither: a view of the expert's bytes in the tensor, no copy (the checkpoint's pages, not a second copy).
  const ExpertSlice plain = slice_expert(t, 1, false, false, "t");
  EXPECT_TRUE(plain.bytes.empty());
  ASSERT_EQ(plain.view.shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(plain.view.bytes.data(), t.bytes.data() + 24 * sizeof(float));
  EXPECT_EQ(plain.view.bytes.size(), 24 * sizeof(float));
  EXPECT_THROW(slice_expert(t, 3, false, false, "t"), FormatError);
  EXPECT_THROW(slice_expert(f32_view(v, {3, 3, 8}), 0, true, false, "t"), FormatError);
}

// Load-time checks on quantized MoE checkpoints ---------------------------------------------------------------

// A copy of a fixture in a temporary folder with some tensors or config keys changed.
class FixtureCopy {
 public:
  FixtureCopy(const std::string& fixture, const std::string& tag) : dir_(fs::temp_directory_path() / ("fp4serve_moe_" + tag)) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const auto& entry : fs::directory_iterator(kRef / fixture)) fs::copy(entry.path(), dir_ / entry.path().filename());
  }
  ~FixtureCopy() { fs::remove_all(dir_); }
  const fs::path& dir() const { return dir_; }

  void set_scalar(const std::string& tensor, float value) {
    std::vector<checkpoint::TensorRecord> records;
    {
      const auto ckpt = checkpoint::Checkpoint::open(dir_);
      ASSERT_TRUE(ckpt.contains(tensor)) << tensor;
      for (const std::string& name : ckpt.tensor_names()) {
        const core::TensorView view = ckpt.tensor(name);
        checkpoint::TensorRecord r{name, view.dtype, view.shape, {view.bytes.begin(), view.bytes.end()}};
        if (name == tensor) std::memcpy(r.bytes.data(), &value, sizeof(float));
        records.push_back(std::move(r));
      }
    }
    checkpoint::write_safetensors(dir_ / "model.safetensors", records);
  }

  void set_config(const std::string& key, const nlohmann::json& value) {
    std::ifstream in(dir_ / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config[key] = value;
    std::ofstream(dir_ / "config.json") << config.dump(2);
  }

 private:
  fs::path dir_;
};

std::string load_error(const fs::path& dir) {
  LoadOptions options;
  try {
    load_model(dir, options);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(MoeLoad, DeadExpertGlobalScaleIsAnErrorNamingTheExpert) {
  for (const float bad : {0.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    FixtureCopy copy("mixtral-nvfp4a16", "dead");
    copy.set_scalar("model.layers.1.block_sparse_moe.experts.2.up_proj.weight_global_scale", bad);
    const std::string error = load_error(copy.dir());
    EXPECT_NE(error.find("model.layers.1.block_sparse_moe.experts.2.up_proj.weight_global_scale"), std::string::npos)
        << bad << ": " << error;
  }
}

TEST(MoeLoad, ExpertCountThatDisagreesWithConfigIsAnError) {
  {
    FixtureCopy copy("qwen3moe-nvfp4a16", "fewer");
    copy.set_config("num_local_experts", 3);
    const std::string error = load_error(copy.dir());
    EXPECT_NE(error.find("unconsumed model.layers.0.mlp.experts.3.down_proj.weight_packed"), std::string::npos) << error;
  }
  {
    FixtureCopy copy("granitemoe-mxfp4a16", "more");
    copy.set_config("num_local_experts", 5);
    const std::string error = load_error(copy.dir());
    EXPECT_NE(error.find("missing model.layers.0.block_sparse_moe.experts.4.gate_proj.weight_packed"), std::string::npos) << error;
  }
}

TEST(MoeLoad, GroupSizeThatDoesNotDivideTheExpertKIsAnError) {
  FixtureCopy copy("mixtral-nvfp4a16", "group");
  copy.set_config("intermediate_size", 56);  // the expert width = K of every down_proj: 56 % 16 ≠ 0
  const std::string error = load_error(copy.dir());
  EXPECT_NE(error.find("model.layers.0.block_sparse_moe.experts.0.down_proj: in_features K = 56 is not divisible by "
                       "the NVFP4 group size 16"), std::string::npos) << error;
}

// w1/w3 (gate/up) global scales of one expert that differ are not an error and stay per shard inside the fused
// w13, never merged by max. (LLM Compressor itself gives gate and up one shared global scale, so the fixture's
// expert 1 gets a different up scale here.)
TEST(MoeLoad, GateAndUpGlobalScalesStayPerShard) {
  FixtureCopy copy("mixtral-nvfp4a16", "shards");
  const std::string x = "model.layers.0.block_sparse_moe.experts.1";
  float gate = 0.0f, up = 0.0f;
  {
    const auto original = checkpoint::Checkpoint::open(copy.dir());
    gate = original.tensor(x + ".gate_proj.weight_global_scale").load<float>(0);
    up = 1.5f * original.tensor(x + ".up_proj.weight_global_scale").load<float>(0);
  }
  copy.set_scalar(x + ".up_proj.weight_global_scale", up);
  ASSERT_NE(gate, up);
  const auto ckpt = checkpoint::Checkpoint::open(copy.dir());
  const auto catalogue = backends::catalogue_for(plan::resolve_device(plan::DeviceChoice::Cpu));
  const plan::LayerPlan p = plan::build_plan(ckpt, plan::PlanOptions{catalogue.get()});
  LoadProgress progress(1, 1, {});
  const PlannedWeights weights(ckpt, p, progress);
  const LinearGroup w13 = weights.linear_group({x + ".gate_proj", x + ".up_proj"});
  ASSERT_EQ(w13.parts().size(), 1u) << "the plan runs w13 fused";
  // Checkpoint order: one row block per shard, each with its own global scale …
  const quant::LinearWeights& lw = w13.parts()[0].weight;
  ASSERT_EQ(lw.rows.size(), 2u);
  EXPECT_EQ(lw.rows[0].out_features(), 64);
  EXPECT_EQ(lw.rows[0].global_scale, gate);
  EXPECT_EQ(lw.rows[1].global_scale, up);
  // … and the CPU layout keeps each row's.
  const std::vector<float> gs = prepare::prepare_linear(lw).global_scale;
  for (int r = 0; r < 64; ++r) EXPECT_EQ(gs[r], gate) << x << " row " << r;
  for (int r = 64; r < 128; ++r) EXPECT_EQ(gs[r], up) << x << " row " << r;
  EXPECT_EQ(load_error(copy.dir()), "");
}

}  // namespace
}  // namespace fp4serve::model
