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

ActivationQuant parse_activation_quant(std::string_view text) {
  if (text == "auto") return ActivationQuant::Auto;
  if (text == "weight-only") return ActivationQuant::WeightOnly;
  if (text == "emulate") return ActivationQuant::Emulate;
  throw UsageError(fmt::format("--activation-quant '{}' is not one of auto, weight-only, emulate", text));
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
  const bool weight_only = mode == ActivationQuant::WeightOnly;
  switch (variant) {
    case Variant::Nvfp4W4A4:
      if (weight_only) return {SchemeId::W4A16Nvfp4};
      if (mode == ActivationQuant::Emulate) return {SchemeId::W4A4Nvfp4Emulated};
      return {SchemeId::W4A4Nvfp4, SchemeId::W4A16Nvfp4};
    case Variant::Nvfp4W4A16: return {SchemeId::W4A16Nvfp4};  // never made W4A4 (rule 3)
    case Variant::Mxfp4W4A4:
      if (weight_only) return {SchemeId::W4A16Mxfp4};
      if (mode == ActivationQuant::Emulate) return {SchemeId::W4A4Mxfp4Emulated};
      return {SchemeId::W4A4Mxfp4, SchemeId::W4A16Mxfp4};
    case Variant::Mxfp4W4A16: return {SchemeId::W4A16Mxfp4};
    case Variant::Int4W4A16: return {SchemeId::W4A16Int4};
    case Variant::Fp8W8A8:
      if (weight_only) return {SchemeId::W8A16Fp8};
      if (mode == ActivationQuant::Emulate) return {};  // no FP8 activation emulation: refused, never substituted
      return {SchemeId::W8A8Fp8, SchemeId::W8A16Fp8};
    case Variant::Fp8W8A16: return {SchemeId::W8A16Fp8};
    case Variant::Unquantized: return {SchemeId::Unquantized};
  }
  return {};
}

Selection select_scheme(Variant variant, const DeviceCaps& device, ActivationQuant mode) {
  Selection s;
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
    std::string why;
    if (scheme_supported(candidates[i], device, &why)) {
      chosen = i;
      break;
    }
    s.rejected.push_back({candidates[i], why});
  }
  if (chosen == candidates.size()) {
    s.reason = Reason::DeviceTooOld;
    s.reason_text = fmt::format("no scheme for {} on {}: {}", variant_name(variant), device.label(),
                                s.rejected.empty() ? "no candidate" : s.rejected.back().why);
    return s;
  }
  const SchemeId id = candidates[chosen];
  s.scheme = id;
  const bool acts = variant_has_activation_quant(variant);
  if (chosen > 0) {  // a downgrade: the first candidate is what the checkpoint describes
    switch (variant) {
      case Variant::Mxfp4W4A4:
        if (device.has_nvfp4_mma()) {
          s.reason = Reason::NoMxfp4W4A4;
          s.reason_text = fmt::format("MXFP4 W4A4 checkpoint served weight-only: {} has FP4 matrix units but fp4serve has "
                                      "no MXFP4-activation kernel for it; the activations stay 16-bit", device.label());
          return s;
        }
        [[fallthrough]];
      case Variant::Nvfp4W4A4:
        s.reason = Reason::NoFp4MatrixUnits;
        // NVFP4 stores input global scales (validated, then dropped); MXFP4 activation scales are dynamic.
        s.reason_text = fmt::format("W4A4 checkpoint served weight-only: this device has no FP4 matrix units ({}); {}",
                                    device.label(), variant == Variant::Nvfp4W4A4
                                                        ? "input global scales are validated and dropped"
                                                        : "activations stay 16-bit (MXFP4 stores no activation scales)");
        return s;
      case Variant::Fp8W8A8:
        s.reason = Reason::NoFp8MatrixUnits;
        s.reason_text = fmt::format("FP8 W8A8 checkpoint served W8A16: this device has no FP8 matrix units ({}); "
                                    "static input scales, if stored, are validated and dropped", device.label());
        return s;
      case Variant::Unquantized:
      case Variant::Nvfp4W4A16:
      case Variant::Mxfp4W4A16:
      case Variant::Int4W4A16:
      case Variant::Fp8W8A16:
        break;  // single-candidate variants never downgrade
    }
  }
  if (id == SchemeId::Unquantized) {
    s.reason = Reason::NotQuantized;
    s.reason_text = "not quantized";
  } else if (mode == ActivationQuant::WeightOnly && acts) {
    s.reason = Reason::UserWeightOnly;
    s.reason_text = "--activation-quant weight-only: activations stay 16-bit; stored activation scales are validated "
                    "and dropped";
  } else if (id == SchemeId::W4A4Nvfp4Emulated) {
    s.reason = Reason::Emulated;
    s.reason_text = "--activation-quant emulate: activations quantized to NVFP4 and dequantized as the reference does";
  } else if (id == SchemeId::W4A4Mxfp4Emulated) {
    s.reason = Reason::Emulated;
    s.reason_text = "--activation-quant emulate: activations quantized to MXFP4 (E8M0 per 32) and dequantized as the "
                    "reference does";
  } else if (id == SchemeId::W4A4Nvfp4 || id == SchemeId::W4A4Mxfp4) {
    s.reason = Reason::NativeW4A4;
    s.reason_text = fmt::format("{} has FP4 matrix units; activations quantized at run time", device.label());
  } else if (id == SchemeId::W8A8Fp8) {
    s.reason = Reason::NativeFp8;
    s.reason_text = fmt::format("{} has FP8 matrix units", device.label());
  } else {
    s.reason = Reason::WeightOnlyByDesign;
    s.reason_text = "weight-only by design: the checkpoint has no activation scales";
  }
  return s;
}

}  // namespace fp4serve::plan
