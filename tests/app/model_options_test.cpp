// SPDX-License-Identifier: Apache-2.0
// The CLI's input checks: -m resolution (folders, files, the Hugging Face hub cache), the context limit, and the
// "did you mean" matcher. Expected values are written out here, from the hub cache layout huggingface_hub
// documents (models--ORG--NAME/{refs/main, snapshots/<commit>/}) and vLLM's derived max_model_len rule.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>

#include "app/model_options.h"
#include "app/option_values.h"
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

// Every option value is parsed here, once, into the type the library takes; bad text is a usage error that
// names the flag and the accepted values.
std::string usage_error(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(OptionValues, RunDevicesAndDryRunRefusal) {
  EXPECT_EQ(parse_run_device("cpu"), plan::DeviceChoice::Cpu);
  EXPECT_EQ(parse_run_device("cuda"), plan::DeviceChoice::Cuda);
  EXPECT_EQ(parse_run_device("auto"), plan::DeviceChoice::Auto);
  EXPECT_EQ(usage_error([] { parse_run_device("sm90"); }),
            "--device sm90: a dry-run device: use `explain --device sm90` to see its plan; to run the model use "
            "--device cpu or --device cuda");
  EXPECT_EQ(usage_error([] { parse_run_device("gpu"); }), "--device 'gpu' is not one of auto, cpu, cuda");
}

TEST(OptionValues, PlanDevicesIncludeDryRuns) {
  EXPECT_EQ(parse_plan_device("sm90").sm, 90);
  EXPECT_FALSE(parse_plan_device("sm100").detected);
  EXPECT_EQ(parse_plan_device("sm75").label(), "sm75");  // parses: the plan refuses it with a reason
  EXPECT_EQ(parse_plan_device("cpu").kind, plan::DeviceKind::Cpu);
  for (const char* bad : {"gpu", "sm", "sm9x", "sm9", "sm200", "SM90", ""}) {
    EXPECT_NE(usage_error([bad] { parse_plan_device(bad); }).find("is not one of auto, cpu, cuda, sm80"),
              std::string::npos)
        << bad;
  }
}

TEST(OptionValues, EnumsRoundTripAndRefuseOtherText) {
  EXPECT_EQ(parse_activation_quant("weight-only"), plan::ActivationQuant::WeightOnly);
  EXPECT_EQ(parse_activation_quant("emulate"), plan::ActivationQuant::Emulate);
  EXPECT_EQ(usage_error([] { parse_activation_quant("fp8"); }),
            "--activation-quant 'fp8' is not one of auto, weight-only, emulate");
  EXPECT_EQ(parse_activation_precision("auto"), std::nullopt);
  EXPECT_EQ(parse_activation_precision("int8-decode"), prepare::ActivationPrecision::Int8Decode);
  EXPECT_EQ(parse_activation_precision("bf16"), prepare::ActivationPrecision::Bf16);
  EXPECT_EQ(activation_precision_text(std::nullopt), "auto");
  EXPECT_EQ(activation_precision_text(prepare::ActivationPrecision::Int8), "int8");
  EXPECT_EQ(usage_error([] { parse_activation_precision("int4"); }),
            "--activation-precision 'int4' is not one of auto, fp32, bf16, int8, int8-decode, bf16-decode-int8");
  EXPECT_EQ(parse_activation_precision("bf16-decode-int8"), prepare::ActivationPrecision::Bf16DecodeInt8);
  EXPECT_EQ(parse_lm_head_dtype("fp8"), model::LmHeadDtype::Fp8);
  EXPECT_EQ(parse_lm_head_dtype("int8"), model::LmHeadDtype::Int8);
  EXPECT_EQ(usage_error([] { parse_lm_head_dtype("fp4"); }), "--lm-head-dtype 'fp4' is not one of bf16, fp8, int8");
  EXPECT_EQ(parse_kv_cache_dtype("auto"), std::nullopt);
  EXPECT_EQ(parse_kv_cache_dtype("fp16"), model::KvCacheDtype::F16);
  EXPECT_EQ(kv_cache_dtype_text(model::KvCacheDtype::Bf16), "bf16");
  EXPECT_EQ(usage_error([] { parse_kv_cache_dtype("fp8"); }),
            "--kv-cache-dtype 'fp8' is not one of auto, fp32, bf16, fp16");
  EXPECT_EQ(parse_content_format("auto"), std::nullopt);
  EXPECT_EQ(parse_content_format("openai"), text::ContentFormat::kOpenAI);
  EXPECT_EQ(parse_content_format("string"), text::ContentFormat::kString);
  EXPECT_EQ(usage_error([] { parse_content_format("list"); }),
            "--chat-template-content-format 'list' is not one of auto, string, openai");
  EXPECT_TRUE(parse_batch_invariant("on"));
  EXPECT_FALSE(parse_batch_invariant("off"));
  EXPECT_EQ(usage_error([] { parse_batch_invariant("yes"); }), "--batch-invariant 'yes' is not one of off, on");
}

// The flags land in LoadOptions as typed values when CLI11 parses the command line; a bad value stops the parse.
TEST(OptionValues, ModelOptionsParseIntoLoadOptions) {
  CLI::App app;
  ModelOptions opts;
  add_model_options(app, opts);
  add_tensor_parallel_options(app, opts.load.parallel);
  app.parse("-m some/model --activation-quant emulate --device auto --activation-precision int8 --lm-head-dtype int8 "
            "--kv-cache-dtype fp16 --batch-invariant --tensor-parallel-size 4 --expert-parallel",
            false);
  EXPECT_EQ(opts.load.device, plan::DeviceChoice::Auto);
  EXPECT_EQ(opts.load.activation_quant, plan::ActivationQuant::Emulate);
  EXPECT_EQ(opts.load.activation_precision, prepare::ActivationPrecision::Int8);
  EXPECT_EQ(opts.load.lm_head_dtype, model::LmHeadDtype::Int8);
  EXPECT_EQ(opts.load.kv_cache_dtype, model::KvCacheDtype::F16);
  EXPECT_TRUE(opts.load.batch_invariant);
  EXPECT_EQ(opts.load.parallel.tensor_parallel_size, 4);
  EXPECT_TRUE(opts.load.parallel.expert_parallel);
  ModelOptions defaults;
  CLI::App plain;
  add_model_options(plain, defaults);
  plain.parse("-m x", false);
  EXPECT_EQ(defaults.load.device, plan::DeviceChoice::Cpu);
  EXPECT_EQ(defaults.load.activation_precision, std::nullopt);
  EXPECT_EQ(defaults.load.kv_cache_dtype, std::nullopt);
  EXPECT_FALSE(defaults.load.batch_invariant);
  CLI::App bad;
  ModelOptions bad_opts;
  add_model_options(bad, bad_opts);
  EXPECT_THROW(bad.parse("-m x --device sm90", false), UsageError);
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

// Issue 42: the dashes are not part of the distance ("--temp" was 2 edits from "--help", within the bound of 6
// characters); a unique prefix then answers.
TEST(ClosestMatch, DashesDoNotCount) {
  EXPECT_EQ(closest_match("--temp", {"--help", "--temperature", "--top-p"}), "--temperature");
  EXPECT_EQ(closest_match("--hepl", {"--help", "--temperature"}), "--help");
  EXPECT_EQ(closest_match("--xyz", {"--help", "--top-k"}), std::nullopt);
}

TEST(ForeignFlagHint, NamesTheEngineAndWhatFp4serveDoesInstead) {
  EXPECT_EQ(foreign_flag_hint("--temp"), "--temp is a llama.cpp flag; fp4serve's is --temperature (e.g. "
                                         "--temperature 0.7; 0 = greedy)");
  for (const char* flag : {"-ngl", "--n-gpu-layers"}) {
    const auto hint = foreign_flag_hint(flag);
    ASSERT_TRUE(hint) << flag;
    EXPECT_NE(hint->find("llama.cpp flag; fp4serve runs the whole model on one device"), std::string::npos) << *hint;
  }
  EXPECT_NE(foreign_flag_hint("--dtype").value_or("").find("--activation-precision"), std::string::npos);
  EXPECT_NE(foreign_flag_hint("--gpu-memory-utilization").value_or("").find("--kv-cache-memory"), std::string::npos);
  EXPECT_NE(foreign_flag_hint("--tp").value_or("").find("-tp N or --tensor-parallel-size N"), std::string::npos);
  EXPECT_NE(foreign_flag_hint("--trust-remote-code").value_or("").find("runs no code from the checkpoint"),
            std::string::npos);
  EXPECT_EQ(foreign_flag_hint("--temperature"), std::nullopt);  // fp4serve's own spelling
  EXPECT_EQ(foreign_flag_hint("--tem"), std::nullopt);
}

TEST(NumberOption, RangesAreCheckedWhileParsing) {
  CLI::App app;
  int64_t max_tokens = 64;
  std::optional<float> top_p;
  std::optional<int> top_k;
  add_number_option(app, "-n,--max-tokens", max_tokens, ranges::kMaxTokens, "");
  add_number_option(app, "--top-p", top_p, ranges::kTopP, "");
  add_number_option(app, "--top-k", top_k, ranges::kTopK, "");
  app.parse("-n 7 --top-p 0.5 --top-k -1", false);
  EXPECT_EQ(max_tokens, 7);
  EXPECT_EQ(top_p, 0.5f);
  EXPECT_EQ(top_k, -1);
  EXPECT_EQ(usage_error([&] { app.parse("-n 0", false); }),
            "-n/--max-tokens 0 is out of range: expected a whole number ≥ 1");
  EXPECT_EQ(usage_error([&] { app.parse("-n -3", false); }),
            "-n/--max-tokens -3 is out of range: expected a whole number ≥ 1");
  EXPECT_EQ(usage_error([&] { app.parse("-n 1.5", false); }), "-n/--max-tokens '1.5': expected a whole number ≥ 1");
  EXPECT_EQ(usage_error([&] { app.parse("--top-p 2", false); }),
            "--top-p 2 is out of range: expected a number in (0, 1] (1 = off)");
  EXPECT_EQ(usage_error([&] { app.parse("--top-p 0", false); }),
            "--top-p 0 is out of range: expected a number in (0, 1] (1 = off)");
  EXPECT_EQ(usage_error([&] { app.parse("--top-p nan", false); }), "--top-p 'nan': expected a number in (0, 1] (1 = off)");
  EXPECT_EQ(usage_error([&] { app.parse("--top-k 99999999999", false); }), "--top-k 99999999999 is too large: at most 2147483647");
}

TEST(ResolveModelPath, TypoOfALocalFolderSuggestsIt) {
  TempDir t;
  fs::create_directories(t.path() / "models" / "default-nvfp4");
  const std::string typo = (t.path() / "models" / "default-nvfp").string();
  EXPECT_EQ(error_of(typo), fmt::format("{}: no such file or folder; did you mean {}?", typo,
                                        (t.path() / "models" / "default-nvfp4").string()));
  // Relative, as typed: it also looks like ORG/NAME, and the folder beats a download command.
  const fs::path cwd = fs::current_path();
  fs::current_path(t.path());
  ::setenv("HF_HUB_CACHE", (t.path() / "hub").c_str(), 1);
  const std::string message = error_of("models/default-nvfp");
  ::unsetenv("HF_HUB_CACHE");
  fs::current_path(cwd);
  EXPECT_TRUE(message.starts_with("models/default-nvfp: no such file or folder; did you mean models/default-nvfp4?"))
      << message;
  EXPECT_EQ(message.find("huggingface-cli download"), std::string::npos) << message;
}

}  // namespace
}  // namespace fp4serve::app
