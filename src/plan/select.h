// SPDX-License-Identifier: Apache-2.0
// Scheme selection for one layer: candidates for the checkpoint variant in preference order → the first one the
// target device's kernel catalogue (kernel_catalogue.h) runs, with the reason, the kernel and every rejected
// candidate. Implements the decision table of docs/SCHEMES.md; per-layer wiring (fused groups, warnings,
// contracts) is in layer_plan.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/device_caps.h"
#include "plan/kernel_catalogue.h"
#include "plan/scheme.h"

namespace fp4serve::plan {

/// `--activation-quant` (SCHEMES.md rule 9).
enum class ActivationQuant : uint8_t {
  Auto,        ///< follow the decision table
  WeightOnly,  ///< serve W4A4/W8A8 checkpoints weight-only (their activation scales are validated, then dropped)
  Emulate,     ///< W4A4 layers run W4A4_NVFP4_EMULATED / W4A4_MXFP4_EMULATED (the numerical reference) on any
               ///< device; a layer whose activation format has no emulation (FP8 W8A8) gets no scheme
};
std::string_view activation_quant_name(ActivationQuant a);  ///< "auto", "weight-only", "emulate"

/// Why a layer runs the scheme it runs. Stable codes for tests and JSON; the text is in Selection::reason_text.
enum class Reason : uint8_t {
  NativeW4A4,          ///< the device has the FP4 matrix units the checkpoint's W4A4 format needs
  NoFp4MatrixUnits,    ///< W4A4 checkpoint served weight-only: the device has no FP4 matrix units (warning)
  NoMxfp4W4A4,         ///< MXFP4 W4A4 on sm120: FP4 units, but no MXFP4-activation kernel (warning)
  NoFp8MatrixUnits,    ///< FP8 W8A8 checkpoint served W8A16: no FP8 matrix units (warning)
  NativeFp8,           ///< FP8 W8A8 on FP8 matrix units
  WeightOnlyByDesign,  ///< the checkpoint has no activation scales (NVFP4A16, MXFP4A16, int4 W4A16, FP8 weight-only)
  UserWeightOnly,      ///< --activation-quant weight-only on a checkpoint with activation quant
  Emulated,            ///< --activation-quant emulate on an NVFP4 or MXFP4 W4A4 checkpoint
  EmulateNotAvailable, ///< --activation-quant emulate on FP8 W8A8: no emulated scheme, the layer has none (refused)
  NotQuantized,        ///< ignored, excluded, not targeted, not listed, or a plain checkpoint
  DeviceTooOld,        ///< no scheme: below sm80
  NoKernel,            ///< no scheme: the device's catalogue has no kernel for any candidate (e.g. int4 on a GPU)
  OnlineTransform,     ///< no scheme: an online transform the module cannot run (q_attn / k_cache on a Linear, one
                       ///< on the embedding or on fused 3-D experts, two at one location)
};
std::string_view reason_code(Reason r);

/// True for the reasons that are logged as warnings (a layer runs slower or differently than its checkpoint
/// describes).
bool reason_is_warning(Reason r);

struct RejectedCandidate {
  SchemeId scheme;
  std::string why;
};

struct Selection {
  std::optional<SchemeId> scheme;  ///< nullopt: no scheme runs this layer on this device
  KernelChoice kernel;             ///< the catalogue's kernel for `scheme` (refused when scheme is nullopt)
  Reason reason = Reason::NotQuantized;
  std::string reason_text;
  std::vector<RejectedCandidate> rejected;
};

/// Candidates in preference order for `variant` under `mode` (first = what the checkpoint describes); empty for
/// `emulate` on a variant without an emulation.
std::vector<SchemeId> scheme_candidates(Variant variant, ActivationQuant mode);

/// Chooses the scheme for one layer: the first candidate for which `catalogue` names a kernel for `shape` (its
/// `scheme` field is overwritten per candidate). Never throws; a layer nothing can run gets scheme = nullopt and
/// Reason::DeviceTooOld (below sm80), Reason::NoKernel (the catalogue refused every candidate), or
/// Reason::EmulateNotAvailable when `emulate` was asked for a layer without emulation.
Selection select_scheme(Variant variant, const KernelCatalogue& catalogue, ActivationQuant mode, LinearQuery shape);

}  // namespace fp4serve::plan
