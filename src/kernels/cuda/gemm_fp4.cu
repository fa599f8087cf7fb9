// SPDX-License-Identifier: Apache-2.0
// Weight-only FP4 GEMM (NVFP4 / MXFP4 weights, bf16 activations, fp32 accumulation) on tensor cores:
// mma.sync.m16n8k16 with the weights as the A operand (16 output features per tile) and the tokens as B (8 per
// MMA). One warp owns one 16-row weight tile and streams its codes with one 16-byte non-coherent load per lane per
// 64 columns (layout: gpu_layout.h), decodes them in registers and feeds 4 MMAs per load and token tile.
// - Decode (m ≤ 16): 1 or 2 token tiles per warp, 4 chunk loads in flight per lane, split-K across the 8 warps of
//   a block when N is small (deterministic shared-memory reduction, no atomics).
// - Larger m: 8 token tiles (64 tokens) per warp, no split-K; activations come through L1 (the 8 warps of a
//   block read the same tokens), weights are re-read per 64-token tile from L2. No shared-memory staging or
//   cp.async pipeline yet: this path is correct but far from cuBLAS at large m.
// Decode of a code pair: the E2M1 bits are placed under the bf16 exponent, which gives value·2^-126 (0.5 is a
// bf16 subnormal), one exact multiply by 2^126 restores the value and one exact multiply by the block scale
// (code·E4M3 and code·2^e are representable in bf16) gives the weight; the NVFP4 global scale, the W4A4
// activation divisor and the bias are applied once per output in fp32.
//
// Compiler figures (nvcc 13.0.88 -O3, `-Xptxas -v`, SASS from cuobjdump 13.1 --dump-sass), read 2026-11-29;
// never run on a GPU yet. Registers per thread, sm_80 / sm_90; no variant has a stack frame or spills:
//   decode NT=1 (m ≤ 8):   87 / 92 regs, 4 KiB smem (split-K partials)
//   decode NT=2 (m ≤ 16): 126 / 126 regs, 8 KiB smem
//   tiled  NT=8 (m > 16): 134 / 138 regs, no smem
// SASS per unrolled loop body (U chunks): decode NT=1 has 4 LDG.E.NA.128.CONSTANT (weights, L1 no-allocate),
// 4 LDG.E.U16.CONSTANT (scales), 8 LDG.E.128.CONSTANT (activations), 16 HMMA.16816.F32.BF16 and 128 HMUL2.BF16
// (sm_90; HFMA2.BF16 on sm_80) — 2 per decoded bf16x2 register; no LDL/STL anywhere.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp4_math.h"
#include "kernels/cuda/gemm_fp4_launch.h"

namespace fp4serve::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// Weights are read once: keep them out of L1 so that the activations, read by every warp, stay there.
__device__ __forceinline__ uint4 load_stream(const uint32_t* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 bits_bf162(uint32_t u) { return *reinterpret_cast<__nv_bfloat162*>(&u); }

// Block-scale byte → (s, s) in bf16, exact.
__device__ __forceinline__ __nv_bfloat162 scale_pair(uint32_t byte, bool nvfp4) {
  return __float2bfloat162_rn(nvfp4 ? e4m3_value(byte) : e8m0_value(byte));
}

// Register r (0..3) of the A fragment from one code word: nibbles r and r + 4 → bf16x2 code·scale.
template <int R>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t word, __nv_bfloat162 scale) {
  const uint32_t raw = e2m1_pair_raw_bf16(word, R);  // value·2^-126 in both halves
  const __nv_bfloat162 two126 = bits_bf162(0x7E807E80u);                        // (2^126, 2^126)
  return bf162_bits(__hmul2(__hmul2(bits_bf162(raw), two126), scale));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// NT token tiles of 8 per warp; U chunks loaded before the first is used. The block's kWarps warps cover
// `rows_per_block` row tiles × (kWarps / rows_per_block) K splits.
template <int NT, int U>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 2 : 1) fp4_mma_kernel(const Fp4GemmArgs a, int rows_per_block) {
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const int splits = kWarps / rows_per_block;
  const int split = warp / rows_per_block;
  const int64_t rt = static_cast<int64_t>(blockIdx.x) * rows_per_block + warp % rows_per_block;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * (8 * NT);
  const bool active = rt < a.row_tiles;
  const int64_t c_begin = split * a.col_chunks / splits;
  const int64_t c_end = (split + 1) * a.col_chunks / splits;
  const int slots = a.nvfp4 ? 32 : 16;
  const int slot = a.nvfp4 ? lane : lane >> 1;

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;

  if (active) {
    const uint32_t* codes = a.codes + (rt * a.col_chunks * 32 + lane) * 4;
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(a.scales) + rt * a.col_chunks * slots + slot;
    // This lane's B rows: token tok0 + 8·nt + g, columns 64c + 16t … +15.
    const __nv_bfloat16* xrow[NT];
    bool tok_ok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t tok = tok0 + 8 * nt + g;
      tok_ok[nt] = tok < a.m;
      xrow[nt] = a.x + (tok_ok[nt] ? tok : 0) * a.k + 16 * t;
    }
    for (int64_t c = c_begin; c < c_end; c += U) {
      uint4 w[U];
      uint32_t s[U];
      uint4 xv[U][NT][2];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t cc = c + u;
        const bool chunk_ok = cc < c_end;
        w[u] = chunk_ok ? load_stream(codes + cc * 128) : make_uint4(0, 0, 0, 0);
        s[u] = chunk_ok ? __ldg(scales + cc * slots) : 0u;
        const bool col_ok = chunk_ok && 64 * cc + 16 * t < a.k;  // K % 16 == 0: a 16-column run is all in or out
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (col_ok && tok_ok[nt]) {
            const uint4* p = reinterpret_cast<const uint4*>(xrow[nt] + 64 * cc);
            xv[u][nt][0] = __ldg(p);
            xv[u][nt][1] = __ldg(p + 1);
          } else {
            xv[u][nt][0] = xv[u][nt][1] = make_uint4(0, 0, 0, 0);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u >= c_end) break;
        const __nv_bfloat162 s_lo = scale_pair(s[u] & 0xFFu, a.nvfp4);  // row g
        const __nv_bfloat162 s_hi = scale_pair(s[u] >> 8, a.nvfp4);     // row g + 8
        const uint32_t words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t a0 = dequant_pair<0>(words[j], s_lo);
          const uint32_t a1 = dequant_pair<1>(words[j], s_hi);
          const uint32_t a2 = dequant_pair<2>(words[j], s_lo);
          const uint32_t a3 = dequant_pair<3>(words[j], s_hi);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint32_t xw[8] = {xv[u][nt][0].x, xv[u][nt][0].y, xv[u][nt][0].z, xv[u][nt][0].w,
                                    xv[u][nt][1].x, xv[u][nt][1].y, xv[u][nt][1].z, xv[u][nt][1].w};
            mma_bf16(acc[nt], a0, a1, a2, a3, xw[2 * j], xw[2 * j + 1]);
          }
        }
      }
    }
  }

  // Only the decode variants split K (the tiled variant is launched with rows_per_block = kWarps).
  if constexpr (NT <= 2) {
  if (splits > 1) {
    __shared__ float partial[kWarps][NT][4][32];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][nt][i][lane] = acc[nt][i];
    }
    __syncthreads();
    if (split != 0) return;
    for (int other = 1; other < splits; ++other) {
      const int ow = other * rows_per_block + warp;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] += partial[ow][nt][i][lane];
      }
    }
  }
  }
  if (!active) return;

  // C fragment: acc[nt][i] is feature 16·rt + g + 8·(i / 2), token tok0 + 8·nt + 2t + i % 2.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = rt * 16 + g + 8 * (i >> 1);
      const int64_t tok = tok0 + 8 * nt + 2 * t + (i & 1);
      if (n >= a.n || tok >= a.m) continue;
      float v = acc[nt][i];
      if (a.activation_divisor != 0.f) v = v / a.activation_divisor;
      if (a.global_scale != nullptr) v = a.divisor ? v / a.global_scale[n] : v * a.global_scale[n];
      if (a.bias != nullptr) v += a.bias[n];
      if (a.y_f32 != nullptr) {
        a.y_f32[tok * a.n + n] = v;
      } else {
        a.y_bf16[tok * a.n + n] = __float2bfloat16_rn(v);
      }
    }
  }
}

// Row tiles per block (a divisor of kWarps; the block's other warps split K): the fewest K splits that give about
// 16 weight-streaming warps per SM (each keeps 4 × 512 B of loads in flight), never more splits than chunks.
int pick_rows_per_block(int64_t row_tiles, int64_t col_chunks, int multiprocessors) {
  const int64_t want_warps = 16 * static_cast<int64_t>(multiprocessors > 0 ? multiprocessors : 1);
  for (int rows = kWarps; rows > 1; rows /= 2) {
    if (row_tiles * (kWarps / rows) >= want_warps || col_chunks < 2 * (kWarps / rows)) return rows;
  }
  return 1;
}

}  // namespace

void launch_fp4_gemm(const Fp4GemmArgs& args, int multiprocessors, cudaStream_t stream) {
  if (args.m <= 0) return;
  if (args.m <= 16) {
    const int rows = pick_rows_per_block(args.row_tiles, args.col_chunks, multiprocessors);
    const dim3 grid(static_cast<unsigned>((args.row_tiles + rows - 1) / rows), 1);
    if (args.m <= 8) {
      fp4_mma_kernel<1, 4><<<grid, kThreads, 0, stream>>>(args, rows);
    } else {
      fp4_mma_kernel<2, 4><<<grid, kThreads, 0, stream>>>(args, rows);
    }
  } else {
    const dim3 grid(static_cast<unsigned>((args.row_tiles + kWarps - 1) / kWarps),
                    static_cast<unsigned>((args.m + 63) / 64));
    fp4_mma_kernel<8, 1><<<grid, kThreads, 0, stream>>>(args, kWarps);
  }
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4serve::kernels::cuda
