// SPDX-License-Identifier: Apache-2.0
#include "quant/quantize_checkpoint.h"

#include <fmt/format.h>

#include <optional>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cctype>
#include <cstring>
#include <fstream>
#include <memory>


#include "checkpoint/architecture.h"
#include "fp4serve/error.h"
#include "quant/name_match.h"
#include "quant/dequant.h"
#include "quant/formats.h"
#include "quant/quantize.h"

namespace fp4serve::quant {
namespace {

namespace fs = std::filesystem;
using checkpoint::TensorRecord;
using core::DType;
using nlohmann::json;

// compressed-tensors version whose on-disk layout we reproduce (the one that wrote tests/data/ref/*). Loaders
// read `version` only to pick the int 3/5/6/7-bit packing (FORMATS.md §0.4), which we never write.
constexpr std::string_view kCompressedTensorsVersion = "0.19.0";

// Side files copied verbatim: tokenizer, chat template and generation settings as transformers saves them.
constexpr std::array<std::string_view, 10> kSideFiles{
    "generation_config.json", "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json",      "chat_template.jinja", "chat_template.json",   "tokenizer.model",
    "vocab.json",             "merges.txt"};

bool is_nvfp4(QuantScheme s) { return s == QuantScheme::Nvfp4 || s == QuantScheme::Nvfp4A16; }

// Natural order ("layers.2" before "layers.10"), so layers are written and reported in model order.
bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string_view da = a.substr(i, ie - i), db = b.substr(j, je - j);
      if (da.size() != db.size()) return da.size() < db.size();
      if (da != db) return da < db;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// An ignore entry: exact module name, or `re:` + a regex anchored at the start only (Python re.match), the same
// matcher the plan uses for compressed-tensors ignore lists (quant/name_match.h).
struct IgnorePattern {
  std::string text;
  std::optional<PrefixRegex> regex;  // empty for an exact name
  bool matches(const std::string& module) const { return regex ? regex->matches(module) : module == text; }
};

std::vector<IgnorePattern> compile_ignore(const std::vector<std::string>& patterns) {
  std::vector<IgnorePattern> out;
  for (const std::string& p : patterns) {
    IgnorePattern ip{p, std::nullopt};
    if (p.starts_with("re:")) {
      try {
        ip.regex.emplace(std::string_view(p).substr(3), fmt::format("--ignore \"{}\"", p));
      } catch (const FormatError& e) {  // a bad pattern on the command line is the caller's mistake
        throw UsageError(e.what());
      }
    }
    out.push_back(std::move(ip));
  }
  return out;
}

std::vector<float> read_floats(const core::TensorView& t, std::string_view name) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_float(t, i, name);
  return out;
}

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());  // little-endian host (checked in core)
  return out;
}

std::vector<std::byte> scales_in(DType dtype, const std::vector<float>& v) {
  if (dtype == DType::F32) return as_bytes(v);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = dtype == DType::BF16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
  return as_bytes(bits);
}

// The weight a quantized linear quantizes: the source weight, Hadamard-rotated when the plan asks for it.
std::vector<float> linear_weight(const checkpoint::Checkpoint& source, const QuantizePlan& plan, const LinearPlan& lin) {
  const std::string weight_name = lin.module + ".weight";
  std::vector<float> w = read_floats(source.tensor(weight_name), weight_name);
  if (plan.hadamard > 0 && lin.quantized) rotate_weight_hadamard(w, lin.rows, lin.cols, plan.hadamard, lin.dtype);
  return w;
}

constexpr const char* kHadamardGroup = "v";

std::string hadamard_tensor_name(const LinearPlan& lin) { return lin.module + "." + kHadamardGroup + "_input.weight"; }

// The one stored matrix of the tied `v` transform: ±1 Sylvester, F64 (the QuIP scheme's default precision).
TensorRecord hadamard_record(const LinearPlan& lin, int64_t b) {
  std::vector<double> h(static_cast<size_t>(b * b));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < b; ++j) h[static_cast<size_t>(i * b + j)] = (std::popcount(static_cast<uint64_t>(i & j)) & 1) ? -1.0 : 1.0;
  }
  return {hadamard_tensor_name(lin), DType::F64, {b, b}, as_bytes(h)};
}

// LLMC QuIPModifier(rotations=["v"], transform_type="hadamard", transform_block_size=b) as compressed-tensors
// serializes it: online `input` + inverse fused `weight_input` on the quantized linears.
json transform_config(const QuantizePlan& plan) {
  if (plan.hadamard == 0) return json::object();
  const auto apply = [&](const char* location, bool inverse) {
    return json{{"ignore", plan.ignore}, {"inverse", inverse}, {"location", location}, {"targets", {"Linear"}}};
  };
  const json group = {{"apply", {apply("input", false), apply("weight_input", true)}}, {"head_dim", plan.hadamard},
                      {"precision", "torch.float64"}, {"randomize", false}, {"requires_grad", false},
                      {"type", "hadamard"}};
  return json{{"config_groups", {{kHadamardGroup, group}}}};
}

// The compressed-tensors tensors of one quantized linear, in the order CT's compressors name them.
// Factorized Hessians of the last few distinct inputs: a layer's k, o, q, v and down, gate, up come in name order,
// so four entries keep every factor of a layer until its last user.
class FactorCache {
 public:
  const GptqFactor& get(const GptqHessian* h, int64_t cols, const GptqOptions& options) {
    for (auto& e : entries_) {
      if (e.first == h) return e.second;
    }
    if (entries_.size() == 4) entries_.erase(entries_.begin());
    entries_.emplace_back(h, gptq_factorize(h->normalized(), cols, options));
    return entries_.back().second;
  }

 private:
  std::vector<std::pair<const GptqHessian*, GptqFactor>> entries_;
};

std::vector<TensorRecord> quantize_linear(const checkpoint::Checkpoint& source, const QuantizePlan& plan,
                                          const LinearPlan& lin, bool carries_transform, FactorCache& factors) {
  const std::string weight_name = lin.module + ".weight";
  const std::vector<float> w = linear_weight(source, plan, lin);
  abs_max(w, weight_name);  // rejects NaN/inf with the tensor's name before any scale is computed
  const std::string& m = lin.module;
  std::vector<TensorRecord> out;
  // GPTQ keeps round-to-nearest's grid and re-chooses the codes against the calibration Hessian.
  const bool gptq = plan.method == QuantMethod::Gptq;
  const GptqFactor* factor = nullptr;
  if (gptq) {
    // q|k|v and gate|up read one input: factorize its Hessian once.
    factor = &factors.get(plan.hessians.at(m).get(), lin.cols, plan.gptq);
  }
  switch (plan.scheme) {
    case QuantScheme::Nvfp4:
    case QuantScheme::Nvfp4A16: {
      const QuantizedNvfp4 q = gptq ? gptq_nvfp4(w, lin.rows, lin.cols, lin.global_scale, lin.dtype, *factor, plan.gptq)
                                    : quantize_nvfp4(w, lin.rows, lin.cols, lin.global_scale, lin.dtype);
      out.push_back({m + ".weight_packed", DType::U8, {lin.rows, lin.cols / 2}, as_bytes(q.packed)});
      out.push_back({m + ".weight_scale", DType::F8_E4M3, {lin.rows, lin.cols / kNvfp4GroupSize}, as_bytes(q.scales)});
      out.push_back({m + ".weight_global_scale", DType::F32, {1}, as_bytes(std::vector<float>{q.global_scale})});
      if (plan.scheme == QuantScheme::Nvfp4) {
        out.push_back({m + ".input_global_scale", DType::F32, {1},
                       as_bytes(std::vector<float>{lin.input_global_scale})});
      }
      break;
    }
    case QuantScheme::Mxfp4:
    case QuantScheme::Mxfp4A16: {
      const QuantizedMxfp4 q = gptq ? gptq_mxfp4(w, lin.rows, lin.cols, lin.dtype, *factor, plan.gptq)
                                    : quantize_mxfp4(w, lin.rows, lin.cols, lin.dtype);
      out.push_back({m + ".weight_packed", DType::U8, {lin.rows, lin.cols / 2}, as_bytes(q.packed)});
      out.push_back({m + ".weight_scale", DType::U8, {lin.rows, lin.cols / kMxfp4GroupSize}, as_bytes(q.scales)});
      break;
    }
    case QuantScheme::W4A16: {
      const QuantizedInt4 q = gptq ? gptq_int4(w, lin.rows, lin.cols, plan.group_size, lin.dtype, *factor, plan.gptq)
                                   : quantize_int4(w, lin.rows, lin.cols, plan.group_size, lin.dtype);
      out.push_back({m + ".weight_packed", DType::I32, {lin.rows, (lin.cols + 7) / 8}, as_bytes(q.packed)});
      out.push_back({m + ".weight_scale", q.scale_dtype, {lin.rows, lin.cols / plan.group_size},
                     scales_in(q.scale_dtype, q.scales)});
      out.push_back({m + ".weight_shape", DType::I64, {2}, as_bytes(std::vector<int64_t>{lin.rows, lin.cols})});
      break;
    }
  }
  if (carries_transform) out.push_back(hadamard_record(lin, plan.hadamard));
  return out;
}

// Output tensor names and sizes of a quantized linear, known before any math so shards can be planned first.
std::vector<std::pair<std::string, uint64_t>> quantized_outputs(const QuantizePlan& plan, const LinearPlan& lin,
                                                               bool carries_transform) {
  const auto bytes = [](DType d, std::vector<int64_t> s) { return checkpoint::tensor_bytes(d, s); };
  const std::string& m = lin.module;
  std::vector<std::pair<std::string, uint64_t>> out;
  out.emplace_back(m + ".weight_packed", bytes(DType::U8, {lin.rows, lin.cols / 2}));
  switch (plan.scheme) {
    case QuantScheme::Nvfp4:
    case QuantScheme::Nvfp4A16:
      out.emplace_back(m + ".weight_scale", bytes(DType::F8_E4M3, {lin.rows, lin.cols / kNvfp4GroupSize}));
      out.emplace_back(m + ".weight_global_scale", 4);
      if (plan.scheme == QuantScheme::Nvfp4) out.emplace_back(m + ".input_global_scale", 4);
      break;
    case QuantScheme::Mxfp4:
    case QuantScheme::Mxfp4A16:
      out.emplace_back(m + ".weight_scale", bytes(DType::U8, {lin.rows, lin.cols / kMxfp4GroupSize}));
      break;
    case QuantScheme::W4A16:
      out[0].second = bytes(DType::I32, {lin.rows, (lin.cols + 7) / 8});
      out.emplace_back(m + ".weight_scale", bytes(lin.dtype, {lin.rows, lin.cols / plan.group_size}));
      out.emplace_back(m + ".weight_shape", 16);
      break;
  }
  if (carries_transform) out.emplace_back(hadamard_tensor_name(lin), bytes(DType::F64, {plan.hadamard, plan.hadamard}));
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw IoError(fmt::format("{}: cannot write: {}", path.string(), std::strerror(errno)));
}

}  // namespace

std::optional<QuantScheme> parse_quant_scheme(std::string_view name) {
  for (QuantScheme s : {QuantScheme::Nvfp4, QuantScheme::Nvfp4A16, QuantScheme::Mxfp4, QuantScheme::Mxfp4A16,
                        QuantScheme::W4A16}) {
    if (quant_scheme_name(s) == name) return s;
  }
  return std::nullopt;
}

std::optional<QuantMethod> parse_quant_method(std::string_view name) {
  if (name == "rtn") return QuantMethod::Rtn;
  if (name == "gptq") return QuantMethod::Gptq;
  return std::nullopt;
}

std::string_view quant_method_name(QuantMethod method) {
  switch (method) {
    case QuantMethod::Rtn: return "rtn";
    case QuantMethod::Gptq: return "gptq";
  }
  return "?";
}

std::string_view quant_scheme_name(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::Nvfp4: return "nvfp4";
    case QuantScheme::Nvfp4A16: return "nvfp4a16";
    case QuantScheme::Mxfp4: return "mxfp4";
    case QuantScheme::Mxfp4A16: return "mxfp4a16";
    case QuantScheme::W4A16: return "w4a16";
  }
  return "?";
}

void rotate_weight_hadamard(std::vector<float>& w, int64_t rows, int64_t cols, int64_t b, core::DType dtype) {
  if (b < 2 || (b & (b - 1)) != 0 || cols % b != 0 || w.size() != static_cast<size_t>(rows * cols)) {
    throw UsageError(fmt::format("Hadamard block {} must be a power of two dividing in_features {}", b, cols));
  }
  const double scale = std::sqrt(static_cast<double>(b));
  std::vector<double> in(static_cast<size_t>(b));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t blk = 0; blk < cols; blk += b) {
      float* row = w.data() + r * cols + blk;
      for (int64_t i = 0; i < b; ++i) in[static_cast<size_t>(i)] = row[i];
      for (int64_t j = 0; j < b; ++j) {
        double acc = 0.0;  // sums of ±BF16/F16 values are exact in float64 at these sizes, so order does not matter
        for (int64_t i = 0; i < b; ++i) {
          acc += (std::popcount(static_cast<uint64_t>(i & j)) & 1) ? -in[static_cast<size_t>(i)] : in[static_cast<size_t>(i)];
        }
        const float f = static_cast<float>(acc / scale);
        row[j] = dtype == DType::BF16 ? bf16_to_float(float_to_bf16(f))
                 : dtype == DType::F16 ? f16_to_float(float_to_f16(f))
                                       : f;
      }
    }
  }
}

std::vector<std::string> default_ignore_patterns() {
  return {"lm_head", R"(re:.*mlp\.gate$)", R"(re:.*block_sparse_moe\.gate$)", R"(re:.*\.router(\.layer)?$)",
          R"(re:.*shared_expert_gate$)"};
}

QuantizePlan plan_quantization(const checkpoint::Checkpoint& source, const QuantizeOptions& options) {
  const std::string src = source.root().string();
  if (!source.config().is_object()) throw UsageError(fmt::format("{}: no config.json; quantize needs a model folder", src));
  if (source.config().contains("quantization_config") || !source.hf_quant_config().is_null()) {
    throw UsageError(fmt::format("{}: the checkpoint is already quantized; quantize needs BF16/F16/F32 weights", src));
  }
  QuantizePlan plan;
  plan.scheme = options.scheme;
  plan.hadamard = options.hadamard;
  if (plan.hadamard != 0 && plan.hadamard != 16 && plan.hadamard != 32 && plan.hadamard != 64 && plan.hadamard != 128) {
    throw UsageError(fmt::format("--hadamard {}: the block size must be 16, 32, 64 or 128", plan.hadamard));
  }
  const int64_t fixed = is_nvfp4(options.scheme) ? kNvfp4GroupSize
                        : options.scheme == QuantScheme::W4A16 ? 0 : kMxfp4GroupSize;
  if (fixed != 0 && options.group_size != 0 && options.group_size != fixed) {
    throw UsageError(fmt::format("--group-size {}: scheme {} has a fixed group size of {}", options.group_size,
                                 quant_scheme_name(options.scheme), fixed));
  }
  if (options.group_size < 0) throw UsageError(fmt::format("--group-size {} must be positive", options.group_size));
  plan.group_size = fixed != 0 ? fixed : options.group_size != 0 ? options.group_size : kInt4DefaultGroupSize;
  const std::vector<IgnorePattern> ignore = compile_ignore(options.ignore.value_or(default_ignore_patterns()));

  std::optional<LinearPlan> misfit;  // the first quantized layer the group size does not divide
  // The linears are the architecture's (checkpoint/architecture.h), never inferred from tensor names; their fusion
  // groups are the ones runtimes fuse into one GEMM, which llm-compressor gives one NVFP4 global scale
  // (LLMC observers/helpers.py FUSED_LAYER_NAMES: q/k/v, gate/up, w1/w3).
  const checkpoint::ModelDims dims = checkpoint::read_model_dims(source.config());
  const checkpoint::ExpertNaming naming = checkpoint::detect_expert_naming(dims, [&](std::string_view prefix) {
    const auto& names = source.tensor_names();
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.starts_with(prefix); });
  });
  const checkpoint::ModelLayout layout = checkpoint::describe_model(source.config(), naming);
  for (const checkpoint::ModuleInfo& module : layout.modules) {
    if (module.role == checkpoint::ModuleRole::Embedding) continue;
    if (module.tied) continue;  // lm_head reading the embedding: no weight of its own (see the ignore list below)
    const std::string& name = module.dense_weight;
    if (!source.contains(name)) {
      throw FormatError(fmt::format("{}: {} module {} has no weight tensor {}", src, layout.dims.architecture,
                                    module.name, name));
    }
    const core::TensorView t = source.tensor(name);
    if (module.experts > 0 || t.shape.size() != 2) {
      throw UnsupportedError(fmt::format("{}: {}-D tensor {} (fused experts); quantize handles 2-D linear weights "
                                         "only", src, t.shape.size(), name));
    }
    LinearPlan lin;
    lin.module = module.name;
    lin.dtype = t.dtype;
    lin.rows = t.shape[0];
    lin.cols = t.shape[1];
    lin.quantized = std::none_of(ignore.begin(), ignore.end(), [&](const auto& p) { return p.matches(lin.module); });
    lin.fused_group = module.fusion_group;
    if (lin.quantized) {
      if (lin.dtype != DType::BF16 && lin.dtype != DType::F16 && lin.dtype != DType::F32) {
        throw UnsupportedError(fmt::format("{}: weight dtype {}; quantize reads BF16, F16 or F32", name,
                                           core::dtype_name(lin.dtype)));
      }
      if (lin.cols % plan.group_size != 0 && !misfit) misfit = lin;
      if (plan.hadamard != 0 && lin.cols % plan.hadamard != 0) {
        throw UsageError(fmt::format("{}: in_features {} is not a multiple of the Hadamard block {}; choose a smaller "
                                     "--hadamard or keep the layer unquantized with --ignore {}", lin.module, lin.cols,
                                     plan.hadamard, lin.module));
      }
    }
    plan.linears.push_back(std::move(lin));
  }
  if (misfit) {
    // W4A16's group size is a choice: name the largest one that fits every quantized layer (as --group-size 64
    // does for a hidden size of 576); the FP4 schemes' groups are fixed, so only --ignore remains.
    int64_t fits = 0;
    if (plan.scheme == QuantScheme::W4A16) {
      for (const int64_t g : {128, 64, 32, 16, 8}) {  // the group sizes int4 W4A16 checkpoints use
        if (g < plan.group_size && std::all_of(plan.linears.begin(), plan.linears.end(), [g](const LinearPlan& l) {
              return !l.quantized || l.cols % g == 0;
            })) {
          fits = g;
          break;
        }
      }
    }
    throw UsageError(fmt::format("{}: in_features {} is not a multiple of the {} group size {}; {}keep the layer "
                                 "unquantized with --ignore {}", misfit->module, misfit->cols,
                                 quant_scheme_name(plan.scheme), plan.group_size,
                                 fits > 0 ? fmt::format("use --group-size {} (it divides every quantized layer's "
                                                        "in_features), or ", fits)
                                          : "",
                                 misfit->module));
  }
  std::sort(plan.linears.begin(), plan.linears.end(),
            [](const LinearPlan& a, const LinearPlan& b) { return natural_less(a.module, b.module); });

  if (is_nvfp4(plan.scheme)) {
    // Joint amax per fusion group (a module outside any group is its own group), then one global scale each.
    std::map<std::string, float> weight_amax, input_amax;
    const auto key = [](const LinearPlan& l) { return l.fused_group.empty() ? l.module : l.fused_group; };
    for (const LinearPlan& lin : plan.linears) {
      if (!lin.quantized) continue;
      const std::string wname = lin.module + ".weight";
      const float a = abs_max(linear_weight(source, plan, lin), wname);
      weight_amax[key(lin)] = std::max(weight_amax[key(lin)], a);
      if (plan.scheme == QuantScheme::Nvfp4) {
        const auto it = options.input_amax.find(lin.module);
        if (it == options.input_amax.end()) {
          throw UsageError(fmt::format("{}: no calibrated input amax; W4A4 NVFP4 needs one per quantized layer",
                                       lin.module));
        }
        input_amax[key(lin)] = std::max(input_amax[key(lin)], it->second);
      }
    }
    for (LinearPlan& lin : plan.linears) {
      if (!lin.quantized) continue;
      lin.global_scale = nvfp4_global_scale(weight_amax[key(lin)], lin.dtype);
      if (plan.scheme == QuantScheme::Nvfp4) lin.input_global_scale = nvfp4_global_scale(input_amax[key(lin)], lin.dtype);
    }
  }

  plan.method = options.method;
  plan.gptq = options.gptq;
  if (plan.method == QuantMethod::Gptq) {
    for (const LinearPlan& lin : plan.linears) {
      if (!lin.quantized) continue;
      const auto it = options.hessians.find(lin.module);
      if (it == options.hessians.end() || it->second == nullptr) {
        throw UsageError(fmt::format("{}: no calibration Hessian; --method gptq needs one per quantized layer", lin.module));
      }
      if (it->second->width() != lin.cols) {
        throw UsageError(fmt::format("{}: the calibration Hessian is {}×{}, the layer's in_features is {}", lin.module,
                                     it->second->width(), it->second->width(), lin.cols));
      }
      plan.hessians[lin.module] = it->second;
    }
  }

  // llm-compressor lists every unquantized Linear by exact name in module order: layers first, lm_head last.
  bool lm_head_listed = false;
  for (const LinearPlan& lin : plan.linears) {
    if (lin.quantized) continue;
    if (lin.module == "lm_head") lm_head_listed = true;
    else plan.ignore.push_back(lin.module);
  }
  const bool lm_head_absent = std::none_of(plan.linears.begin(), plan.linears.end(),
                                           [](const LinearPlan& l) { return l.module == "lm_head"; });
  const bool tied = source.config().value("tie_word_embeddings", false);
  // A tied lm_head is not on disk but is still a Linear module that stays unquantized.
  if (lm_head_listed || (lm_head_absent && tied)) plan.ignore.push_back("lm_head");
  return plan;
}

json quantization_config(const QuantizePlan& plan) {
  // GPTQModifier records its column order on the weight args ("static", its default); activations have none.
  const json weight_actorder = plan.method == QuantMethod::Gptq && plan.gptq.actorder ? json("static") : json(nullptr);
  const auto args = [](int64_t group, std::string_view type, std::string_view strategy, json scale_dtype,
                       json dynamic, json observer) {
    return json{{"actorder", nullptr}, {"block_structure", nullptr}, {"dynamic", std::move(dynamic)},
                {"group_size", group}, {"num_bits", 4}, {"observer", std::move(observer)},
                {"observer_kwargs", json::object()}, {"scale_dtype", std::move(scale_dtype)},
                {"strategy", strategy}, {"symmetric", true}, {"type", type}, {"zp_dtype", nullptr}};
  };
  // A block format's args come from its row: what the config parser's predicates will read back.
  const auto block_args = [&](BlockFormat f, bool input) {
    const BlockFormatTraits& t = block_format_traits(f);
    const json scale_dtype = t.scale == ElementFormat::E4M3 ? "torch.float8_e4m3fn" : "torch.uint8";
    const bool local = t.input_dynamic == Dynamic::Local;  // only a calibrated global scale is stored
    if (!input) return args(t.group_size, "float", strategy_name(t.strategy), scale_dtype, false, "memoryless_minmax");
    return args(t.group_size, "float", strategy_name(t.strategy), scale_dtype, local ? json("local") : json(true),
                local ? json("static_minmax") : json(nullptr));
  };
  std::string format;
  json weights, inputs = nullptr;
  switch (plan.scheme) {
    case QuantScheme::Nvfp4:
    case QuantScheme::Nvfp4A16:
    case QuantScheme::Mxfp4:
    case QuantScheme::Mxfp4A16: {
      const BlockFormat f = is_nvfp4(plan.scheme) ? BlockFormat::Nvfp4 : BlockFormat::Mxfp4;
      format = block_format_traits(f).ct_format;
      weights = block_args(f, false);
      if (plan.scheme == QuantScheme::Nvfp4 || plan.scheme == QuantScheme::Mxfp4) inputs = block_args(f, true);
      break;
    }
    case QuantScheme::W4A16:
      format = "pack-quantized";
      weights = args(plan.group_size, "int", "group", nullptr, false, "memoryless_minmax");
      break;
  }
  weights["actorder"] = weight_actorder;
  const json group = {{"format", format}, {"input_activations", inputs}, {"output_activations", nullptr},
                      {"targets", {"Linear"}}, {"weights", weights}};
  return json{{"config_groups", {{"group_0", group}}}, {"format", format}, {"global_compression_ratio", nullptr},
              {"ignore", plan.ignore}, {"kv_cache_scheme", nullptr}, {"quant_method", "compressed-tensors"},
              {"quantization_status", "compressed"}, {"sparsity_config", json::object()},
              {"transform_config", transform_config(plan)}, {"version", kCompressedTensorsVersion}};
}

void quantize_checkpoint(const checkpoint::Checkpoint& source, const QuantizePlan& plan, const fs::path& out_dir,
                         uint64_t max_shard_bytes, const QuantizeProgress& progress) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && fs::equivalent(out_dir, source.root(), ec)) {
    throw UsageError(fmt::format("{}: the output folder is the source folder", out_dir.string()));
  }
  fs::create_directories(out_dir, ec);
  if (ec) throw IoError(fmt::format("{}: cannot create the output folder: {}", out_dir.string(), ec.message()));
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string f = e.path().filename().string();
    if (f.starts_with("model") && f.find(".safetensors") != std::string::npos) {
      throw UsageError(fmt::format("{}: already holds {}; choose an empty output folder", out_dir.string(), f));
    }
  }

  // 1. Every output tensor, in natural source order, with its size, so shards are planned before any math.
  struct Output {
    std::string name;
    uint64_t bytes = 0;
    int linear = -1;  // index into plan.linears when the tensor comes from quantizing that layer
  };
  std::map<std::string, int> quantized_index;
  for (size_t i = 0; i < plan.linears.size(); ++i) {
    if (plan.linears[i].quantized) quantized_index[plan.linears[i].module + ".weight"] = static_cast<int>(i);
  }
  // The tied Hadamard matrix is stored once, with the first quantized linear (all share one size).
  int transform_carrier = -1;
  if (plan.hadamard > 0) {
    for (size_t i = 0; i < plan.linears.size() && transform_carrier < 0; ++i) {
      if (plan.linears[i].quantized) transform_carrier = static_cast<int>(i);
    }
  }
  std::vector<std::string> names = source.tensor_names();
  std::sort(names.begin(), names.end(), natural_less);
  std::vector<Output> outputs;
  std::map<int, size_t> pending;  // outputs of each quantized linear not yet written
  for (const std::string& name : names) {
    const auto it = quantized_index.find(name);
    if (it == quantized_index.end()) {
      outputs.push_back({name, source.tensor(name).bytes.size(), -1});
      continue;
    }
    for (auto& [out_name, bytes] : quantized_outputs(plan, plan.linears[static_cast<size_t>(it->second)],
                                                     it->second == transform_carrier)) {
      outputs.push_back({out_name, bytes, it->second});
      ++pending[it->second];
    }
  }
  std::vector<uint64_t> sizes;
  for (const Output& o : outputs) sizes.push_back(o.bytes);
  const auto shards = checkpoint::plan_shards(sizes, max_shard_bytes);

  // 2. Quantize and write shard by shard; a layer's tensors are computed once and dropped when all are written.
  std::map<int, std::vector<TensorRecord>> cache;
  std::map<std::string, std::string> weight_map;
  uint64_t total_bytes = 0;
  size_t done = 0;
  const size_t total = quantized_index.size();
  FactorCache factors;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = checkpoint::shard_file_name(s + 1, shards.size());
    std::vector<TensorRecord> records;
    for (size_t idx : shards[s]) {
      const Output& o = outputs[idx];
      if (o.linear < 0) {
        const core::TensorView t = source.tensor(o.name);
        records.push_back({o.name, t.dtype, t.shape, std::vector<std::byte>(t.bytes.begin(), t.bytes.end())});
      } else {
        auto it = cache.find(o.linear);
        if (it == cache.end()) {
          const LinearPlan& lin = plan.linears[static_cast<size_t>(o.linear)];
          it = cache.emplace(o.linear, quantize_linear(source, plan, lin, o.linear == transform_carrier, factors)).first;
          if (progress) progress(++done, total, lin.module);
        }
        auto rec = std::find_if(it->second.begin(), it->second.end(), [&](const auto& r) { return r.name == o.name; });
        records.push_back(std::move(*rec));
        if (--pending[o.linear] == 0) cache.erase(it);
      }
      weight_map[o.name] = file;
      total_bytes += o.bytes;
    }
    checkpoint::write_safetensors(out_dir / file, records);
  }
  if (shards.size() > 1) checkpoint::write_safetensors_index(out_dir, weight_map, total_bytes);

  json config = source.config();
  config["quantization_config"] = quantization_config(plan);
  // compressed-tensors `update_config` rewrites config.json last, with json.dump(indent=2, sort_keys=True) and
  // no final newline.
  write_text(out_dir / "config.json", config.dump(2));
  for (std::string_view f : kSideFiles) {
    const fs::path from = source.root() / f;
    if (!fs::exists(from, ec)) continue;
    fs::copy_file(from, out_dir / f, fs::copy_options::overwrite_existing, ec);
    if (ec) throw IoError(fmt::format("{}: cannot copy to {}: {}", from.string(), out_dir.string(), ec.message()));
  }
}

}  // namespace fp4serve::quant
