// SPDX-License-Identifier: Apache-2.0
#include "runtime/perplexity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fp4serve/error.h"
#include "backends/cpu/kernels/softmax.h"

namespace fp4serve::runtime {
namespace {

// log-softmax of one row in double precision.
void log_softmax(const float* logits, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  const float max_logit = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_sum = std::log(sum) + max_logit;
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - log_sum;
}

// Logits of the window's rows first_row … size − 1 (the rows whose predictions are scored).
std::vector<float> window_logits(const model::ForwardModel& decoder, model::KvCache& cache, std::span<const int32_t> window,
                                 int64_t first_row) {
  const int slot = cache.acquire();
  model::SequenceChunk chunk{slot, 0, window, true, first_row};
  std::vector<float> logits = decoder.forward(std::span(&chunk, 1), cache);
  cache.release(slot);
  return logits;
}

}  // namespace

PerplexityResult perplexity(const model::ForwardModel& decoder, const model::ForwardModel* base, std::span<const int32_t> tokens,
                            const PerplexityOptions& options, const std::function<void(int64_t, int64_t)>& progress) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n < 2) throw UsageError(fmt::format("perplexity: need at least 2 tokens, got {}", n));
  if (options.stride <= 0 || options.stride > options.context) {
    throw UsageError(fmt::format("perplexity: stride {} must be in [1, context {}]", options.stride, options.context));
  }
  const int64_t vocab = decoder.config().vocab_size;
  if (base != nullptr && base->config().vocab_size != vocab) {
    throw UsageError(fmt::format("perplexity: base vocabulary {} differs from the model's {}", base->config().vocab_size, vocab));
  }
  model::KvCache cache = decoder.make_cache(options.context, 1);
  std::optional<model::KvCache> base_cache;
  if (base != nullptr) base_cache.emplace(base->make_cache(options.context, 1));

  PerplexityResult result;
  double nll = 0.0, base_nll = 0.0, kld = 0.0;
  int64_t agree = 0;
  std::vector<double> lp, lq;
  int64_t previous_end = 0;
  std::vector<int64_t> starts;
  for (int64_t b = 0; b < n; b += options.stride) {
    starts.push_back(b);
    if (b + options.context >= n) break;
  }
  for (size_t w = 0; w < starts.size(); ++w) {
    const int64_t begin = starts[w];
    const int64_t end = std::min(begin + options.context, n);
    const std::span<const int32_t> window = tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    // Token at absolute index i (previous_end ≤ i < end, i ≥ 1) is predicted by the window row i − 1 − begin;
    // only rows from first_row on are scored, so only they get logits (the lm_head of the rest is skipped).
    const int64_t first_scored = std::max<int64_t>(previous_end, begin + 1);
    const int64_t first_row = first_scored - 1 - begin;
    const std::vector<float> logits = window_logits(decoder, cache, window, first_row);
    std::vector<float> base_logits;
    if (base != nullptr) base_logits = window_logits(*base, *base_cache, window, first_row);
    for (int64_t i = first_scored; i < end; ++i) {
      const int64_t row = i - 1 - begin - first_row;
      const int32_t target = tokens[static_cast<size_t>(i)];
      const float* q_row = logits.data() + row * vocab;
      if (base == nullptr) {
        // log_softmax at the target only: the logit minus the log-sum-exp of the row.
        nll -= static_cast<double>(q_row[target]) - kernels::log_sum_exp(q_row, vocab);
      } else {
        log_softmax(q_row, vocab, lq);
        nll -= lq[static_cast<size_t>(target)];
        log_softmax(base_logits.data() + row * vocab, vocab, lp);
        base_nll -= lp[static_cast<size_t>(target)];
        double k = 0.0;
        for (int64_t v = 0; v < vocab; ++v) {
          const double p = std::exp(lp[static_cast<size_t>(v)]);
          k += p * (lp[static_cast<size_t>(v)] - lq[static_cast<size_t>(v)]);
        }
        kld += k;
        const auto argmax = [&](const std::vector<double>& x) { return std::max_element(x.begin(), x.end()) - x.begin(); };
        agree += argmax(lp) == argmax(lq) ? 1 : 0;
      }
      ++result.tokens_scored;
    }
    previous_end = end;
    if (progress) progress(static_cast<int64_t>(w + 1), static_cast<int64_t>(starts.size()));
  }
  const auto scored = static_cast<double>(result.tokens_scored);
  result.perplexity = std::exp(nll / scored);
  if (base != nullptr) {
    result.base_perplexity = std::exp(base_nll / scored);
    result.mean_kld = kld / scored;
    result.top1_agreement = static_cast<double>(agree) / scored;
  }
  return result;
}

}  // namespace fp4serve::runtime
