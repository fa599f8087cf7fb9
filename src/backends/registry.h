// SPDX-License-Identifier: Apache-2.0
// The device → backend and device → kernel catalogue factories: the one place that knows which backends this build
// has. Each device's wing
// (backends/cpu, backends/cuda) implements model::Backend; load_model (load_model.h) and the tests make theirs
// here.
#pragma once

#include <memory>
#include <optional>

#include "backends/cpu/prepare/prepared_linear.h"
#include "backends/cpu/prepare/weight_cache.h"
#include "model/backend.h"
#include "model/kv_cache.h"
#include "plan/device_caps.h"
#include "plan/kernel_catalogue.h"

namespace fp4serve::backends {

/// The CPU backend (backends/cpu/cpu_backend.h); its KV caches store `kv_cache_dtype` elements (--kv-cache-dtype),
/// its FP4 layers multiply with `activation_precision` (--activation-precision), its int4 layers with
/// `int4_activation_precision` (model::choose_int4_activation_precision; absent: `activation_precision`).
/// With a `weight_cache` (prepare/weight_cache.h), its layers are mapped instead of repacked and the others stored.
std::unique_ptr<model::Backend> make_cpu_backend(
    model::KvCacheDtype kv_cache_dtype = model::KvCacheDtype::F32,
    prepare::ActivationPrecision activation_precision = prepare::ActivationPrecision::Fp32,
    std::shared_ptr<prepare::WeightCache> weight_cache = nullptr,
    std::optional<prepare::ActivationPrecision> int4_activation_precision = std::nullopt);

/// The CUDA backend on GPU `ordinal` (backends/cuda/cuda_backend.h). Throws UnsupportedError when this build has no
/// CUDA backend, UsageError (the no-GPU message) when no usable GPU is found.
std::unique_ptr<model::Backend> make_cuda_backend(int ordinal = 0);

/// The kernel catalogue of `device` (plan/kernel_catalogue.h): the CPU's (backends/cpu/catalogue.h) for a CPU, the
/// CUDA backend's (backends/cuda/catalogue.h) for a detected GPU or a `--device smNN` dry run. `explain` and
/// load_model both plan with it, so they give one answer. A detected GPU in a build without the CUDA backend gets
/// a catalogue that refuses everything (saying so); a dry run answers as a CUDA build would. Never throws.
std::unique_ptr<plan::KernelCatalogue> catalogue_for(const plan::DeviceCaps& device);

}  // namespace fp4serve::backends
