// SPDX-License-Identifier: Apache-2.0
// The online transforms that run outside a Linear's input, against float64 math written here:
//  - `output` (compressed-tensors forward hook on a Linear): y_shard ← (x·Wᵀ + b) · M̂ block-diagonally, each
//    shard of a fused q|k|v group on its own slice only, fused and unfused;
//  - `q_attn` / `k_cache` (attention query/key hooks): post-RoPE q ← q·M̂_q and k ← k·M̂_k per head before the
//    scores and the KV-cache write. With M̂_q·M̂_kᵀ = I the scores, hence the logits, equal those of the model
//    without transforms, while the cache must hold the rotated keys: checked as plain keys · M̂_k in float64.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <map>
#include <random>

#include "backends/cpu/cpu_kv_storage.h"
#include "backends/cpu/cpu_linear.h"
#include "backends/registry.h"
#include "fp4serve/error.h"
#include "model/decoder.h"
#include "model/linear_group.h"
#include "model/online_transform.h"
#include "quant/linear_weights.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using test_support::f32_view;
using test_support::sylvester;

std::vector<double> random_values(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// I + 0.3·G/√b: invertible and far from orthogonal, so a dropped transpose or scale would show.
std::vector<double> random_matrix(int64_t b, uint32_t seed) {
  std::vector<double> m = random_values(static_cast<size_t>(b * b), seed, 0.3 / std::sqrt(static_cast<double>(b)));
  for (int64_t i = 0; i < b; ++i) m[static_cast<size_t>(i * b + i)] += 1.0;
  return m;
}

// Gauss–Jordan with partial pivoting (b ≤ 32 here).
std::vector<double> inverse(std::vector<double> a, int64_t b) {
  std::vector<double> inv(static_cast<size_t>(b * b), 0.0);
  for (int64_t i = 0; i < b; ++i) inv[static_cast<size_t>(i * b + i)] = 1.0;
  auto at = [b](std::vector<double>& m, int64_t r, int64_t c) -> double& { return m[static_cast<size_t>(r * b + c)]; };
  for (int64_t c = 0; c < b; ++c) {
    int64_t piv = c;
    for (int64_t r = c + 1; r < b; ++r) {
      if (std::fabs(at(a, r, c)) > std::fabs(at(a, piv, c))) piv = r;
    }
    for (int64_t j = 0; j < b; ++j) {
      std::swap(at(a, c, j), at(a, piv, j));
      std::swap(at(inv, c, j), at(inv, piv, j));
    }
    const double d = at(a, c, c);
    for (int64_t j = 0; j < b; ++j) {
      at(a, c, j) /= d;
      at(inv, c, j) /= d;
    }
    for (int64_t r = 0; r < b; ++r) {
      if (r == c) continue;
      const double f = at(a, r, c);
      for (int64_t j = 0; j < b; ++j) {
        at(a, r, j) -= f * at(a, c, j);
        at(inv, r, j) -= f * at(inv, c, j);
      }
    }
  }
  return inv;
}

// rows × width values `stride` apart: each b-wide slice ← slice · e (e row-major b×b), in float64.
void rotate_reference(std::vector<double>& y, int64_t rows, int64_t offset, int64_t width, int64_t stride,
                      const std::vector<double>& e, int64_t b) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t blk = offset; blk < offset + width; blk += b) {
      std::vector<double> out(static_cast<size_t>(b), 0.0);
      for (int64_t j = 0; j < b; ++j) {
        for (int64_t i = 0; i < b; ++i) out[static_cast<size_t>(j)] += y[static_cast<size_t>(r * stride + blk + i)] * e[static_cast<size_t>(i * b + j)];
      }
      for (int64_t j = 0; j < b; ++j) y[static_cast<size_t>(r * stride + blk + j)] = out[static_cast<size_t>(j)];
    }
  }
}

// A transform built by the production path from stored tensors (kept alive here).
struct StoredTransform {
  std::vector<float> matrix;
  std::vector<int64_t> perm;
  std::shared_ptr<const OnlineTransform> transform;
};

StoredTransform make_transform(TransformCache& cache, const std::vector<double>& stored, int64_t b, const std::string& type,
                               bool inverse, std::vector<int64_t> perm = {}) {
  StoredTransform t{to_float(stored), std::move(perm), nullptr};
  TransformSource source{"test." + type, type, inverse, f32_view(t.matrix, {b, b}), std::nullopt};
  if (!t.perm.empty()) {
    source.perm = core::TensorView{core::DType::I64, {b}, std::as_bytes(std::span<const int64_t>(t.perm))};
  }
  t.transform = cache.get(source);
  return t;
}

TEST(OutputTransform, FusedAndUnfusedShardsTransformOnlyTheirOwnSliceBiasIncluded) {
  constexpr int64_t kK = 24, kM = 5;
  const std::vector<int64_t> n{32, 16, 16};  // q | k | v
  TransformCache cache;
  // q: random-matrix b16 (dense, unscaled); k: Sylvester hadamard b8 (FWHT, ÷√8); v: none.
  const std::vector<double> mq = random_matrix(16, 11);
  const std::vector<double> h8 = sylvester(8);
  const StoredTransform tq = make_transform(cache, mq, 16, "random-matrix", false);
  const StoredTransform tk = make_transform(cache, h8, 8, "hadamard", true);
  ASSERT_EQ(tq.transform->kernel(), TransformKernel::Dense);
  ASSERT_EQ(tk.transform->kernel(), TransformKernel::Fwht);
  std::vector<double> ek(h8.size());
  for (size_t i = 0; i < h8.size(); ++i) ek[i] = h8[i] / std::sqrt(8.0);  // symmetric: the inverse flag changes nothing

  std::vector<std::vector<float>> w, bias;
  for (size_t s = 0; s < n.size(); ++s) {
    w.push_back(to_float(random_values(static_cast<size_t>(n[s] * kK), 100 + static_cast<uint32_t>(s), 0.2)));
    bias.push_back(to_float(random_values(static_cast<size_t>(n[s]), 200 + static_cast<uint32_t>(s))));
  }
  const std::vector<float> x = to_float(random_values(static_cast<size_t>(kM * kK), 7));

  // Reference: per shard (x·Wᵀ + b) then its rotation, concatenated.
  const int64_t total = n[0] + n[1] + n[2];
  std::vector<double> want(static_cast<size_t>(kM * total));
  int64_t offset = 0;
  for (size_t s = 0; s < n.size(); ++s) {
    for (int64_t r = 0; r < kM; ++r) {
      for (int64_t o = 0; o < n[s]; ++o) {
        double acc = bias[s][static_cast<size_t>(o)];
        for (int64_t k = 0; k < kK; ++k) acc += static_cast<double>(x[static_cast<size_t>(r * kK + k)]) * w[s][static_cast<size_t>(o * kK + k)];
        want[static_cast<size_t>(r * total + offset + o)] = acc;
      }
    }
    offset += n[s];
  }
  rotate_reference(want, kM, 0, n[0], total, mq, 16);
  rotate_reference(want, kM, n[0], n[1], total, ek, 8);

  auto parts = [&] {
    std::vector<LinearPart> out;
    for (size_t s = 0; s < n.size(); ++s) {
      LinearPart p;
      const core::TensorView b = f32_view(bias[s], {n[s]});
      p.weight = quant::dense_view_weights(f32_view(w[s], {n[s], kK}), "shard", &b);
      if (s == 0) p.output_transforms.push_back({0, n[s], tq.transform});
      if (s == 1) p.output_transforms.push_back({0, n[s], tk.transform});
      out.push_back(std::move(p));
    }
    return out;
  };
  std::vector<LinearPart> one;
  one.push_back(fuse_parts(parts()));
  ASSERT_EQ(one.front().output_transforms.size(), 2u);
  EXPECT_EQ(one.front().output_transforms[1].offset, n[0]);  // k's transform moved to k's slice
  const backends::cpu::CpuLinearGroup fused = backends::cpu::prepare_linear_group(LinearGroup(std::move(one)));
  const backends::cpu::CpuLinearGroup unfused = backends::cpu::prepare_linear_group(LinearGroup(parts()));
  for (const backends::cpu::CpuLinearGroup* g : {&fused, &unfused}) {
    SCOPED_TRACE(g == &fused ? "fused" : "unfused");
    std::vector<float> y(static_cast<size_t>(kM * total), 0.0f), scratch;
    backends::cpu::linear_forward(*g, x.data(), kM, y.data(), scratch);
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(y[i] - want[i]));
      max_ref = std::max(max_ref, std::fabs(want[i]));
    }
    EXPECT_LE(max_diff, 2e-6 * max_ref) << "max|Δ| " << max_diff;
    // v (no transform) is the plain product exactly up to fp32 rounding, and differs from a rotated one.
  }
}

TEST(OutputTransform, SlicesOutsideThePartOrNotAMultipleOfTheBlockAreRejected) {
  TransformCache cache;
  const StoredTransform t = make_transform(cache, sylvester(8), 8, "hadamard", false);
  const std::vector<float> w = to_float(random_values(16 * 8, 3));
  auto part = [&](int64_t offset, int64_t width) {
    LinearPart p;
    p.weight = quant::dense_view_weights(f32_view(w, {16, 8}), "p");
    p.output_transforms.push_back({offset, width, t.transform});
    std::vector<LinearPart> v;
    v.push_back(std::move(p));
    return v;
  };
  EXPECT_NO_THROW(LinearGroup(part(8, 8)));
  EXPECT_THROW(LinearGroup(part(16, 8)), UsageError);
  EXPECT_THROW(LinearGroup(part(0, 12)), UsageError);
  std::vector<float> x(20);
  EXPECT_THROW(backends::cpu::apply_transform_strided(backends::cpu::make_cpu_transform(t.transform), x.data(), 2, 12, 10), UsageError);
}

// --- decoder ------------------------------------------------------------------------------------------------------

// From here on, tests on a synthetic two-layer Llama. A named namespace: other suites of model_test have their own
// kHidden and kLayers (one unity translation unit).
namespace tiny {

constexpr int64_t kHidden = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 16, kInter = 48, kVocab = 40, kLayers = 2;

nlohmann::json tiny_llama() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", kHidden}, {"intermediate_size", kInter},
          {"num_hidden_layers", kLayers}, {"num_attention_heads", kHeads}, {"num_key_value_heads", kKvHeads},
          {"head_dim", kHeadDim}, {"vocab_size", kVocab}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
          {"max_position_embeddings", 64}, {"attention_bias", true}, {"tie_word_embeddings", false}};
}

// Random fp32 weights of tiny_llama() held in memory; optional online transforms per module / attention layer.
class MemoryWeights final : public WeightSource {
 public:
  explicit MemoryWeights(uint32_t seed) {
    uint32_t s = seed;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, double scale, double offset = 0.0) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      std::vector<double> v = random_values(static_cast<size_t>(numel), s++, scale);
      for (double& x : v) x += offset;
      tensors_[name] = {to_float(v), std::move(shape)};
    };
    add("model.embed_tokens.weight", {kVocab, kHidden}, 1.0);
    add("model.norm.weight", {kHidden}, 0.1, 1.0);
    add("lm_head.weight", {kVocab, kHidden}, 0.2);
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      add(p + ".input_layernorm.weight", {kHidden}, 0.1, 1.0);
      add(p + ".post_attention_layernorm.weight", {kHidden}, 0.1, 1.0);
      for (const auto& [m, out, in, bias] : std::vector<std::tuple<std::string, int64_t, int64_t, bool>>{
               {".self_attn.q_proj", kHeads * kHeadDim, kHidden, true}, {".self_attn.k_proj", kKvHeads * kHeadDim, kHidden, true},
               {".self_attn.v_proj", kKvHeads * kHeadDim, kHidden, true}, {".self_attn.o_proj", kHidden, kHeads * kHeadDim, true},
               {".mlp.gate_proj", kInter, kHidden, false}, {".mlp.up_proj", kInter, kHidden, false},
               {".mlp.down_proj", kHidden, kInter, false}}) {
        add(p + m + ".weight", {out, in}, 1.0 / std::sqrt(static_cast<double>(in)));
        if (bias) add(p + m + ".bias", {out}, 0.3);
      }
    }
  }

  bool fuse = true;
  std::map<std::string, std::shared_ptr<const OnlineTransform>> output_transforms;  // by module
  AttentionTransforms attention;                                                  // every layer

  std::vector<float>& data(const std::string& name) { return tensors_.at(name).first; }

  core::TensorView tensor(const std::string& name) const override {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw FormatError("no tensor " + name);
    return f32_view(it->second.first, it->second.second);
  }
  bool has_tensor(const std::string& name) const override { return tensors_.contains(name); }
  LinearGroup linear_group(const std::vector<std::string>& modules) const override {
    std::vector<LinearPart> parts;
    for (const std::string& m : modules) {
      LinearPart p;
      const core::TensorView bias = has_tensor(m + ".bias") ? tensor(m + ".bias") : core::TensorView{};
      p.weight = quant::dense_view_weights(tensor(m + ".weight"), m, has_tensor(m + ".bias") ? &bias : nullptr);
      if (const auto it = output_transforms.find(m); it != output_transforms.end()) {
        p.output_transforms.push_back({0, p.weight.out_features(), it->second});
      }
      parts.push_back(std::move(p));
    }
    if (fuse && parts.size() > 1) {
      std::vector<LinearPart> one;
      one.push_back(fuse_parts(std::move(parts)));
      return LinearGroup(std::move(one), modules);
    }
    return LinearGroup(std::move(parts), modules);
  }
  std::vector<checkpoint::ModuleInfo> modules(int64_t, checkpoint::ModuleRole) const override { return {}; }
  LinearGroup fused_expert(const std::string& module, int64_t, bool) const override {
    throw UsageError("no experts in " + module);
  }
  AttentionTransforms attention_transforms(int64_t) const override { return attention; }

 private:
  std::map<std::string, std::pair<std::vector<float>, std::vector<int64_t>>> tensors_;
};

struct ForwardRun {
  std::vector<float> logits;               // prompt (all rows) then each decode step
  std::vector<std::vector<float>> keys;    // per layer: [kv_heads, positions, head_dim]
};

ForwardRun run(const MemoryWeights& weights, const std::vector<int32_t>& prompt, const std::vector<int32_t>& decode) {
  const Decoder decoder(parse_model_config(tiny_llama()), weights, backends::make_cpu_backend());
  KvCache cache = decoder.make_cache(32, 1);
  const int slot = cache.acquire();
  ForwardRun out;
  SequenceChunk chunk{slot, 0, prompt, true};
  out.logits = decoder.forward(std::span(&chunk, 1), cache);
  int64_t pos = static_cast<int64_t>(prompt.size());
  for (const int32_t& t : decode) {
    SequenceChunk next{slot, pos++, std::span(&t, 1), false};
    const std::vector<float> l = decoder.forward(std::span(&next, 1), cache);
    out.logits.insert(out.logits.end(), l.begin(), l.end());
  }
  for (int64_t l = 0; l < kLayers; ++l) {
    std::vector<float> keys;  // [kv_head][position][head_dim]
    for (int64_t h = 0; h < cache.num_kv_heads(); ++h) {
      for (int64_t p = 0; p < pos; ++p) {
        const float* row = backends::cpu::host_key(cache, slot, l, h, p);
        keys.insert(keys.end(), row, row + cache.head_dim());
      }
    }
    out.keys.push_back(std::move(keys));
  }
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

const std::vector<int32_t> kPrompt{3, 17, 5, 29, 11, 38, 2};
const std::vector<int32_t> kDecode{13, 31};

struct AttentionCase {
  std::string name;
  std::vector<double> q_stored;  // what the checkpoint stores
  std::vector<double> k_stored;
  std::string type;
  bool k_inverse;
  int64_t block;
  std::vector<double> k_effective;  // M̂_k in float64, as the test derives it
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> out;
  // SpinQuant R3: one Sylvester Hadamard b8 (half of head_dim 16) on q and k, orthonormal after ÷√8: FWHT.
  std::vector<double> h = sylvester(8), hn(h.size());
  for (size_t i = 0; i < h.size(); ++i) hn[i] = h[i] / std::sqrt(8.0);
  out.push_back({"hadamard_b8", h, h, "hadamard", false, 8, hn});
  // random-matrix (unscaled, dense path): q ← q·M, k ← k·(M⁻¹)ᵀ stored as M⁻¹ with inverse = true, so that
  // (qM)(kM⁻ᵀ)ᵀ = q·kᵀ although M is not orthogonal.
  const std::vector<double> m = random_matrix(8, 5);
  const std::vector<double> minv = inverse(m, 8);
  std::vector<double> minv_t(minv.size());
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = 0; j < 8; ++j) minv_t[static_cast<size_t>(i * 8 + j)] = minv[static_cast<size_t>(j * 8 + i)];
  }
  out.push_back({"random_matrix_b8", m, minv, "random-matrix", true, 8, minv_t});
  // A full-head (b = head_dim) random matrix.
  const std::vector<double> m16 = random_matrix(16, 9);
  const std::vector<double> m16inv = inverse(m16, 16);
  std::vector<double> m16inv_t(m16inv.size());
  for (int64_t i = 0; i < 16; ++i) {
    for (int64_t j = 0; j < 16; ++j) m16inv_t[static_cast<size_t>(i * 16 + j)] = m16inv[static_cast<size_t>(j * 16 + i)];
  }
  out.push_back({"random_matrix_b16", m16, m16inv, "random-matrix", true, 16, m16inv_t});
  return out;
}

class AttentionTransformTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionTransformTest, KvCacheHoldsRotatedKeysAndTheScoresAreUnchanged) {
  const AttentionCase& c = GetParam();
  const MemoryWeights plain(42);
  MemoryWeights rotated(42);
  TransformCache cache;
  const StoredTransform tq = make_transform(cache, c.q_stored, c.block, c.type, false);
  const StoredTransform tk = make_transform(cache, c.k_stored, c.block, c.type, c.k_inverse);
  rotated.attention.query.push_back(tq.transform);
  rotated.attention.key.push_back(tk.transform);

  const ForwardRun a = run(plain, kPrompt, kDecode);
  const ForwardRun b = run(rotated, kPrompt, kDecode);
  EXPECT_LE(max_rel_diff(b.logits, a.logits), 2e-5);
  for (int64_t l = 0; l < kLayers; ++l) {
    SCOPED_TRACE(l);
    std::vector<double> want(a.keys[static_cast<size_t>(l)].begin(), a.keys[static_cast<size_t>(l)].end());
    const auto positions = static_cast<int64_t>(want.size()) / (kKvHeads * kHeadDim);
    rotate_reference(want, positions, 0, kKvHeads * kHeadDim, kKvHeads * kHeadDim, c.k_effective, c.block);
    const std::vector<float> got = b.keys[static_cast<size_t>(l)];
    double diff = 0.0, ref = 0.0, moved = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff = std::max(diff, std::fabs(got[i] - want[i]));
      ref = std::max(ref, std::fabs(want[i]));
      moved = std::max(moved, std::fabs(static_cast<double>(got[i]) - a.keys[static_cast<size_t>(l)][i]));
    }
    EXPECT_LE(diff, 1e-5 * ref) << "cache keys vs plain keys · M̂_k";
    EXPECT_GT(moved, 0.1 * ref) << "the cache must hold rotated, not plain, keys";
  }
}

TEST_P(AttentionTransformTest, QueryTransformAloneChangesTheLogits) {
  // A guard that the query hook is live: without its key counterpart the scores change.
  const AttentionCase& c = GetParam();
  const MemoryWeights plain(42);
  MemoryWeights rotated(42);
  TransformCache cache;
  const StoredTransform tq = make_transform(cache, c.q_stored, c.block, c.type, false);
  rotated.attention.query.push_back(tq.transform);
  EXPECT_GT(max_rel_diff(run(rotated, kPrompt, {}).logits, run(plain, kPrompt, {}).logits), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Blocks, AttentionTransformTest, ::testing::ValuesIn(attention_cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& p) { return p.param.name; });

TEST(AttentionTransform, BlockNotDividingHeadDimIsRejectedAtLoad) {
  MemoryWeights w(1);
  TransformCache cache;
  const StoredTransform t = make_transform(cache, random_matrix(12, 2), 12, "random-matrix", false);
  w.attention.key.push_back(t.transform);
  EXPECT_THROW(Decoder(parse_model_config(tiny_llama()), w, backends::make_cpu_backend()), FormatError);
}

// QuIP-style `output` on v_proj per head (randomized Hadamard b16 = head_dim, the permuted Sylvester runs as the
// structured kernel), compensated offline in
// o_proj: o_proj's input is attn·D with D = blockdiag(M̂), so W_o' = W_o·D⁻ᵀ = W_o·D (M̂ orthonormal) gives the
// plain model's logits; the v bias is rotated with the output, as the forward hook does.
TEST(OutputTransform, RotatedValuesCompensatedInOProjGiveThePlainLogitsFusedAndUnfused) {
  const std::vector<int64_t> perm{3, 0, 9, 14, 1, 7, 12, 5, 8, 2, 15, 10, 4, 11, 6, 13};
  const std::vector<double> h = sylvester(16);
  std::vector<double> e(h.size());  // H[perm][:, perm] / 4
  for (int64_t i = 0; i < 16; ++i) {
    for (int64_t j = 0; j < 16; ++j) {
      e[static_cast<size_t>(i * 16 + j)] = h[static_cast<size_t>(perm[static_cast<size_t>(i)] * 16 + perm[static_cast<size_t>(j)])] / 4.0;
    }
  }
  TransformCache cache;
  const StoredTransform t = make_transform(cache, h, 16, "random-hadamard", false, perm);
  ASSERT_EQ(t.transform->kernel(), TransformKernel::KroneckerHadamard);
  const MemoryWeights plain(7);
  const ForwardRun want = run(plain, kPrompt, kDecode);
  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "fused qkv" : "unfused");
    MemoryWeights rotated(7);
    rotated.fuse = fuse;
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      rotated.output_transforms[p + "v_proj"] = t.transform;
      std::vector<float>& wo = rotated.data(p + "o_proj.weight");  // [hidden, heads · head_dim]
      std::vector<double> w(wo.begin(), wo.end());
      rotate_reference(w, kHidden, 0, kHeads * kHeadDim, kHeads * kHeadDim, e, 16);
      wo = to_float(w);
    }
    const ForwardRun got = run(rotated, kPrompt, kDecode);
    EXPECT_LE(max_rel_diff(got.logits, want.logits), 2e-5);
    // Without the compensation the values are rotated and the logits move: the hook is live.
    MemoryWeights uncompensated(7);
    uncompensated.fuse = fuse;
    uncompensated.output_transforms["model.layers.0.self_attn.v_proj"] = t.transform;
    EXPECT_GT(max_rel_diff(run(uncompensated, kPrompt, {}).logits, run(plain, kPrompt, {}).logits), 1e-3);
  }
}

}  // namespace tiny
}  // namespace
}  // namespace fp4serve::model
