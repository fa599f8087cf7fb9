// SPDX-License-Identifier: Apache-2.0
#include "backends/activation_precision.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>

#include "backends/cpu/kernels/linear.h"
#include "core/threading.h"

namespace fp4serve::model {
namespace {

using prepare::ActivationPrecision;

// What a measurement is valid for: the CPU, the executable (its kernels), the thread count and the shape.
std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    for (const char* field : {"model name", "Model", "CPU part"}) {
      if (line.rfind(field, 0) == 0) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos) return line.substr(std::min(colon + 2, line.size()));
      }
    }
  }
  return "unknown CPU";
}

nlohmann::json probe_to_json(const kernels::PrecisionProbe& p) {
  return {{"choice", prepare::activation_precision_name(p.choice)},
          {"measured", p.measured},
          {"out_features", p.out_features},
          {"in_features", p.in_features},
          {"bf16_decode_s", p.bf16_decode_s},
          {"int8_decode_s", p.int8_decode_s},
          {"bf16_step_s", p.bf16_step_s},
          {"int8_step_s", p.int8_step_s},
          {"bf16_batched_s", p.bf16_batched_s},
          {"int8_batched_s", p.int8_batched_s}};
}

// A cached entry, or nullopt when it is malformed (then the probe runs again and replaces it).
std::optional<kernels::PrecisionProbe> probe_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  try {
    kernels::PrecisionProbe p;
    const std::string choice = j.at("choice").get<std::string>();
    if (choice == prepare::activation_precision_name(ActivationPrecision::Bf16)) {
      p.choice = ActivationPrecision::Bf16;
    } else if (choice == prepare::activation_precision_name(ActivationPrecision::Bf16DecodeInt8)) {
      p.choice = ActivationPrecision::Bf16DecodeInt8;
    } else {
      return std::nullopt;
    }
    p.measured = j.at("measured").get<bool>();
    p.out_features = j.at("out_features").get<int64_t>();
    p.in_features = j.at("in_features").get<int64_t>();
    p.bf16_decode_s = j.at("bf16_decode_s").get<double>();
    p.int8_decode_s = j.at("int8_decode_s").get<double>();
    p.bf16_step_s = j.at("bf16_step_s").get<double>();
    p.int8_step_s = j.at("int8_step_s").get<double>();
    p.bf16_batched_s = j.at("bf16_batched_s").get<double>();
    p.int8_batched_s = j.at("int8_batched_s").get<double>();
    return p;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

nlohmann::json read_cache(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

// Best effort: a temporary in the same folder, then a rename, so a reader never sees half a file.
void write_cache(const std::filesystem::path& file, const nlohmann::json& entries) {
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) return;
  const std::filesystem::path tmp = file.string() + fmt::format(".tmp{}", static_cast<long>(getpid()));
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return;
    out << entries.dump(2) << '\n';
    if (!out.flush()) {
      out.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

// Each rebuilt executable adds its own entries: the file keeps the newest kMaxEntries ("written", seconds).
constexpr size_t kMaxEntries = 64;
void prune_oldest(nlohmann::json& entries) {
  const auto written = [](const nlohmann::json& entry) {
    const auto it = entry.is_object() ? entry.find("written") : entry.end();
    return it != entry.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
  };
  while (entries.size() > kMaxEntries) {
    auto oldest = entries.begin();
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (written(it.value()) < written(oldest.value())) oldest = it;
    }
    entries.erase(oldest);
  }
}

struct Measured {
  kernels::PrecisionProbe probe;
  bool from_cache = false;
};

Measured measure_or_recall(int threads, std::array<int64_t, 2> shape) {
  static std::mutex mutex;
  static std::map<std::string, Measured> in_process;
  const std::lock_guard<std::mutex> lock(mutex);
  const std::string key = precision_cache_key(threads, shape);
  if (const auto it = in_process.find(key); it != in_process.end()) return it->second;
  const std::filesystem::path file = precision_cache_file();
  nlohmann::json entries = file.empty() ? nlohmann::json::object() : read_cache(file);
  if (entries.contains(key)) {
    if (const auto cached = probe_from_json(entries[key])) return in_process[key] = Measured{*cached, true};
  }
  const kernels::PrecisionProbe probe = kernels::probe_activation_precision(shape[0], shape[1]);
  if (!file.empty()) {
    entries[key] = probe_to_json(probe);
    entries[key]["written"] = static_cast<int64_t>(std::time(nullptr));
    prune_oldest(entries);
    write_cache(file, entries);
  }
  return in_process[key] = Measured{probe, false};
}

}  // namespace

std::string precision_cache_key(int threads, std::array<int64_t, 2> probe_shape) {
  // AMX in the key: FP4SERVE_AMX=off (or a kernel that loses the tile permission) measures bf16 anew.
  static const std::string machine = cpu_model_name() + " | " + executable_identity() + " | " +
                                     kernels::gemm_target_name() + (kernels::amx_active() ? " | AMX" : "");
  return fmt::format("{} | {} threads | [{}, {}]", machine, threads, probe_shape[0], probe_shape[1]);
}

std::string executable_identity() {
  struct stat st{};
  if (stat("/proc/self/exe", &st) != 0) return "unknown executable";
  return fmt::format("{} bytes, modified {}.{:09}", static_cast<long long>(st.st_size),
                     static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec));
}

std::filesystem::path cache_directory() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  std::filesystem::path dir;
  if (!env("FP4SERVE_CACHE_DIR").empty()) {
    dir = env("FP4SERVE_CACHE_DIR");
  } else if (!env("XDG_CACHE_HOME").empty()) {
    dir = std::filesystem::path(env("XDG_CACHE_HOME")) / "fp4serve";
  } else if (!env("HOME").empty()) {
    dir = std::filesystem::path(env("HOME")) / ".cache" / "fp4serve";
  }
  return dir;
}

std::filesystem::path precision_cache_file() {
  const std::filesystem::path dir = cache_directory();
  return dir.empty() ? dir : dir / "activation-precision.json";
}

ActivationPrecisionChoice choose_activation_precision(std::optional<ActivationPrecision> choice, plan::DeviceKind device,
                                                      const std::string& model_dtype, std::array<int64_t, 2> probe_shape,
                                                      bool emulating) {
  if (choice) return {*choice, "set by --activation-precision"};
  if (device != plan::DeviceKind::Cpu) return {ActivationPrecision::Fp32, "auto: the GPU runs fp32 activations"};
  if (emulating) {
    return {ActivationPrecision::Fp32, "auto: --activation-quant emulate runs the numerical reference (fp32 activations)"};
  }
  if (!kernels::bf16_dot_active()) {
    return {ActivationPrecision::Fp32, "auto: this CPU has no AVX512-BF16 dot products (bf16 would only add a rounding)"};
  }
  if (model_dtype != "bfloat16") {
    return {ActivationPrecision::Fp32,
            fmt::format("auto: the checkpoint's dtype is {}, not bfloat16", model_dtype.empty() ? "unset" : model_dtype)};
  }
  const int threads = core::num_threads();
  const Measured m = measure_or_recall(threads, probe_shape);
  const kernels::PrecisionProbe& probe = m.probe;
  if (!probe.measured) return {probe.choice, "auto: this CPU has no SIMD int8 kernel to compare with bf16"};
  return {probe.choice,
          fmt::format("auto, measured on this CPU ({} thread{}, an NVFP4 layer [{}, {}], CPU time): int8 {:.3f} ms "
                      "against bf16{} {:.3f} ms at 16 rows, {:.3f} against {:.3f} at 64, ratio {:.2f} (geometric mean; "
                      "{} the 0.80 margin); decode rows stay bf16{}",
                      threads, threads == 1 ? "" : "s", probe.out_features, probe.in_features,
                      1e3 * probe.int8_step_s, kernels::amx_active() ? " on AMX tiles" : "", 1e3 * probe.bf16_step_s,
                      1e3 * probe.int8_batched_s, 1e3 * probe.bf16_batched_s, probe.int8_ratio(),
                      probe.choice == ActivationPrecision::Bf16DecodeInt8 ? "within" : "above",
                      m.from_cache ? fmt::format("; kept from an earlier run in {} (delete it to measure again)",
                                                 precision_cache_file().string())
                                   : "")};
}

ActivationPrecisionChoice choose_int4_activation_precision(std::optional<ActivationPrecision> choice, plan::DeviceKind device,
                                                           ActivationPrecision fp4, bool emulating) {
  if (choice) {
    const bool bf16 = *choice == ActivationPrecision::Bf16 || *choice == ActivationPrecision::Bf16DecodeInt8;
    return {*choice, bf16 ? "set by --activation-precision (int4's bf16 rows: bf16 dot products on (q - z)*s rounded "
                            "to bf16 where the CPU has AVX512-BF16 and K is a multiple of 16, else fp32 x)"
                          : "set by --activation-precision"};
  }
  if (device != plan::DeviceKind::Cpu) return {fp4, "auto: as the FP4 linears (the GPU)"};
  if (emulating) return {fp4, "auto: as the FP4 linears (--activation-quant emulate runs the numerical reference)"};
  if (!kernels::int8_kernel_active()) return {fp4, "auto: as the FP4 linears (this CPU has no SIMD int8 kernel)"};
  return {ActivationPrecision::Int8,
          "auto: int8 activations run it about 3x faster than fp32 ones and faster than bf16 dot products (Zen 4: "
          "about 2x per GEMM, prefill 1.1x, decode 1.9x), within the 1e-3 mean-KLD bar (docs/performance.md)"};
}

ActivationPrecision resolve_activation_precision(std::optional<ActivationPrecision> choice, plan::DeviceKind device,
                                                 const std::string& model_dtype, std::array<int64_t, 2> probe_shape,
                                                 bool emulating) {
  return choose_activation_precision(choice, device, model_dtype, probe_shape, emulating).precision;
}

std::array<int64_t, 2> activation_probe_shape(const ModelConfig& config) {
  return {std::max(config.intermediate_size, config.hidden_size), config.hidden_size};
}

}  // namespace fp4serve::model
