// SPDX-License-Identifier: Apache-2.0
// fwht_blocks against a dense float64 multiply by the normalized Sylvester matrix; rotate_blocks against float64.
#include <bit>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/kernels/hadamard.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {
namespace {

using testing::for_each_simd_target;
using testing::random_nonzero;

// Sylvester H_b[i][j] = (−1)^popcount(i & j) (the Kronecker-power construction), divided by √b.
std::vector<double> dense_fwht_ref(const std::vector<float>& x, int64_t rows, int64_t dim, int64_t b) {
  std::vector<double> out(x.size());
  const double norm = 1.0 / std::sqrt(double(b));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t base = 0; base < dim; base += b) {
      for (int64_t j = 0; j < b; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < b; ++i) {
          const double h = (std::popcount(uint64_t(i & j)) & 1) ? -1.0 : 1.0;
          acc += double(x[r * dim + base + i]) * h;
        }
        out[r * dim + base + j] = acc * norm;
      }
    }
  }
  return out;
}

TEST(Hadamard, FwhtMatchesDenseSylvesterEveryPowerOfTwoEveryTarget) {
  for (int64_t b = 2; b <= 4096; b *= 2) {
    // Blocks narrower than a vector also come 37 to a row: whole vectors of them, then a tail of fewer.
    const std::vector<int64_t> block_counts = b <= 32 ? std::vector<int64_t>{3, 37} : std::vector<int64_t>{b <= 256 ? 3 : 1};
    for (const int64_t blocks : block_counts) {
      const int64_t rows = 2, dim = blocks * b;
      const std::vector<float> x = random_nonzero(rows * dim, uint32_t(b + blocks));
      const std::vector<double> ref = dense_fwht_ref(x, rows, dim, b);
      for_each_simd_target([&] {
        std::vector<float> y = x;
        fwht_blocks(y.data(), rows, dim, b);
        // Outputs have RMS ≈ input RMS (orthonormal); fp32 error grows with the log2(b) butterfly stages.
        const double tol = 2e-7 * (std::log2(double(b)) + 1) * 4;
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_NEAR(y[i], ref[i], tol) << "block " << b << " × " << blocks << " element " << i;
        }
      });
    }
  }
}

TEST(Hadamard, FwhtIsItsOwnInverse) {
  const int64_t rows = 3, dim = 16 * 5;
  const std::vector<float> x = random_nonzero(rows * dim, 4);
  std::vector<float> y = x;
  fwht_blocks(y.data(), rows, dim, 16);
  fwht_blocks(y.data(), rows, dim, 16);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-6);
}

TEST(Hadamard, RotateBlocksMatchesFloat64) {
  for (int64_t b : {1, 3, 48, 128}) {
    const int64_t rows = 5, dim = b * 3;
    const std::vector<float> x = random_nonzero(rows * dim, 10 + b);
    const std::vector<float> m = random_nonzero(b * b, 20 + b);
    for_each_simd_target([&] {
      std::vector<float> y = x;
      rotate_blocks(y.data(), rows, dim, m.data(), b);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t base = 0; base < dim; base += b) {
          for (int64_t j = 0; j < b; ++j) {
            double acc = 0, mag = 0;
            for (int64_t i = 0; i < b; ++i) {
              acc += double(x[r * dim + base + i]) * m[i * b + j];
              mag += std::abs(double(x[r * dim + base + i]) * m[i * b + j]);
            }
            ASSERT_NEAR(y[r * dim + base + j], acc, 1e-6 * mag + 1e-7) << "block " << b << " r " << r << " j " << j;
          }
        }
      }
    });
  }
}

// x · M̂ for M̂[i][j] = scale · W[π(i)][π(j)] (ᵀ when inverse), W = diag(l)·(A ⊗ H_p)·diag(r) with A a seeded
// real k×k matrix (not ±1: the GEMM step must carry arbitrary values), on every SIMD target, against float64.
TEST(Hadamard, KroneckerHadamardBlocksMatchFloat64EveryTarget) {
  struct Shape {
    int64_t k, p;
  };
  for (const Shape s : {Shape{1, 32}, Shape{3, 16}, Shape{12, 4}, Shape{5, 2}}) {
    for (const bool inverse : {false, true}) {
      const int64_t n = s.k * s.p, rows = 3, dim = 3 * n;
      quant::KroneckerHadamardFactors f;
      f.p = s.p;
      f.k = s.k;
      const std::vector<float> a = random_nonzero(s.k * s.k, uint32_t(n + 1));
      f.a.assign(a.begin(), a.end());
      const std::vector<float> ls = random_nonzero(n, uint32_t(n + 2)), rs = random_nonzero(n, uint32_t(n + 3));
      for (int64_t i = 0; i < n; ++i) {
        f.left.push_back(ls[i] < 0 ? -1 : 1);
        f.right.push_back(rs[i] < 0 ? -1 : 1);
      }
      std::vector<int64_t> perm(n);  // i ↦ 7i + 3 mod n: a permutation, every n here being coprime to 7
      for (int64_t i = 0; i < n; ++i) perm[i] = (i * 7 + 3) % n;
      const double scale = 1.0 / std::sqrt(double(n));
      const quant::KroneckerHadamardSteps t = quant::kronecker_hadamard_steps(f, perm, inverse, scale);
      auto w = [&](int64_t i, int64_t j) {
        const double h = (std::popcount(uint64_t((i % s.p) & (j % s.p))) & 1) ? -1.0 : 1.0;
        return f.left[i] * f.right[j] * f.a[(i / s.p) * s.k + j / s.p] * h;
      };
      const std::vector<float> x = random_nonzero(rows * dim, uint32_t(n + 4));
      for_each_simd_target([&] {
        std::vector<float> y = x;
        kronecker_hadamard_blocks(prepare_kronecker_hadamard(t), y.data(), rows, dim);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t base = 0; base < dim; base += n) {
            for (int64_t j = 0; j < n; ++j) {
              double acc = 0, mag = 0;
              for (int64_t i = 0; i < n; ++i) {
                const double m = inverse ? w(perm[j], perm[i]) : w(perm[i], perm[j]);
                acc += double(x[r * dim + base + i]) * m * scale;
                mag += std::abs(double(x[r * dim + base + i]) * m * scale);
              }
              ASSERT_NEAR(y[r * dim + base + j], acc, 2e-6 * mag + 1e-7)
                  << "k " << s.k << " p " << s.p << " inverse " << inverse << " r " << r << " j " << j;
            }
          }
        }
      });
    }
  }
}

TEST(Hadamard, KroneckerHadamardBlocksRejectBadShapes) {
  quant::KroneckerHadamardFactors f;
  f.p = 4;
  f.k = 2;
  f.a = {1, 1, 1, -1};
  f.left.assign(8, 1);
  f.right.assign(8, 1);
  const quant::KroneckerHadamardSteps t = quant::kronecker_hadamard_steps(f, {}, false, 1.0);
  std::vector<float> x(24, 1.0f);
  const KroneckerHadamardKernel kernel = prepare_kronecker_hadamard(t);
  EXPECT_THROW(kronecker_hadamard_blocks(kernel, x.data(), 1, 12), UsageError);  // 8 does not divide 12
  EXPECT_THROW(kronecker_hadamard_blocks(kernel, nullptr, 1, 8), UsageError);
  const std::vector<int64_t> short_perm{0, 1, 2};
  EXPECT_THROW(quant::kronecker_hadamard_steps(f, short_perm, false, 1.0), UsageError);
}

TEST(Hadamard, RejectsBadBlocks) {
  std::vector<float> x(96, 1.0f);
  EXPECT_THROW(fwht_blocks(x.data(), 1, 96, 24), UsageError);   // not a power of two
  EXPECT_THROW(fwht_blocks(x.data(), 1, 96, 64), UsageError);   // does not divide dim
  EXPECT_THROW(fwht_blocks(x.data(), 1, 96, 1), UsageError);
  EXPECT_THROW(fwht_blocks(x.data(), 1, 65536 * 2, 65536), UsageError);
  EXPECT_THROW(rotate_blocks(x.data(), 1, 96, x.data(), 7), UsageError);
  EXPECT_THROW(rotate_blocks(x.data(), 1, 96, nullptr, 8), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels
