// SPDX-License-Identifier: Apache-2.0
// The CLI's input checks: -m resolution (folders, files, the Hugging Face hub cache), the context limit, and the
// "did you mean" matcher. Expected values are written out here, from the hub cache layout huggingface_hub
// documents (models--ORG--NAME/{refs/main, snapshots/<commit>/}) and vLLM's derived max_model_len rule.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "app/model_options.h"
#include "app/suggest.h"
#include "fp4serve/error.h"
#include "model/model_config.h"

namespace fp4serve::app {
namespace {
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/fp4serve-model-options-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string error_of(const std::string& arg, bool allow_file = false) {
  try {
    (void)resolve_model_path(arg, allow_file);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ResolveModelPath, CheckpointFolderAndItsFiles) {
  TempDir t;
  const fs::path m = t.path() / "model";
  write(m / "config.json", "{}");
  write(m / "model.safetensors", "x");
  EXPECT_EQ(resolve_model_path(m.string()), m);
  EXPECT_EQ(resolve_model_path((m / "model.safetensors").string(), /*allow_file=*/true), m / "model.safetensors");
  EXPECT_NE(error_of((m / "model.safetensors").string()).find("needs the checkpoint folder"), std::string::npos);
  EXPECT_NE(error_of((m / "config.json").string()).find("this is a config.json file; pass the folder"), std::string::npos);
}

TEST(ResolveModelPath, GgufByMagicWhateverTheName) {
  TempDir t;
  write(t.path() / "weights.bin", std::string("GGUF\x03\x00\x00\x00", 8));
  EXPECT_NE(error_of((t.path() / "weights.bin").string(), true).find("this is a GGUF file"), std::string::npos);
  // A folder of GGUF files says what it holds.
  write(t.path() / "g" / "m.Q4_1.gguf", "GGUF");
  const std::string e = error_of((t.path() / "g").string());
  EXPECT_NE(e.find("no model.safetensors or model.safetensors.index.json"), std::string::npos) << e;
  EXPECT_NE(e.find("m.Q4_1.gguf"), std::string::npos) << e;
}

TEST(ResolveModelPath, FolderWithoutConfigOrSafetensors) {
  TempDir t;
  write(t.path() / "a" / "model.safetensors", "x");
  EXPECT_NE(error_of((t.path() / "a").string()).find("no config.json in this folder"), std::string::npos);
  write(t.path() / "b" / "config.json", "{}");
  EXPECT_NE(error_of((t.path() / "b").string()).find("no model.safetensors"), std::string::npos);
}

TEST(ResolveModelPath, HubCacheRefsMainThenTheOnlySnapshot) {
  TempDir t;
  const fs::path repo = t.path() / "hub" / "models--Org--Name";
  for (const char* rev : {"1111", "2222"}) {
    write(repo / "snapshots" / rev / "config.json", "{}");
    write(repo / "snapshots" / rev / "model.safetensors", "x");
  }
  setenv("HF_HUB_CACHE", (t.path() / "hub").c_str(), 1);
  // Two snapshots and no refs/main: ambiguous.
  EXPECT_NE(error_of("Org/Name").find("2 snapshots and no refs/main"), std::string::npos) << error_of("Org/Name");
  write(repo / "refs" / "main", "2222\n");
  EXPECT_EQ(resolve_model_path("Org/Name"), repo / "snapshots" / "2222");
  fs::remove_all(repo / "refs");
  fs::remove_all(repo / "snapshots" / "2222");
  EXPECT_EQ(resolve_model_path("Org/Name"), repo / "snapshots" / "1111");
  // HF_HOME/hub when HF_HUB_CACHE is unset.
  unsetenv("HF_HUB_CACHE");
  setenv("HF_HOME", t.path().c_str(), 1);
  EXPECT_EQ(resolve_model_path("Org/Name"), repo / "snapshots" / "1111");
  const std::string e = error_of("Org/Other");
  EXPECT_NE(e.find("looked in " + (t.path() / "hub" / "models--Org--Other").string()), std::string::npos) << e;
  EXPECT_NE(e.find("`huggingface-cli download Org/Other`"), std::string::npos) << e;
  unsetenv("HF_HOME");
  // Not ORG/NAME: a plain missing path.
  EXPECT_EQ(error_of("/no/such/dir"), "/no/such/dir: no such file or folder");
}

model::ModelConfig config_with(int64_t max_pos, model::RopeScaling::Kind kind = model::RopeScaling::Kind::None,
                               double factor = 1, double original = 0) {
  model::ModelConfig c;
  c.max_position_embeddings = max_pos;
  c.rope_scaling.kind = kind;
  c.rope_scaling.factor = factor;
  c.rope_scaling.original_max_position_embeddings = original;
  return c;
}

TEST(ContextLimit, MaxPositionEmbeddingsIsDefaultAndMaximum) {
  const auto c = config_with(512);
  ModelOptions o;
  EXPECT_EQ(effective_max_model_len(o, c), 512);
  o.max_model_len = 100;
  EXPECT_EQ(effective_max_model_len(o, c), 100);
  o.max_model_len = 513;
  try {
    (void)effective_max_model_len(o, c);
    ADD_FAILURE() << "513 accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--max-model-len 513 is above this model's maximum context length of 512 tokens "
                           "(max_position_embeddings 512)");
  }
}

TEST(ContextLimit, RopeScalingFactorIsNamedNotApplied) {
  using Kind = model::RopeScaling::Kind;
  // yarn: vLLM derives original × factor = 4096 × 4 = 16384; the RoPE table here stops at max_position_embeddings.
  const ContextLimit yarn = context_limit(config_with(4096, Kind::Yarn, 4, 4096));
  EXPECT_EQ(yarn.tokens, 4096);
  EXPECT_NE(yarn.source.find("would reach 16384 positions"), std::string::npos) << yarn.source;
  // linear: max_position_embeddings × factor = 2048 × 2.
  EXPECT_NE(context_limit(config_with(2048, Kind::Linear, 2)).source.find("would reach 4096"), std::string::npos);
  // llama3 configs already state the extended length: no note.
  EXPECT_EQ(context_limit(config_with(131072, Kind::Llama3, 8, 8192)).source, "max_position_embeddings 131072");
}

TEST(RequireRunnableDevice, DryRunNamesAreRefused) {
  EXPECT_NO_THROW(require_runnable_device("cpu"));
  EXPECT_NO_THROW(require_runnable_device("cuda"));
  EXPECT_THROW(require_runnable_device("sm90"), UsageError);
  EXPECT_THROW(require_runnable_device("sm100"), UsageError);
}

TEST(ClosestMatch, TyposTranspositionsAndPrefixes) {
  const std::vector<std::string> cmds{"inspect", "explain", "quantize", "generate", "chat", "perplexity", "serve", "bench"};
  EXPECT_EQ(closest_match("genrate", cmds), "generate");    // one deletion
  EXPECT_EQ(closest_match("gneerate", cmds), "generate");   // one transposition
  EXPECT_EQ(closest_match("quantise", cmds), "quantize");   // one substitution
  EXPECT_EQ(closest_match("perp", cmds), "perplexity");     // unique prefix
  EXPECT_EQ(closest_match("xyz", cmds), std::nullopt);
  EXPECT_EQ(closest_match("--max-token", {"--max-tokens", "--temperature"}), "--max-tokens");
}

}  // namespace
}  // namespace fp4serve::app
