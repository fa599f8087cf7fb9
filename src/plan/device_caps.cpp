// SPDX-License-Identifier: Apache-2.0
#include "plan/device_caps.h"

#include <dlfcn.h>
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <fmt/format.h>

#include <vector>

#include "fp4serve/error.h"

namespace fp4serve::plan {

std::string DeviceCaps::label() const {
  if (kind == DeviceKind::Cpu) return "cpu";
  return fmt::format("sm{}", sm);
}

DeviceCaps detect_cpu() {
  DeviceCaps caps;
  caps.kind = DeviceKind::Cpu;
  caps.detected = true;
  std::vector<std::string_view> flags;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports needs string literals; one line per feature keeps the mapping visible.
  caps.cpu.avx2 = __builtin_cpu_supports("avx2");
  caps.cpu.fma = __builtin_cpu_supports("fma");
  caps.cpu.avx512f = __builtin_cpu_supports("avx512f");
  caps.cpu.avx512bw = __builtin_cpu_supports("avx512bw");
  caps.cpu.avx512vnni = __builtin_cpu_supports("avx512vnni");
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  caps.cpu.f16c = __builtin_cpu_supports("f16c");
  caps.cpu.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  caps.cpu.amx_bf16 = __builtin_cpu_supports("amx-bf16");
#endif
  const std::pair<bool, std::string_view> named[] = {
      {caps.cpu.avx2, "avx2"},         {caps.cpu.fma, "fma"},           {caps.cpu.f16c, "f16c"},
      {caps.cpu.avx512f, "avx512f"},   {caps.cpu.avx512bw, "avx512bw"}, {caps.cpu.avx512vnni, "avx512vnni"},
      {caps.cpu.avx512bf16, "avx512bf16"}, {caps.cpu.amx_bf16, "amx-bf16"}};
  for (const auto& [on, name] : named) {
    if (on) flags.push_back(name);
  }
  caps.name = fmt::format("x86-64 CPU ({})", flags.empty() ? "baseline" : fmt::format("{}", fmt::join(flags, " ")));
#elif defined(__aarch64__)
  caps.cpu.neon = true;  // mandatory on AArch64
  caps.cpu.sve = (getauxval(AT_HWCAP) & HWCAP_SVE) != 0;
  caps.name = caps.cpu.sve ? "arm64 CPU (neon sve)" : "arm64 CPU (neon)";
#else
  caps.name = "CPU";
#endif
  return caps;
}

std::optional<DeviceCaps> detect_cuda() {
  // The driver API has a stable C ABI; loading it at run time keeps the binary free of a CUDA dependency and
  // lets a CPU-only build report the GPU in `explain`. Attribute ids 75/76 are
  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR/MINOR (cuda.h).
  // The handle is opened once and never closed: after cuInit the driver keeps threads and callbacks that point
  // into the library, so unloading it (dlclose) can crash the process later, at the next CUDA call or at exit.
  static void* const lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) return std::nullopt;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using AttrFn = int (*)(int*, int, int);
  using NameFn = int (*)(char*, int, int);
  using MemFn = int (*)(size_t*, int);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
  auto attr = reinterpret_cast<AttrFn>(dlsym(lib, "cuDeviceGetAttribute"));
  auto name_fn = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
  auto mem = reinterpret_cast<MemFn>(dlsym(lib, "cuDeviceTotalMem_v2"));
  std::optional<DeviceCaps> result;
  int n = 0;
  int dev = 0;
  int major = 0;
  int minor = 0;
  if (init != nullptr && count != nullptr && get != nullptr && attr != nullptr && init(0) == 0 && count(&n) == 0 &&
      n > 0 && get(&dev, 0) == 0 && attr(&major, 75, dev) == 0 && attr(&minor, 76, dev) == 0) {
    DeviceCaps caps;
    caps.kind = DeviceKind::Cuda;
    caps.sm = major * 10 + minor;
    caps.detected = true;
    char name[256] = {};
    caps.name = (name_fn != nullptr && name_fn(name, sizeof(name) - 1, dev) == 0) ? name : "CUDA device";
    size_t bytes = 0;
    if (mem != nullptr && mem(&bytes, dev) == 0) caps.memory_bytes = bytes;
    result = caps;
  }
  return result;
}

std::string_view device_choice_name(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::Auto: return "auto";
    case DeviceChoice::Cpu: return "cpu";
    case DeviceChoice::Cuda: return "cuda";
  }
  return "?";
}

DeviceCaps resolve_device(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::Auto:
      if (auto gpu = detect_cuda()) return *gpu;
      return detect_cpu();
    case DeviceChoice::Cpu: return detect_cpu();
    case DeviceChoice::Cuda:
      if (auto gpu = detect_cuda()) return *gpu;
      // The advice holds for every command that names a device: `generate` takes cpu and auto, not a dry run.
      throw UsageError("--device cuda: no CUDA device was found (no libcuda.so.1 or no GPU); run on the CPU with "
                       "--device cpu (or --device auto: the GPU when one is found), or see a GPU's plan without one "
                       "with `fp4serve explain MODEL --device sm90`");
  }
  throw UsageError("resolve_device: not a DeviceChoice");
}

DeviceCaps dry_run_device(int sm) {
  if (sm < 10 || sm > 199) throw UsageError(fmt::format("dry-run device sm{}: compute capability outside sm10 … sm199", sm));
  DeviceCaps caps;
  caps.kind = DeviceKind::Cuda;
  caps.sm = sm;
  caps.name = fmt::format("sm{} (dry run)", sm);
  caps.cpu = detect_cpu().cpu;
  return caps;
}

}  // namespace fp4serve::plan
