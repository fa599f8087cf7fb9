// SPDX-License-Identifier: Apache-2.0
#include "model/online_transform.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <span>

#include "fp4serve/error.h"
#include "quant/formats.h"

namespace fp4serve::model {

const char* transform_kernel_name(TransformKernel k) {
  switch (k) {
    case TransformKernel::Fwht: return "fwht";
    case TransformKernel::Dense: return "dense";
    case TransformKernel::KroneckerHadamard: return "kronecker-hadamard";
  }
  return "?";
}

OnlineTransform::OnlineTransform(TransformKernel kernel, int64_t block, std::vector<float> matrix)
    : kernel_(kernel), block_(block), matrix_(std::move(matrix)) {
  if (block_ < 1 || (kernel_ == TransformKernel::Dense && matrix_.size() != static_cast<size_t>(block_ * block_))) {
    throw UsageError(fmt::format("OnlineTransform: block {} with a {}-element matrix", block_, matrix_.size()));
  }
}

OnlineTransform::OnlineTransform(quant::KroneckerHadamardSteps structured, std::vector<float> matrix)
    : kernel_(TransformKernel::KroneckerHadamard),
      block_(structured.n),
      matrix_(std::move(matrix)),
      structured_(std::make_shared<const quant::KroneckerHadamardSteps>(std::move(structured))) {
  if (block_ < 2 || matrix_.size() != static_cast<size_t>(block_ * block_)) {
    throw UsageError(fmt::format("OnlineTransform: kronecker-hadamard block {} with a {}-element matrix", block_,
                                 matrix_.size()));
  }
}

namespace {

double element(const core::TensorView& v, size_t i) {
  if (v.dtype == core::DType::F64) return v.load<double>(i);
  if (v.dtype == core::DType::F32) return v.load<float>(i);
  if (v.dtype == core::DType::BF16) return quant::bf16_to_float(v.load<uint16_t>(i));
  if (v.dtype == core::DType::F16) return quant::f16_to_float(v.load<uint16_t>(i));
  throw FormatError(fmt::format("unsupported transform matrix dtype {}", core::dtype_name(v.dtype)));
}

uint64_t hash_matrix(const std::vector<double>& m) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
  for (double d : m) {
    const auto bits = std::bit_cast<uint64_t>(d);
    for (int s = 0; s < 64; s += 8) {
      h ^= (bits >> s) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace

namespace {

// The stored values in f64 (row-major, unpermuted), the validated permutation and the type's scale.
struct StoredMatrix {
  int64_t b = 0;
  std::vector<double> w;
  std::vector<int64_t> perm;  // identity when the checkpoint stores none
  double scale = 1.0;
};

StoredMatrix read_stored(const TransformSource& source) {
  const core::TensorView& w = source.matrix;
  if (w.shape.size() != 2 || w.shape[0] != w.shape[1] || w.shape[0] < 1) {
    throw FormatError(fmt::format("{}: a transform matrix must be square [n, n], found {}", source.name,
                                  core::shape_to_string(w.shape)));
  }
  StoredMatrix s;
  const int64_t b = s.b = w.shape[0];
  if (w.dtype != core::DType::F64 && w.dtype != core::DType::F32 && w.dtype != core::DType::BF16 &&
      w.dtype != core::DType::F16) {
    throw FormatError(fmt::format("{}: expected an F64/F32/BF16/F16 transform matrix, found {}", source.name,
                                  core::dtype_name(w.dtype)));
  }
  if (source.type == "hadamard" || source.type == "random-hadamard") {
    s.scale = 1.0 / std::sqrt(static_cast<double>(b));  // HadamardTransform divides by sqrt(size); random-matrix does not
  } else if (source.type != "random-matrix") {
    throw UnsupportedError(fmt::format("{}: transform type '{}' (expected hadamard, random-hadamard or random-matrix)",
                                       source.name, source.type));
  }
  s.perm.resize(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) s.perm[static_cast<size_t>(i)] = i;
  if (source.perm) {
    const core::TensorView& p = *source.perm;
    if (p.shape != std::vector<int64_t>{b} || (p.dtype != core::DType::I64 && p.dtype != core::DType::I32)) {
      throw FormatError(fmt::format("{}: the permutation must be I64/I32 [{}], found {} {}", source.name, b,
                                    core::dtype_name(p.dtype), core::shape_to_string(p.shape)));
    }
    std::vector<bool> seen(static_cast<size_t>(b), false);
    for (int64_t i = 0; i < b; ++i) {
      const int64_t v = p.dtype == core::DType::I64 ? p.load<int64_t>(static_cast<size_t>(i)) : p.load<int32_t>(static_cast<size_t>(i));
      if (v < 0 || v >= b || seen[static_cast<size_t>(v)]) {
        throw FormatError(fmt::format("{}: the stored perm is not a permutation of 0..{} (entry {} = {})", source.name,
                                      b - 1, i, v));
      }
      seen[static_cast<size_t>(v)] = true;
      s.perm[static_cast<size_t>(i)] = v;
    }
  }
  s.w.resize(static_cast<size_t>(b * b));
  for (int64_t i = 0; i < b * b; ++i) {
    const double v = element(w, static_cast<size_t>(i));
    if (!std::isfinite(v)) {
      throw FormatError(fmt::format("{}: non-finite entry at [{}, {}]", source.name, i / b, i % b));
    }
    s.w[static_cast<size_t>(i)] = v;
  }
  return s;
}

// compressed-tensors: weight[perm][:, perm], then .T when inverse; online locations compute value @ weight.
std::vector<double> effective(const StoredMatrix& s, bool inverse) {
  const int64_t b = s.b;
  std::vector<double> m(static_cast<size_t>(b * b));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      const int64_t r = inverse ? j : i, c = inverse ? i : j;
      m[static_cast<size_t>(i * b + j)] =
          s.w[static_cast<size_t>(s.perm[static_cast<size_t>(r)] * b + s.perm[static_cast<size_t>(c)])] * s.scale;
    }
  }
  return m;
}

}  // namespace

std::vector<double> effective_transform_matrix(const TransformSource& source) {
  return effective(read_stored(source), source.inverse);
}

bool is_normalized_sylvester(const std::vector<double>& m, int64_t b) {
  if (b < 2 || (b & (b - 1)) != 0 || m.size() != static_cast<size_t>(b * b)) return false;
  const double s = 1.0 / std::sqrt(static_cast<double>(b));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      const double want = (std::popcount(static_cast<uint64_t>(i & j)) & 1) ? -s : s;
      if (std::fabs(m[static_cast<size_t>(i * b + j)] - want) > 1e-6) return false;
    }
  }
  return true;
}

namespace {

// A 64-bit hash of bytes, a word at a time (a key for the exact comparison that follows, not a checksum).
uint64_t hash_bytes(std::span<const std::byte> bytes, uint64_t h) {
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = (h ^ word) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<uint64_t>(bytes[i])) * 0x100000001B3ull;
  return h;
}

bool same_bytes(const std::vector<std::byte>& kept, std::span<const std::byte> bytes) {
  return kept.size() == bytes.size() && (bytes.empty() || std::memcmp(kept.data(), bytes.data(), bytes.size()) == 0);
}

}  // namespace

bool TransformCache::SeenSource::matches(const TransformSource& source) const {
  if (has_perm != source.perm.has_value()) return false;
  if (source.perm && (perm_dtype != source.perm->dtype || perm_shape != source.perm->shape ||
                      !same_bytes(perm, source.perm->bytes))) {
    return false;
  }
  return dtype == source.matrix.dtype && shape == source.matrix.shape && type == source.type &&
         inverse == source.inverse && same_bytes(matrix, source.matrix.bytes);
}

std::shared_ptr<const OnlineTransform> TransformCache::get(const TransformSource& source) {
  uint64_t key = hash_bytes(source.matrix.bytes, 1469598103934665603ull);
  if (source.perm) key = hash_bytes(source.perm->bytes, key);
  std::vector<SeenSource>& seen = by_bytes_[key];
  for (const SeenSource& s : seen) {
    if (s.matches(source)) return s.transform;
  }
  std::shared_ptr<const OnlineTransform> t = build_or_share(source);  // throws for a malformed source
  SeenSource s;
  s.dtype = source.matrix.dtype;
  s.shape = source.matrix.shape;
  s.matrix.assign(source.matrix.bytes.begin(), source.matrix.bytes.end());
  if (source.perm) {
    s.perm.assign(source.perm->bytes.begin(), source.perm->bytes.end());
    s.has_perm = true;
    s.perm_dtype = source.perm->dtype;
    s.perm_shape = source.perm->shape;
  }
  s.type = source.type;
  s.inverse = source.inverse;
  s.transform = t;
  seen.push_back(std::move(s));
  return t;
}

std::shared_ptr<const OnlineTransform> TransformCache::build_or_share(const TransformSource& source) {
  const StoredMatrix stored = read_stored(source);
  std::vector<double> m = effective(stored, source.inverse);
  const int64_t b = stored.b;
  auto& bucket = by_hash_[hash_matrix(m)];
  for (const auto& [matrix, transform] : bucket) {
    if (matrix == m) return transform;
  }
  std::shared_ptr<const OnlineTransform> t;
  if (is_normalized_sylvester(m, b) && b <= (int64_t{1} << 15)) {
    t = std::make_shared<const OnlineTransform>(TransformKernel::Fwht, b, std::vector<float>{});
  } else {
    std::vector<float> f(m.size());
    for (size_t i = 0; i < m.size(); ++i) f[i] = static_cast<float>(m[i]);
    // The structure is read off the stored values before the permutation, which the kernel applies as gathers.
    const auto factors =
        quant::factor_kronecker_hadamard(stored.w, b, quant::transform_storage_rel_tol(source.matrix.dtype));
    if (factors) {
      t = std::make_shared<const OnlineTransform>(
          quant::kronecker_hadamard_steps(*factors, stored.perm, source.inverse, stored.scale), std::move(f));
    } else {
      t = std::make_shared<const OnlineTransform>(TransformKernel::Dense, b, std::move(f));
    }
  }
  bucket.emplace_back(std::move(m), t);
  ++count_;
  return t;
}

}  // namespace fp4serve::model
