// SPDX-License-Identifier: Apache-2.0
#include "plan/select.h"

#include <fmt/format.h>

#include "fp4serve/error.h"

namespace fp4serve::plan {

std::string_view activation_quant_name(ActivationQuant a) {
  switch (a) {
    case ActivationQuant::Auto: return "auto";
    case ActivationQuant::WeightOnly: return "weight-only";
    case ActivationQuant::Emulate: return "emulate";
  }
  return "?";
}

std::string_view reason_code(Reason r) {
  switch (r) {
    case Reason::NativeW4A4: return "native-w4a4";
    case Reason::NoFp4MatrixUnits: return "no-fp4-matrix-units";
    case Reason::NoMxfp4W4A4: return "no-mxfp4-w4a4-kernel";
    case Reason::NoFp8MatrixUnits: return "no-fp8-matrix-units";
    case Reason::NativeFp8: return "native-fp8";
    case Reason::WeightOnlyByDesign: return "weight-only-checkpoint";
    case Reason::UserWeightOnly: return "user-weight-only";
    case Reason::Emulated: return "emulated";
    case Reason::EmulateNotAvailable: return "emulate-not-available";
    case Reason::NotQuantized: return "not-quantized";
    case Reason::DeviceTooOld: return "device-too-old";
    case Reason::NoKernel: return "no-kernel";
    case Reason::OnlineTransform: return "online-transform";
  }
  return "?";
}

bool reason_is_warning(Reason r) {
  switch (r) {
    case Reason::NoFp4MatrixUnits:
    case Reason::NoMxfp4W4A4:
    case Reason::NoFp8MatrixUnits:
    case Reason::UserWeightOnly:
    case Reason::EmulateNotAvailable:
    case Reason::DeviceTooOld:
    case Reason::NoKernel:
    case Reason::OnlineTransform:
      return true;
    case Reason::NativeW4A4:
    case Reason::NativeFp8:
    case Reason::WeightOnlyByDesign:
    case Reason::Emulated:
    case Reason::NotQuantized:
      return false;
  }
  return false;
}

std::vector<SchemeId> scheme_candidates(Variant variant, ActivationQuant mode) {
  const VariantTraits& v = variant_traits(variant);
  // Every quantized kind has a weight-only scheme; Unquantized's row is its own "weight-only" one.
  const SchemeId weight_only = *find_scheme(v.weights, v.block, ActivationMode::None);
  if (!v.activations || mode == ActivationQuant::WeightOnly) return {weight_only};  // never made W4A4 (rule 3)
  if (mode == ActivationQuant::Emulate) {
    // No emulation for a kind (FP8) is refused, never substituted.
    const std::optional<SchemeId> emulated = find_scheme(v.weights, v.block, ActivationMode::Emulated);
    return emulated ? std::vector<SchemeId>{*emulated} : std::vector<SchemeId>{};
  }
  return {*find_scheme(v.weights, v.block, ActivationMode::Native), weight_only};
}

Selection select_scheme(Variant variant, const KernelCatalogue& catalogue, ActivationQuant mode, LinearQuery shape) {
  Selection s;
  const DeviceCaps& device = catalogue.device();
  const std::vector<SchemeId> candidates = scheme_candidates(variant, mode);
  if (candidates.empty()) {
    // Only `emulate` on a layer whose activation format has no emulation gets here: serving it weight-only or
    // natively instead would silently compute something other than what was asked.
    s.reason = Reason::EmulateNotAvailable;
    s.reason_text = fmt::format("--activation-quant emulate: fp4serve has no emulation of {} activations (emulated: "
                                "NVFP4 and MXFP4 W4A4); use --activation-quant auto or weight-only",
                                variant_name(variant));
    return s;
  }
  size_t chosen = candidates.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    shape.scheme = candidates[i];
    KernelChoice kernel = catalogue.linear(shape);
    if (kernel.ok()) {
      chosen = i;
      s.kernel = std::move(kernel);
      break;
    }
    s.rejected.push_back({candidates[i], kernel.why_not});
  }
  if (chosen == candidates.size()) {
    s.reason = device.runs_weight_only() ? Reason::NoKernel : Reason::DeviceTooOld;
    s.kernel = KernelChoice::refused(s.rejected.empty() ? "no candidate" : s.rejected.back().why);
    s.reason_text = fmt::format("no scheme for {} on {}: {}", variant_name(variant), device.label(), s.kernel.why_not);
    return s;
  }
  const SchemeId id = candidates[chosen];
  s.scheme = id;
  const bool acts = variant_has_activation_quant(variant);
  const VariantTraits& v = variant_traits(variant);
  if (chosen > 0) {  // a downgrade (only activation-quantized variants have two candidates): the first is native
    if (v.weights == WeightKind::Fp8) {
      s.reason = Reason::NoFp8MatrixUnits;
      s.reason_text = fmt::format("FP8 W8A8 checkpoint served W8A16: this device has no FP8 matrix units ({}); "
                                  "static input scales, if stored, are validated and dropped", device.label());
      return s;
    }
    const quant::BlockFormatTraits& f = quant::block_format_traits(*v.block);
    if (device.has_nvfp4_mma()) {  // FP4 units, but the catalogue has no kernel for this format's activations
      s.reason = Reason::NoMxfp4W4A4;
      s.reason_text = fmt::format("{} W4A4 checkpoint served weight-only: {}; the activations stay 16-bit", f.name,
                                  s.rejected.front().why);
      return s;
    }
    s.reason = Reason::NoFp4MatrixUnits;
    // A format with a global scale stores input global scales (validated, then dropped); MXFP4's are dynamic.
    s.reason_text = fmt::format("W4A4 checkpoint served weight-only: this device has no FP4 matrix units ({}); {}",
                                device.label(), f.global_scale ? "input global scales are validated and dropped"
                                                               : fmt::format("activations stay 16-bit ({} stores no "
                                                                             "activation scales)", f.name));
    return s;
  }
  if (id == SchemeId::Unquantized) {
    s.reason = Reason::NotQuantized;
    s.reason_text = "not quantized";
  } else if (mode == ActivationQuant::WeightOnly && acts) {
    s.reason = Reason::UserWeightOnly;
    s.reason_text = "--activation-quant weight-only: activations stay 16-bit; stored activation scales are validated "
                    "and dropped";
  } else if (scheme_traits(id).activations == ActivationMode::Emulated) {
    const quant::BlockFormatTraits& f = quant::block_format_traits(*scheme_traits(id).block);
    s.reason = Reason::Emulated;
    s.reason_text = fmt::format("--activation-quant emulate: activations quantized to {} ({} per {}) and dequantized "
                                "as the reference does", f.name, quant::format_traits(f.scale).name, f.group_size);
  } else if (scheme_traits(id).activations == ActivationMode::Native && scheme_traits(id).weights == WeightKind::Block) {
    s.reason = Reason::NativeW4A4;
    s.reason_text = fmt::format("{} has FP4 matrix units; activations quantized at run time", device.label());
  } else if (scheme_traits(id).activations == ActivationMode::Native) {
    s.reason = Reason::NativeFp8;
    s.reason_text = fmt::format("{} has FP8 matrix units", device.label());
  } else {
    s.reason = Reason::WeightOnlyByDesign;
    s.reason_text = "weight-only by design: the checkpoint has no activation scales";
  }
  return s;
}

}  // namespace fp4serve::plan
