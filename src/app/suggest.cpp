// SPDX-License-Identifier: Apache-2.0
#include "app/suggest.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace fp4serve::app {
namespace {

// Optimal string alignment distance (Damerau–Levenshtein without repeated edits of a substring).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string_view without_dashes(std::string_view s) {
  while (s.starts_with('-')) s.remove_prefix(1);
  return s;
}

struct ForeignFlag {
  std::array<const char*, 4> names;  // spellings, unused slots nullptr
  const char* engine;                // "a vLLM flag"; nullptr: not another engine's spelling
  const char* instead;               // what fp4serve does; a complete clause
};

// Flags people bring from other engines. Each says what fp4serve does instead, so that the user does not have to
// look up whether the feature exists. fp4serve's own spellings are never listed here (main checks that too).
constexpr std::array<ForeignFlag, 21> kForeignFlags{{
    {{"--temp"}, "llama.cpp", "fp4serve's is --temperature (e.g. --temperature 0.7; 0 = greedy)"},
    {{"-ngl", "--n-gpu-layers", "--gpu-layers"}, "llama.cpp",
     "fp4serve runs the whole model on one device, with no partial offload: --device cuda puts every layer on the "
     "GPU, --device cpu none, --device auto takes the GPU when one is found"},
    {{"--dtype"}, "vLLM",
     "fp4serve runs the checkpoint's weights in their stored format; choose the activations' precision with "
     "--activation-precision and the KV cache's with --kv-cache-dtype (`fp4serve quantize` makes an FP4 checkpoint)"},
    {{"--gpu-memory-utilization"}, "vLLM",
     "only `serve` takes --gpu-memory-utilization F (or --kv-cache-memory GIB): the KV block pool's share of the "
     "device; generate and chat allocate what the request needs"},
    {{"--tp"}, nullptr,
     "tensor parallelism is -tp N or --tensor-parallel-size N (one process per rank, under mpirun), as in vLLM"},
    {{"--trust-remote-code"}, "vLLM/transformers",
     "fp4serve runs no code from the checkpoint: its architectures are built in, so nothing needs trusting "
     "(`fp4serve explain MODEL` says whether a checkpoint is supported)"},
    {{"--quantization"}, "vLLM",
     "fp4serve reads the quantization from the checkpoint's config (`fp4serve explain MODEL` shows each layer's "
     "scheme); there is nothing to pass"},
    {{"--n-predict", "--predict", "--max-new-tokens"}, "llama.cpp/transformers", "fp4serve's is -n/--max-tokens N"},
    {{"--repeat-penalty"}, "llama.cpp", "fp4serve's is --repetition-penalty"},
    {{"--cache-type-k", "--cache-type-v", "-ctk", "-ctv"}, "llama.cpp",
     "fp4serve's is --kv-cache-dtype auto|fp32|bf16|fp16 (one type for keys and values)"},
    {{"-pp", "--pipeline-parallel-size"}, "vLLM",
     "fp4serve splits a model by tensor parallelism only: -tp N / --tensor-parallel-size N"},
    {{"-ts", "--tensor-split"}, "llama.cpp",
     "fp4serve splits a model evenly by tensor parallelism: -tp N / --tensor-parallel-size N under mpirun"},
    {{"-mg", "--main-gpu"}, "llama.cpp",
     "fp4serve uses the first GPU that CUDA_VISIBLE_DEVICES shows (a tensor-parallel rank: its local rank's)"},
    {{"-i", "--interactive", "-cnv", "--conversation"}, "llama.cpp", "fp4serve's interactive mode is `fp4serve chat MODEL`"},
    {{"-hf", "--hf-repo"}, "llama.cpp",
     "pass ORG/NAME as the MODEL: fp4serve reads it from the local Hugging Face cache (fetch it first with "
     "`huggingface-cli download ORG/NAME`)"},
    {{"--download-dir"}, "vLLM",
     "fp4serve downloads nothing: it reads a folder, or ORG/NAME from the Hugging Face cache ($HF_HUB_CACHE)"},
    {{"-b", "--batch-size", "-ub", "--ubatch-size"}, "llama.cpp",
     "fp4serve's tokens per forward step are `serve --max-num-batched-tokens N`"},
    {{"-np", "--parallel"}, "llama.cpp", "fp4serve's concurrent sequences are `serve --max-num-seqs N`"},
    {{"--jinja"}, "llama.cpp", "fp4serve always renders the model's Jinja chat template (--chat-template picks another)"},
    {{"--max-num-tokens", "--max-total-tokens"}, "TGI",
     "fp4serve's context length is -c/--max-model-len N, and each request's output -n/--max-tokens N"},
    {{"--model-path", "--model-id"}, "SGLang/TGI", "fp4serve takes the model as MODEL (positional) or -m/--model"},
}};

}  // namespace

std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  if (without_dashes(word).empty()) return std::nullopt;
  std::optional<std::string> prefix_match;
  size_t prefix_count = 0;
  std::optional<std::string> best;
  const std::string_view bare = without_dashes(word);
  size_t best_distance = std::max<size_t>(1, bare.size() / 3) + 1;
  for (const std::string& c : candidates) {
    if (c.starts_with(word)) {
      ++prefix_count;
      prefix_match = c;
    }
    // Dashes compared as written would make every option 2 characters closer to every other.
    const size_t d = edit_distance(bare, without_dashes(c)) + (word.size() - bare.size() != c.size() - without_dashes(c).size());
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best) return best;
  if (prefix_count == 1) return prefix_match;
  return std::nullopt;
}

std::optional<std::string> foreign_flag_hint(std::string_view flag) {
  for (const ForeignFlag& f : kForeignFlags) {
    for (const char* name : f.names) {
      if (name == nullptr || flag != name) continue;
      return f.engine != nullptr ? fmt::format("{} is a {} flag; {}", flag, f.engine, f.instead)
                                 : fmt::format("{} is not an fp4serve flag; {}", flag, f.instead);
    }
  }
  return std::nullopt;
}

}  // namespace fp4serve::app
