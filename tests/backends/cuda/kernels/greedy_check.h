// SPDX-License-Identifier: Apache-2.0
// Near-tie aware comparison of greedy decoding between a reference (the CPU decoder) and a candidate (the GPU
// decoder), for tests. The GPU's GEMMs read bf16 activations where the CPU reads fp32, so two logits that differ
// by less than that rounding can swap order: an argmax mismatch there is a tie, not a kernel bug. Rule (issue
// 21): at each step the candidate's argmax is compared with the reference's; on a mismatch the margin is
//   margin = ref[ref_argmax] − ref[candidate_argmax]   (≥ 0: how much the reference prefers its own token)
// and the step fails only when margin > tie_tolerance · max|ref logit| (tie_tolerance = 1e-3 by default).
// Callers teacher-force: both models are fed the reference's token, so one tie does not derail the rest.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace fp4serve::testing {

struct GreedyStep {
  int32_t want = 0;        ///< argmax of the reference logits
  int32_t got = 0;         ///< argmax of the candidate logits
  double margin = 0;       ///< ref[want] − ref[got] (0 when they agree)
  double max_abs = 0;      ///< max |ref logit|
  bool failed = false;     ///< got ≠ want and margin > tie_tolerance · max_abs
};

inline int32_t argmax_of(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

/// One step of the comparison; `ref` and `got` are the logits of one position (same vocabulary size, non-empty).
inline GreedyStep compare_greedy_step(std::span<const float> ref, std::span<const float> got,
                                      double tie_tolerance = 1e-3) {
  GreedyStep s;
  s.want = argmax_of(ref);
  s.got = argmax_of(got);
  for (const float v : ref) s.max_abs = std::max(s.max_abs, std::fabs(static_cast<double>(v)));
  if (s.got != s.want) {
    s.margin = static_cast<double>(ref[static_cast<size_t>(s.want)]) - ref[static_cast<size_t>(s.got)];
    s.failed = !(s.margin <= tie_tolerance * s.max_abs);  // NaN logits fail too
  }
  return s;
}

/// Summary of a run of steps: how many agreed, how many were ties within tolerance, how many failed, and one line
/// per mismatch ("step 3: want 17 got 912 margin 1.2e-04 = 3.1e-05 of max|logit|").
struct GreedySummary {
  int agreed = 0;
  int ties = 0;
  int failed = 0;
  double worst_relative_margin = 0;  ///< max margin / max|logit| over the mismatches
  std::string report;
};

inline GreedySummary summarize_greedy(const std::vector<GreedyStep>& steps) {
  GreedySummary out;
  std::ostringstream text;
  text.precision(2);
  for (size_t i = 0; i < steps.size(); ++i) {
    const GreedyStep& s = steps[i];
    if (s.got == s.want) {
      ++out.agreed;
      continue;
    }
    const double relative = s.max_abs > 0 ? s.margin / s.max_abs : s.margin;
    out.worst_relative_margin = std::max(out.worst_relative_margin, relative);
    (s.failed ? out.failed : out.ties) += 1;
    text << std::scientific << "step " << i << ": want " << s.want << " got " << s.got << " margin " << s.margin
         << " = " << relative << " of max|logit|" << (s.failed ? " FAIL" : " (near tie)") << "\n";
  }
  out.report = text.str();
  return out;
}

}  // namespace fp4serve::testing
