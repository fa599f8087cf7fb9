// SPDX-License-Identifier: Apache-2.0
// Host simulation of one warp of the FP4 GEMM kernel (gemm_fp4.cu) — the check that the GPU weight layout
// (gpu_layout.h), the kernel's register decode (fp4_math.h e2m1_pair_raw_bf16) and its choice of activation
// words agree with what mma.sync.m16n8k16.row.col computes. The MMA is modelled from its definition in the PTX ISA
// (section "Matrix fragments for mma.m16n8k16" with .bf16): lane l = 4g + t holds
//   A: {a0,a1} = A[g][2t..2t+1], {a2,a3} = A[g+8][2t..2t+1], {a4,a5} = A[g][2t+8..2t+9], {a6,a7} = A[g+8][2t+8..2t+9]
//   B: {b0,b1} = B[2t..2t+1][g], {b2,b3} = B[2t+8..2t+9][g]
//   C: {c0,c1} = C[g][2t..2t+1], {c2,c3} = C[g+8][2t..2t+1]
// (lower element in the low 16 bits of each register), and C = A·B over k = 0..15. The simulated outputs are
// compared with Σ_k x·code·scale computed in float64 from the checkpoint tensors. Runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cuda/kernels/fp4_math.h"
#include "backends/cuda/kernels/gpu_layout.h"
#include "quant/checkpoint_tensors.h"
#include "quant/linear_weights.h"
#include "quant/block_format.h"
#include "quant/formats.h"

namespace fp4serve::kernels::cuda {
namespace {

// bf16 bits → float (exact).
double bf16_bits_value(uint32_t bits16) { return quant::bf16_to_float(static_cast<uint16_t>(bits16)); }

TEST(CudaMmaFragments, PairDecodeGivesEveryCodeAtEveryPosition) {
  for (uint32_t code = 0; code < 16; ++code) {
    for (int pos = 0; pos < 8; ++pos) {
      const uint32_t word = (code << (4 * pos)) | (pos == 0 ? 0x10000000u : 0x1u);  // a neighbour nibble set too
      const uint32_t raw = e2m1_pair_raw_bf16(word, pos % 4);
      const uint32_t half = pos < 4 ? raw & 0xFFFFu : raw >> 16;
      EXPECT_EQ(bf16_bits_value(half) * std::ldexp(1.0, 126), testing::e2m1_value(code)) << code << " @" << pos;
    }
  }
}

// Scale byte → value as the kernel decodes it (block_scale_value of the layer's format).
double kernel_scale_value(quant::BlockFormat f, uint8_t byte) {
  return quant::visit_block_format(f, [&]<quant::BlockFormat F>() { return static_cast<double>(block_scale_value<F>(byte)); });
}

// One layer, M tokens: simulates every warp tile and chunk of the kernel and returns y[tok][n] without the
// global scale.
std::vector<double> simulate(const PackedFp4& p, const std::vector<float>& x, int64_t m) {
  const int64_t n_total = p.out_features, k_total = p.in_features, chunks = p.col_chunks(), slots = p.scale_slots();
  const int64_t lanes_per_slot = gpu_lanes_per_scale_slot(p.group_size);
  std::vector<double> y(static_cast<size_t>(m * n_total), 0.0);
  for (int64_t rt = 0; rt < p.row_tiles(); ++rt) {
    for (int64_t tok0 = 0; tok0 < m; tok0 += 8) {
      double c_acc[16][8] = {};
      for (int64_t c = 0; c < chunks; ++c) {
        for (int j = 0; j < 4; ++j) {
          double a[16][16] = {}, b[16][8] = {};
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, t = lane % 4;
            const uint32_t word = p.codes[static_cast<size_t>(((rt * chunks + c) * 32 + lane) * 4 + j)];
            const size_t slot = static_cast<size_t>(lane / lanes_per_slot);
            const uint8_t* sb = &p.scales[static_cast<size_t>((rt * chunks + c) * slots) * 2 + slot * 2];
            const double s_lo = kernel_scale_value(p.block_format, sb[0]);
            const double s_hi = kernel_scale_value(p.block_format, sb[1]);
            // Registers R0..R3 exactly as the kernel builds them (dequant_pair<R>): rows g, g+8, g, g+8.
            const double scale[4] = {s_lo, s_hi, s_lo, s_hi};
            for (int r = 0; r < 4; ++r) {
              const uint32_t raw = e2m1_pair_raw_bf16(word, r);
              const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
              a[row][col] = bf16_bits_value(raw & 0xFFFFu) * std::ldexp(1.0, 126) * scale[r];
              a[row][col + 1] = bf16_bits_value(raw >> 16) * std::ldexp(1.0, 126) * scale[r];
            }
            // B registers: words 2j and 2j+1 of the lane's 16 activations (columns 64c + 16t …), token tok0 + g.
            const int64_t tok = tok0 + g;
            for (int half = 0; half < 2; ++half) {
              for (int e = 0; e < 2; ++e) {
                const int64_t col = 64 * c + 16 * t + 2 * (2 * j + half) + e;
                const double v = tok < m && col < k_total ? x[static_cast<size_t>(tok * k_total + col)] : 0.0;
                b[2 * t + 8 * half + e][g] = v;
              }
            }
          }
          for (int row = 0; row < 16; ++row) {
            for (int col = 0; col < 8; ++col) {
              for (int kk = 0; kk < 16; ++kk) c_acc[row][col] += a[row][kk] * b[kk][col];
            }
          }
        }
      }
      for (int row = 0; row < 16; ++row) {
        for (int col = 0; col < 8; ++col) {
          const int64_t n = 16 * rt + row, tok = tok0 + col;
          if (n < n_total && tok < m) y[static_cast<size_t>(tok * n_total + n)] = c_acc[row][col];
        }
      }
    }
  }
  return y;
}

void check(bool nvfp4, int64_t n, int64_t k, int64_t m) {
  SCOPED_TRACE(::testing::Message() << (nvfp4 ? "NVFP4" : "MXFP4") << " N " << n << " K " << k << " M " << m);
  std::mt19937 rng(static_cast<unsigned>(n + 7 * k + 31 * m));
  const testing::Layer l = nvfp4 ? testing::make_nvfp4(rng, n, k, true) : testing::make_mxfp4(rng, n, k);
  const quant::LinearWeights w =
      quant::fp4_view_weights(nvfp4 ? quant::BlockFormat::Nvfp4 : quant::BlockFormat::Mxfp4, l.weight.view(),
                              l.scale.view(), l.global_scale, quant::GlobalScaleConvention::Divisor, "t");
  std::vector<float> x(static_cast<size_t>(m * k));
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto& v : x) v = quant::bf16_to_float(quant::float_to_bf16(dist(rng)));
  const std::vector<double> y = simulate(pack_fp4_for_gpu(w), x, m);
  const auto* codes = reinterpret_cast<const uint8_t*>(l.weight.data.data());
  const auto* scales = reinterpret_cast<const uint8_t*>(l.scale.data.data());
  const int64_t group = k / l.scale.shape[1];  // the checkpoint's weight_scale is [N, K / group]
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < n; ++r) {
      double want = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = codes[r * k / 2 + c / 2];
        const uint8_t sbyte = scales[r * (k / group) + c / group];
        const double s = nvfp4 ? testing::e4m3_value(sbyte) : std::ldexp(1.0, sbyte - 127);
        const double p = x[static_cast<size_t>(i * k + c)] * testing::e2m1_value(c % 2 == 0 ? byte & 0xF : byte >> 4) * s;
        want += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(y[static_cast<size_t>(i * n + r)], want, 1e-12 * mag + 1e-300) << "y[" << i << ", " << r << "]";
    }
  }
}

TEST(CudaMmaFragments, SimulatedWarpMatchesFloat64) {
  check(true, 40, 192, 8);
  check(true, 16, 48, 3);    // K not a multiple of 64: padded chunk
  check(true, 37, 576, 11);  // two token tiles, partial row tile
  check(false, 40, 192, 5);
  check(false, 23, 96, 9);
}

}  // namespace
}  // namespace fp4serve::kernels::cuda
