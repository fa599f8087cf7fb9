// SPDX-License-Identifier: Apache-2.0
#include "runtime/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "fp4serve/error.h"

namespace fp4serve::runtime {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f)) throw UsageError(fmt::format("temperature must be ≥ 0, got {}", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f)) throw UsageError(fmt::format("top_p must be in (0, 1], got {}", top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) throw UsageError(fmt::format("min_p must be in [0, 1], got {}", min_p));
  if (!(repetition_penalty > 0.0f)) {
    throw UsageError(fmt::format("repetition_penalty must be > 0, got {}", repetition_penalty));
  }
  if (!(std::fabs(presence_penalty) <= 2.0f)) {
    throw UsageError(fmt::format("presence_penalty must be in [-2, 2], got {}", presence_penalty));
  }
  if (!(std::fabs(frequency_penalty) <= 2.0f)) {
    throw UsageError(fmt::format("frequency_penalty must be in [-2, 2], got {}", frequency_penalty));
  }
}

SamplingParams sampling_defaults(const nlohmann::json& g) {
  SamplingParams p;
  if (!g.is_object()) return p;
  auto number = [&](const char* key, float fallback) {
    return g.contains(key) && g[key].is_number() ? g[key].get<float>() : fallback;
  };
  const bool do_sample = g.contains("do_sample") && g["do_sample"].is_boolean() && g["do_sample"].get<bool>();
  p.temperature = do_sample ? number("temperature", 1.0f) : 0.0f;
  p.top_k = g.contains("top_k") && g["top_k"].is_number_integer() ? g["top_k"].get<int>() : 0;
  p.top_p = number("top_p", 1.0f);
  p.min_p = number("min_p", 0.0f);
  p.repetition_penalty = number("repetition_penalty", 1.0f);
  return p;
}

ServingDefaults serving_defaults(const nlohmann::json& g) {
  ServingDefaults out;
  if (!g.is_object()) return out;
  // transformers' GenerationConfig defaults: to_diff_dict leaves out a field equal to them, so vLLM never sees it.
  const auto take_number = [&](const char* key, float transformers_default, float& field) {
    const auto it = g.find(key);
    if (it == g.end() || !it->is_number()) return;
    const float v = it->get<float>();
    if (v == transformers_default) return;
    field = v;
    out.taken.push_back(fmt::format("{}={}", key, v));
  };
  take_number("temperature", 1.0f, out.sampling.temperature);
  if (const auto it = g.find("top_k"); it != g.end() && it->is_number_integer() && it->get<int>() != 50) {
    out.sampling.top_k = it->get<int>();
    out.taken.push_back(fmt::format("top_k={}", out.sampling.top_k));
  }
  take_number("top_p", 1.0f, out.sampling.top_p);
  take_number("min_p", std::numeric_limits<float>::quiet_NaN(), out.sampling.min_p);  // unset by default: any value
  take_number("repetition_penalty", 1.0f, out.sampling.repetition_penalty);
  if (const auto it = g.find("max_new_tokens"); it != g.end() && it->is_number_integer() && it->get<int64_t>() > 0) {
    out.max_tokens = it->get<int64_t>();
    out.taken.push_back(fmt::format("max_new_tokens={}", *out.max_tokens));
  }
  out.sampling.validate();  // a config with temperature -1 or top_p 0 is refused at start-up, not per request
  return out;
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  params_.validate();
  seed_ = params_.seed ? *params_.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

void Sampler::observe_prompt(std::span<const int32_t> tokens) { seen_.insert(tokens.begin(), tokens.end()); }

void Sampler::observe(int32_t token) {
  ++observed_;
  seen_.insert(token);
  output_counts_[token] += 1;
}

void Sampler::prepare(std::span<float> logits) const {
  const auto vocab = static_cast<int32_t>(logits.size());
  // A NaN would break the strict weak ordering std::sort relies on (undefined behaviour, out-of-bounds reads in
  // practice) and win or lose argmax by position; a broken row must neither crash nor be sampled from.
  for (float& v : logits) {
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  }
  for (const auto& [t, bias] : params_.logit_bias) {
    if (t >= 0 && t < vocab) logits[static_cast<size_t>(t)] += bias;
  }
  if (observed_ < params_.min_tokens) {
    for (const int32_t t : params_.min_tokens_blocked) {
      if (t >= 0 && t < vocab) logits[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
    }
  }
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t t : seen_) {
      if (t < 0 || t >= vocab) continue;
      float& v = logits[static_cast<size_t>(t)];
      v = v > 0 ? v / params_.repetition_penalty : v * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [t, count] : output_counts_) {
      if (t < 0 || t >= vocab) continue;
      logits[static_cast<size_t>(t)] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
    }
  }
}

namespace {

// A counter-based generator (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", 2014):
// the draw for (seed, step, token) needs no state shared with any other token or request.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// First maximum wins, so ties resolve to the lowest id (as torch.argmax).
int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void require_logits(std::span<const float> logits) {
  if (logits.empty()) throw UsageError("sampler: the logits row is empty (vocabulary size 0)");
}

}  // namespace

void Sampler::filter(std::span<const float> logits) {
  const auto vocab = static_cast<int32_t>(logits.size());
  candidates_.clear();
  candidates_.reserve(logits.size());
  for (int32_t i = 0; i < vocab; ++i) candidates_.emplace_back(logits[static_cast<size_t>(i)] / params_.temperature, i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const auto first = candidates_.begin();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < candidates_.size()) {
    const auto k = static_cast<std::ptrdiff_t>(params_.top_k);
    std::partial_sort(first, first + k, candidates_.end(), by_logit);
    // Tokens tied with the k-th logit stay, as transformers' TopKLogitsWarper (scores < k-th value are removed).
    const float kth = candidates_[static_cast<size_t>(k - 1)].first;
    const auto tied_end = std::partition(first + k, candidates_.end(), [&](const auto& c) { return c.first == kth; });
    std::sort(first + k, tied_end, by_logit);
    candidates_.erase(tied_end, candidates_.end());
  } else {
    std::sort(first, candidates_.end(), by_logit);
  }
  // Softmax over the survivors (max-subtracted, double accumulation).
  const float max_logit = candidates_.front().first;
  if (max_logit == -std::numeric_limits<float>::infinity()) {  // nothing finite: the lowest id, as greedy
    candidates_.resize(1);
    candidates_.front().first = 1.0f;
    return;
  }
  double total = 0.0;
  for (auto& c : candidates_) {
    c.first = std::exp(c.first - max_logit);
    total += c.first;
  }
  for (auto& c : candidates_) c.first = static_cast<float>(c.first / total);
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t n = 0;
    while (n < candidates_.size()) {
      cumulative += candidates_[n].first;
      ++n;
      if (cumulative >= params_.top_p) break;
    }
    candidates_.resize(n);
  }
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * candidates_.front().first;
    const auto end = std::find_if(candidates_.begin(), candidates_.end(), [&](const auto& c) { return c.first < threshold; });
    candidates_.erase(end, candidates_.end());
  }
}

std::vector<float> Sampler::distribution(std::span<float> logits) {
  require_logits(logits);
  prepare(logits);
  std::vector<float> probs(logits.size(), 0.0f);
  if (params_.temperature == 0.0f) {
    probs[static_cast<size_t>(argmax(logits))] = 1.0f;
    return probs;
  }
  filter(logits);
  double mass = 0.0;
  for (const auto& c : candidates_) mass += c.first;
  for (const auto& c : candidates_) probs[static_cast<size_t>(c.second)] = static_cast<float>(c.first / mass);
  return probs;
}

int32_t Sampler::sample(std::span<float> logits) {
  require_logits(logits);
  prepare(logits);
  if (params_.temperature == 0.0f) return argmax(logits);
  filter(logits);
  // Exponential race (the Gumbel-max trick in ratio form): token = argmax p_i / E_i with E_i ~ Exp(1) drawn per
  // (seed, draw, token id). It samples p exactly, and since each token's noise is its own, logits perturbed in
  // their last bits (another batch shape runs other kernels) move a draw only when two tokens' ratios lie within
  // that perturbation; inverting the cumulative distribution moved a draw whenever near-equal tokens swapped
  // places or the mass before it shifted.
  const uint64_t draw_key = splitmix64(seed_ ^ splitmix64(draws_++));
  int32_t best = candidates_.front().second;
  double best_score = -1.0;
  for (const auto& [p, id] : candidates_) {
    if (p <= 0.0f) continue;
    const uint64_t bits = splitmix64(draw_key + static_cast<uint64_t>(id) * 0xD1B54A32D192ED03ull);
    const double u = (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
    const double score = static_cast<double>(p) / -std::log(u);
    if (score > best_score) {
      best_score = score;
      best = id;
    }
  }
  return best;
}

void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> bitmask) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w < bitmask.size() && 32 * w < n; ++w) {
    const auto bits = static_cast<uint32_t>(bitmask[w]);
    if (bits == 0xFFFFFFFFu) continue;  // the common case in free text: a whole word allowed
    const size_t end = std::min(n, 32 * w + 32);
    for (size_t t = 32 * w; t < end; ++t) {
      if (((bits >> (t - 32 * w)) & 1u) == 0) logits[t] = kMasked;
    }
  }
  for (size_t t = 32 * bitmask.size(); t < n; ++t) logits[t] = kMasked;
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n) {
  require_logits(logits);
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    throw UsageError(fmt::format("token_logprobs: token {} is outside the logits row [0, {})", token, logits.size()));
  }
  auto value = [&](size_t i) {
    const double v = logits[i];
    return std::isnan(v) ? -std::numeric_limits<double>::infinity() : v;
  };
  double max_logit = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) max_logit = std::max(max_logit, value(i));
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += std::exp(value(i) - max_logit);
  const double log_z = max_logit + std::log(total);
  TokenLogprobs out;
  out.logprob = value(static_cast<size_t>(token)) - log_z;
  const size_t n = std::min(static_cast<size_t>(std::max(top_n, 0)), logits.size());
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), [&](int32_t a, int32_t b) {
      const double va = value(static_cast<size_t>(a)), vb = value(static_cast<size_t>(b));
      return va > vb || (va == vb && a < b);
    });
    for (size_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], value(static_cast<size_t>(ids[i])) - log_z);
  }
  return out;
}

}  // namespace fp4serve::runtime
