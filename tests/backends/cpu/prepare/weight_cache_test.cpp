// SPDX-License-Identifier: Apache-2.0
// The weight cache (prepare/weight_cache.h): every layout comes back from the file with every field and byte, and
// dequantizes to the float64 reference of its checkpoint tensors; a file of another key, a damaged file or one
// whose index lies about its buffers is ignored (never trusted, never a crash) and rewritten; a rewrite keeps the
// layers the load took from the old file; no space and an unwritable folder leave no file and let the load go on.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/prepare/repack.h"
#include "backends/cpu/prepare/weight_cache.h"
#include "quant/checkpoint_tensors.h"

namespace fp4serve::prepare::weight_cache_test {
namespace {

namespace fs = std::filesystem;
using testing::Layer;

constexpr const char* kName = "model.layers.1.self_attn.o_proj";

// A folder of its own per test, removed at the end.
class WeightCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("fp4serve-weight-cache-{}-{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    file_ = dir_ / "model.fp4w";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_, file_;
};

std::vector<float> dequant(const PreparedLinear& w) {
  std::vector<float> out(static_cast<size_t>(w.out_features * w.in_features), std::numeric_limits<float>::quiet_NaN());
  kernels::dequantize(w, out.data());
  return out;
}

// One layer of every layout, odd shapes, with the optional fields set (bias, input global scale, k_perm, offsets).
struct Case {
  std::string fingerprint;
  Layer layer;  // the checkpoint tensors and their float64 weights
  PreparedLinear prepared;
  bool exact = true;  // NVFP4 · global scale rounds in fp32: compared with the fresh copy only
};

std::vector<Case> every_layout() {
  std::mt19937 rng(41);
  std::vector<Case> cases;
  const auto add = [&](std::string name, Layer l, PreparedLinear w, bool exact) {
    w.bias.resize(static_cast<size_t>(w.out_features));
    for (size_t i = 0; i < w.bias.size(); ++i) w.bias[i] = 0.125f * static_cast<float>(i % 7) - 0.3f;
    cases.push_back({std::move(name), std::move(l), std::move(w), exact});
  };
  {
    Layer l = testing::make_nvfp4(rng, 37, 160, /*divisor=*/true);
    PreparedLinear w = prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale, GlobalScaleConvention::Divisor, kName);
    w.input_global_scale = 1234.5f;
    add("nvfp4", std::move(l), std::move(w), false);
  }
  {
    Layer l = testing::make_mxfp4(rng, 19, 96);
    PreparedLinear w = prepare_mxfp4(l.weight.view(), l.scale.view(), kName);
    add("mxfp4", std::move(l), std::move(w), true);
  }
  {
    Layer l = testing::make_int4(rng, 21, 96, 32, /*asym=*/true, /*actorder=*/true);
    const core::TensorView zp = l.zero_point.view(), gi = l.g_idx.view();
    PreparedLinear w = prepare_int4(l.weight.view(), l.scale.view(), &zp, &gi, 96, 32, kName);
    EXPECT_FALSE(w.k_perm.empty());
    add("int4", std::move(l), std::move(w), true);
  }
  {
    Layer l = testing::make_fp8(rng, 23, 48, /*kind=*/2, 8, 16);
    PreparedLinear w = prepare_fp8(l.weight.view(), l.scale.view(), {8, 16}, kName);
    add("fp8", std::move(l), std::move(w), true);
  }
  {
    Layer l = testing::make_dense(rng, 11, 40, core::DType::BF16);
    PreparedLinear w = prepare_dense(l.weight.view(), kName);
    add("dense-bf16", std::move(l), std::move(w), true);
  }
  {
    Layer l = testing::make_dense(rng, 9, 24, core::DType::F32);
    PreparedLinear w = prepare_dense(l.weight.view(), kName);
    add("dense-f32", std::move(l), std::move(w), true);
  }
  {
    Layer l = testing::make_dense(rng, 13, 40, core::DType::BF16);
    PreparedLinear w = prepare_dense_as_int8_rows(l.weight.view(), kName);
    add("int8-rows", std::move(l), std::move(w), false);  // requantized: not the checkpoint's values
  }
  return cases;
}

void expect_same_layer(const PreparedLinear& got, const PreparedLinear& want) {
  EXPECT_EQ(got.layout, want.layout);
  EXPECT_EQ(got.block_format, want.block_format);
  EXPECT_EQ(got.out_features, want.out_features);
  EXPECT_EQ(got.in_features, want.in_features);
  EXPECT_EQ(got.padded_rows, want.padded_rows);
  EXPECT_EQ(got.group_size, want.group_size);
  EXPECT_EQ(got.bias, want.bias);
  EXPECT_EQ(std::memcmp(&got.input_global_scale, &want.input_global_scale, sizeof(float)), 0);
  EXPECT_EQ(got.global_scale, want.global_scale);
  EXPECT_EQ(got.convention, want.convention);
  EXPECT_EQ(got.k_perm, want.k_perm);
  EXPECT_EQ(got.dense_storage, want.dense_storage);
  for (auto [a, b] : {std::pair{&got.codes, &want.codes}, {&got.scales, &want.scales}, {&got.offsets, &want.offsets}}) {
    ASSERT_EQ(a->size(), b->size());
    if (a->size() == 0) continue;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 64, 0u);
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size()), 0);
  }
}

void write_cache(const fs::path& file, const std::string& key, const std::vector<Case>& cases) {
  WeightCache cache(file, key, 0);
  for (const Case& c : cases) {
    EXPECT_FALSE(cache.find(c.fingerprint));
    cache.store(c.fingerprint, c.prepared);
  }
  const WeightCacheReport r = cache.finish();
  ASSERT_TRUE(r.written) << r.not_written;
  EXPECT_EQ(r.not_used, "no file yet");
  EXPECT_EQ(r.layers_prepared, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(r.bytes_written, fs::file_size(file));
}

// The index of a cache file, and a way to write it back with a consistent header (an independent FNV-1a).
nlohmann::json read_index(const fs::path& file, uint64_t& index_offset) {
  std::ifstream in(file, std::ios::binary);
  char header[32];
  in.read(header, 32);
  uint64_t index_bytes = 0;
  std::memcpy(&index_offset, header + 8, 8);
  std::memcpy(&index_bytes, header + 16, 8);
  std::string text(index_bytes, '\0');
  in.seekg(static_cast<std::streamoff>(index_offset));
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  return nlohmann::json::parse(text);
}
void write_index(const fs::path& file, uint64_t index_offset, const nlohmann::json& index) {
  const std::string text = index.dump();
  uint64_t h = 14695981039346656037ULL;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  fs::resize_file(file, index_offset);
  std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
  io.seekp(static_cast<std::streamoff>(index_offset));
  io.write(text.data(), static_cast<std::streamsize>(text.size()));
  const uint64_t bytes = text.size();
  io.seekp(16);
  io.write(reinterpret_cast<const char*>(&bytes), 8);
  io.write(reinterpret_cast<const char*>(&h), 8);
}

TEST_F(WeightCacheTest, EveryLayoutComesBackWhole) {
  const std::vector<Case> cases = every_layout();
  write_cache(file_, "key 1\nline 2", cases);
  WeightCache cache(file_, "key 1\nline 2", 0);
  EXPECT_EQ(cache.report().not_used, "");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fingerprint);
    const std::optional<PreparedLinear> got = cache.find(c.fingerprint);
    ASSERT_TRUE(got);
    expect_same_layer(*got, c.prepared);
    const std::vector<float> values = dequant(*got);
    if (c.exact) {
      ASSERT_EQ(values.size(), c.layer.w.size());
      for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(static_cast<double>(values[i]), c.layer.w[i]) << "element " << i;
    } else {
      EXPECT_EQ(values, dequant(c.prepared));
    }
    EXPECT_FALSE(cache.find(c.fingerprint)) << "a layer is handed out once";
  }
  const WeightCacheReport r = cache.finish();
  EXPECT_FALSE(r.written);
  EXPECT_EQ(r.layers_mapped, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(r.layers_prepared, 0);
}

// The views keep the mapping alive after the cache object is gone (the model outlives its load).
TEST_F(WeightCacheTest, LayersOutliveTheCache) {
  const std::vector<Case> cases = every_layout();
  write_cache(file_, "k", cases);
  std::optional<PreparedLinear> got;
  {
    WeightCache cache(file_, "k", 0);
    got = cache.find(cases[1].fingerprint);
    cache.finish();
  }
  fs::remove(file_);  // the mapping stays valid without the name
  ASSERT_TRUE(got);
  expect_same_layer(*got, cases[1].prepared);
}

TEST_F(WeightCacheTest, AnotherKeyIsNotUsedAndSaysWhatChanged) {
  const std::vector<Case> cases = every_layout();
  write_cache(file_, "executable: 1 bytes\nfile model.safetensors: 10 bytes", cases);
  WeightCache cache(file_, "executable: 1 bytes\nfile model.safetensors: 12 bytes", 0);
  EXPECT_NE(cache.report().not_used.find("'file model.safetensors: 10 bytes' is now 'file model.safetensors: 12 bytes'"),
            std::string::npos)
      << cache.report().not_used;
  EXPECT_FALSE(cache.find(cases[0].fingerprint));
  // Storing then rewrites the file for the new key.
  for (const Case& c : cases) cache.store(c.fingerprint, c.prepared);
  ASSERT_TRUE(cache.finish().written);
  WeightCache again(file_, "executable: 1 bytes\nfile model.safetensors: 12 bytes", 0);
  EXPECT_TRUE(again.find(cases[0].fingerprint));
}

TEST_F(WeightCacheTest, DamagedFilesAreIgnored) {
  const std::vector<Case> cases = every_layout();
  write_cache(file_, "k", cases);
  const auto size = fs::file_size(file_);
  const auto expect_ignored = [&](const std::string& why) {
    WeightCache cache(file_, "k", 0);
    EXPECT_NE(cache.report().not_used.find(why), std::string::npos) << cache.report().not_used;
    for (const Case& c : cases) EXPECT_FALSE(cache.find(c.fingerprint));
  };
  const fs::path good = dir_ / "good.fp4w";
  fs::copy_file(file_, good);
  fs::resize_file(file_, size - 5);  // truncated
  expect_ignored("truncated or malformed");
  fs::copy_file(good, file_, fs::copy_options::overwrite_existing);
  {
    std::fstream io(file_, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(size - 3));
    io.put('#');  // a byte of the index
  }
  expect_ignored("checksum");
  fs::copy_file(good, file_, fs::copy_options::overwrite_existing);
  {
    std::fstream io(file_, std::ios::binary | std::ios::in | std::ios::out);
    io.put('X');  // the magic
  }
  expect_ignored("header");
  fs::resize_file(file_, 0);
  expect_ignored("header");
}

// An index with a valid checksum that lies (a buffer past the data, sizes that do not match the layout, an
// out-of-range enum, a permutation outside K) is refused as a whole or for that layer: never read out of bounds.
TEST_F(WeightCacheTest, AnIndexThatLiesIsNotTrusted) {
  const std::vector<Case> cases = every_layout();
  write_cache(file_, "k", cases);
  const fs::path good = dir_ / "good.fp4w";
  fs::copy_file(file_, good);
  uint64_t index_offset = 0;
  const nlohmann::json index = read_index(file_, index_offset);
  const auto with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& why) {
    fs::copy_file(good, file_, fs::copy_options::overwrite_existing);
    nlohmann::json changed = index;
    edit(changed);
    write_index(file_, index_offset, changed);
    WeightCache cache(file_, "k", 0);
    EXPECT_NE(cache.report().not_used.find(why), std::string::npos) << cache.report().not_used;
    EXPECT_FALSE(cache.find(cases[0].fingerprint));
  };
  with([&](nlohmann::json& j) { j["layers"][0]["codes"][0] = index_offset; }, "lies outside the data");
  with([](nlohmann::json& j) { j["layers"][0]["codes"][1] = 64; }, "do not match its layout");
  with([](nlohmann::json& j) { j["layers"][0]["out_features"] = 1 << 20; }, "do not make a layout");
  with([](nlohmann::json& j) { j["layers"][0]["layout"] = 9; }, "layout 9 is out of range 0 … 4");
  with([](nlohmann::json& j) { j["layers"][0]["group_size"] = 8; }, "do not make a layout");
  with([](nlohmann::json& j) { j["layers"][0]["bias"][1] = 4; }, "do not match its shape");
  with([](nlohmann::json& j) { j["layers"][0].erase("scales"); }, "malformed");
  // A permutation entry outside [0, K): that layer alone is refused.
  fs::copy_file(good, file_, fs::copy_options::overwrite_existing);
  for (const nlohmann::json& layer : index["layers"]) {
    if (layer["k_perm"][1].get<uint64_t>() == 0) continue;
    const int32_t bad = 1 << 20;
    std::fstream io(file_, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(layer["k_perm"][0].get<uint64_t>()));
    io.write(reinterpret_cast<const char*>(&bad), sizeof bad);
    io.close();
    WeightCache cache(file_, "k", 0);
    EXPECT_FALSE(cache.find(layer["fingerprint"].get<std::string>()));
    EXPECT_TRUE(cache.find(cases[0].fingerprint));
  }
}

// An entry whose N (or K, layout, format) differs from the layer that asks for it is never handed out, even when
// its buffers are consistent with what it claims: the kernels would size x and y by it.
TEST_F(WeightCacheTest, ALayerThatDoesNotFitItsWeightsIsNotHandedOut) {
  std::mt19937 rng(44);
  const Layer l = testing::make_nvfp4(rng, 37, 160, /*divisor=*/true);
  const quant::LinearWeights weights = quant::fp4_view_weights(quant::BlockFormat::Nvfp4, l.weight.view(), l.scale.view(),
                                                               l.global_scale, GlobalScaleConvention::Divisor, kName);
  const PreparedLinear w = prepare_linear(weights);
  {
    WeightCache cache(file_, "k", 0);
    cache.store(weights, w);
    ASSERT_TRUE(cache.finish().written);
  }
  {
    WeightCache cache(file_, "k", 0);
    const std::optional<PreparedLinear> got = cache.find(weights);
    ASSERT_TRUE(got);
    expect_same_layer(*got, w);
  }
  uint64_t index_offset = 0;
  nlohmann::json index = read_index(file_, index_offset);
  index["layers"][0]["out_features"] = 38;  // still 48 padded rows: the buffers match the claim
  write_index(file_, index_offset, index);
  WeightCache cache(file_, "k", 0);
  EXPECT_EQ(cache.report().not_used, "");
  EXPECT_FALSE(cache.find(weights));
}

// A write that fails half-way (here: the file size limit, EFBIG) abandons the new file: no temporary, no file, and
// the load goes on.
TEST_F(WeightCacheTest, AFailedWriteLeavesNothing) {
  const std::vector<Case> cases = every_layout();
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  WeightCacheReport r;
  {
    WeightCache cache(file_, "k", 0);
    for (const Case& c : cases) cache.store(c.fingerprint, c.prepared);
    r = cache.finish();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(r.written);
  EXPECT_NE(r.not_written.find("writing"), std::string::npos) << r.not_written;
  EXPECT_EQ(r.layers_prepared, static_cast<int64_t>(cases.size()));
  EXPECT_TRUE(fs::is_empty(dir_)) << "no temporary left behind";
}

// A layer missing from the file starts a rewrite that keeps the layers already taken from the old file, and the
// later ones, found or prepared; layers the load never asked for are dropped.
TEST_F(WeightCacheTest, ARewriteKeepsWhatTheLoadUses) {
  std::vector<Case> cases = every_layout();
  const std::vector<Case> first(std::make_move_iterator(cases.begin()), std::make_move_iterator(cases.begin() + 3));
  write_cache(file_, "k", first);
  cases = every_layout();
  {
    WeightCache cache(file_, "k", 0);
    ASSERT_TRUE(cache.find(cases[0].fingerprint));  // from the file
    ASSERT_FALSE(cache.find(cases[4].fingerprint));
    cache.store(cases[4].fingerprint, cases[4].prepared);  // starts the rewrite
    ASSERT_TRUE(cache.find(cases[1].fingerprint));  // from the old file, appended
    const WeightCacheReport r = cache.finish();
    ASSERT_TRUE(r.written) << r.not_written;
    EXPECT_EQ(r.layers_mapped, 2);
    EXPECT_EQ(r.layers_prepared, 1);
  }
  WeightCache cache(file_, "k", 0);
  for (const int i : {0, 4, 1}) {
    const std::optional<PreparedLinear> got = cache.find(cases[static_cast<size_t>(i)].fingerprint);
    ASSERT_TRUE(got) << cases[static_cast<size_t>(i)].fingerprint;
    expect_same_layer(*got, cases[static_cast<size_t>(i)].prepared);
  }
  EXPECT_FALSE(cache.find(cases[2].fingerprint)) << "never asked for: not kept";
}

TEST_F(WeightCacheTest, NoSpaceOrNoFolderWritesNothing) {
  const std::vector<Case> cases = every_layout();
  {
    WeightCache cache(file_, "k", uint64_t{1} << 60);
    cache.store(cases[0].fingerprint, cases[0].prepared);
    const WeightCacheReport r = cache.finish();
    EXPECT_FALSE(r.written);
    EXPECT_NE(r.not_written.find("free on"), std::string::npos) << r.not_written;
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "no temporary left behind";
  std::ofstream(dir_ / "a-file") << "x";
  WeightCache cache(dir_ / "a-file" / "sub" / "model.fp4w", "k", 0);
  cache.store(cases[0].fingerprint, cases[0].prepared);
  const WeightCacheReport r = cache.finish();
  EXPECT_FALSE(r.written);
  EXPECT_NE(r.not_written.find("cannot create"), std::string::npos) << r.not_written;
}

// An unfinished cache (the load failed) leaves no temporary and keeps the old file.
TEST_F(WeightCacheTest, AnUnfinishedWriteLeavesTheOldFile) {
  const std::vector<Case> cases = every_layout();
  write_cache(file_, "k", cases);
  const auto size = fs::file_size(file_);
  {
    WeightCache cache(file_, "other key", 0);
    cache.store(cases[0].fingerprint, cases[0].prepared);
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(fs::file_size(file_), size);
}

TEST(WeightCacheNames, FingerprintsTellLayersApart) {
  std::mt19937 rng(43);
  const Layer a = testing::make_nvfp4(rng, 16, 32, /*divisor=*/true);
  const Layer b = testing::make_nvfp4(rng, 16, 64, /*divisor=*/true);
  const auto fp = [](const Layer& l, float global_scale, const char* name) {
    return weight_fingerprint(quant::fp4_view_weights(quant::BlockFormat::Nvfp4, l.weight.view(), l.scale.view(),
                                                      global_scale, GlobalScaleConvention::Divisor, name));
  };
  EXPECT_EQ(fp(a, 2.f, "x"), fp(a, 2.f, "x"));
  EXPECT_NE(fp(a, 2.f, "x"), fp(a, 2.f, "y"));      // name
  EXPECT_NE(fp(a, 2.f, "x"), fp(a, 2.5f, "x"));     // global scale
  EXPECT_NE(fp(a, 2.f, "x"), fp(b, 2.f, "x"));      // shape
  const fs::path f = weight_cache_file("/c", "/models/Llama 3B\ntensor_parallel_size 1 rank 0", "Llama 3B/..");
  EXPECT_EQ(f.parent_path(), "/c");
  EXPECT_EQ(f.extension(), ".fp4w");
  EXPECT_EQ(f.filename().string().substr(0, 10), "Llama3B..-");
  EXPECT_NE(f, weight_cache_file("/c", "/models/Llama 3B\ntensor_parallel_size 2 rank 0", "Llama 3B/.."));
}

}  // namespace
}  // namespace fp4serve::prepare::weight_cache_test
