// SPDX-License-Identifier: Apache-2.0
// Weight-only FP4 GEMM (NVFP4 / MXFP4 weights, bf16 activations, fp32 accumulation) on tensor cores:
// mma.sync.m16n8k16 with the weights as the A operand (16 output features per tile) and the tokens as B (8 per
// MMA). One warp owns one 16-row weight tile and streams its codes with one 16-byte non-coherent load per lane per
// 64 columns (layout: gpu_layout.h), decodes them in registers and feeds 4 MMAs per load and token tile.
// - Decode (m ≤ 16): 1 or 2 token tiles per warp; the weight codes stream through a per-warp shared-memory ring
//   of kStages stages × 2 chunks filled by cp.async (sm80+), so up to 6 chunk loads (3 KiB per warp) stay in
//   flight across loop iterations instead of draining to zero at the end of each (the register-only loop of
//   before); split-K across the 8 warps of a block when N is small (deterministic shared-memory reduction).
//   Each lane reads back only the 16 bytes it copied itself, so no barrier is needed between copy and use.
// - Larger m: 8 token tiles (64 tokens) per warp; activations come through L1 (the 8 warps of a block read the
//   same tokens), weights are re-read per 64-token tile from L2. When the grid is smaller than one wave
//   (m = 17…256 at 4096²: 32–128 blocks on 132 SMs) K is split over gridDim.z blocks (partition.h), each writing
//   fp32 partial sums to a workspace that a second kernel adds in split order (deterministic) before the
//   epilogue.
// Decode of a code pair: the E2M1 bits are placed under the bf16 exponent, which gives value·2^-126 (0.5 is a
// bf16 subnormal), one exact multiply by 2^126 restores the value and one exact multiply by the block scale
// (code·E4M3 and code·2^e are representable in bf16) gives the weight; the NVFP4 global scale, the W4A4
// activation divisor and the bias are applied once per output in fp32.
//
// Compiler figures (nvcc 13.0.88 -O3, `-Xptxas -v`), read 2026-12-01; the kernels have never run on a GPU yet.
// Registers per thread, sm_80 / sm_90; no variant has a stack frame or spills:
//   decode NT=1 (m ≤ 8):   64 / 68 regs, 32 KiB cp.async ring + 4 KiB split-K partials (87 / 92 before the ring)
//   decode NT=2 (m ≤ 16):  83 / 88 regs, 32 KiB ring + 8 KiB partials (126 / 126 before)
//   tiled  NT=8 (m > 16): 134 / 138 regs, no smem; split-K reduce 32 regs
// With the block format a template parameter (one kernel per format, the scale decode and slot count resolved at
// compile time; same arithmetic), sm_90, NVFP4 / MXFP4 (ptxas 13.0.88 -v, 2026-12-01): decode NT=1 64 / 63,
// NT=2 83 / 84, tiled 133 / 134 regs, same shared memory, no stack frame or spills.
// Before the ring (2026-11-29, cuobjdump 13.1 --dump-sass) the decode NT=1 loop body of 4 chunks had
// 4 LDG.E.NA.128.CONSTANT (weights), 4 LDG.E.U16.CONSTANT (scales), 8 LDG.E.128.CONSTANT (activations),
// 16 HMMA.16816.F32.BF16 and 128 HMUL2.BF16 (sm_90; HFMA2.BF16 on sm_80), no LDL/STL.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/fp4_math.h"
#include "backends/cuda/kernels/gemm_fp4_launch.h"
#include "backends/cuda/kernels/gpu_layout.h"
#include "backends/cuda/kernels/partition.h"
#include "quant/block_format.h"

namespace fp4serve::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = 4;       // decode: cp.async ring depth (stages of kStageChunks chunks)
constexpr int kStageChunks = 2;  // decode: chunks consumed per loop iteration

// 16-byte global → shared copy that bypasses L1 (.cg): the weight stream of the decode kernel.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(__cvta_generic_to_global(gmem)) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

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

// Block-scale byte of format F → (s, s) in bf16, exact.
template <quant::BlockFormat F>
__device__ __forceinline__ __nv_bfloat162 scale_pair(uint32_t byte) {
  return __float2bfloat162_rn(block_scale_value<F>(byte));
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

// The epilogue of one output: W4A4 activation divisor, NVFP4 global scale, bias, in the CPU's order; fp32 or bf16.
__device__ __forceinline__ void store_output(const Fp4GemmArgs& a, int64_t tok, int64_t n, float v) {
  if (a.activation_divisor != 0.f) v = v / a.activation_divisor;
  if (a.global_scale != nullptr) v = a.divisor ? v / a.global_scale[n] : v * a.global_scale[n];
  if (a.bias != nullptr) v += a.bias[n];
  if (a.y_f32 != nullptr) {
    a.y_f32[tok * a.n + n] = v;
  } else {
    a.y_bf16[tok * a.n + n] = __float2bfloat16_rn(v);
  }
}

// The activations of one 64-column chunk for this lane's NT token rows: columns 64c + 16t … +15 (two 16-byte
// loads per token tile), zero for a padded chunk or token.
template <int NT>
__device__ __forceinline__ void load_activations(const __nv_bfloat16* const (&xrow)[NT], const bool (&tok_ok)[NT],
                                                 int64_t cc, bool col_ok, uint4 (&xv)[NT][2]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (col_ok && tok_ok[nt]) {
      const uint4* p = reinterpret_cast<const uint4*>(xrow[nt] + 64 * cc);
      xv[nt][0] = __ldg(p);
      xv[nt][1] = __ldg(p + 1);
    } else {
      xv[nt][0] = xv[nt][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Decodes one chunk of this lane's A fragment (4 code words, 2 scale bytes of format F) and runs its 4 MMA steps
// per token tile.
template <quant::BlockFormat F, int NT>
__device__ __forceinline__ void mma_chunk(float (&acc)[NT][4], uint4 w, uint32_t s, const uint4 (&xv)[NT][2]) {
  const __nv_bfloat162 s_lo = scale_pair<F>(s & 0xFFu);  // row g
  const __nv_bfloat162 s_hi = scale_pair<F>(s >> 8);     // row g + 8
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t a0 = dequant_pair<0>(words[j], s_lo);
    const uint32_t a1 = dequant_pair<1>(words[j], s_hi);
    const uint32_t a2 = dequant_pair<2>(words[j], s_lo);
    const uint32_t a3 = dequant_pair<3>(words[j], s_hi);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint32_t xw[8] = {xv[nt][0].x, xv[nt][0].y, xv[nt][0].z, xv[nt][0].w,
                              xv[nt][1].x, xv[nt][1].y, xv[nt][1].z, xv[nt][1].w};
      mma_bf16(acc[nt], a0, a1, a2, a3, xw[2 * j], xw[2 * j + 1]);
    }
  }
}

// NT token tiles of 8 per warp. The block's kWarps warps cover `rows_per_block` row tiles × (kWarps /
// rows_per_block) K splits; gridDim.z further splits K across blocks (tiled variant only, partition.h), in which
// case the block writes raw fp32 sums to a.split_partial[blockIdx.z][tok][n] and fp4_split_k_reduce applies the
// epilogue. kAsync: the decode weight stream goes through the cp.async ring; else each lane loads its chunk
// directly (one 16-byte load per chunk, U chunks in flight). F = a.format: its row gives the scale slots per chunk
// and the scale decode.
template <quant::BlockFormat F, int NT, int U, bool kAsync>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 2 : 1) fp4_mma_kernel(const Fp4GemmArgs a, int rows_per_block) {
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const int warp_splits = kWarps / rows_per_block;
  const int64_t splits = static_cast<int64_t>(gridDim.z) * warp_splits;
  const int64_t split = static_cast<int64_t>(blockIdx.z) * warp_splits + warp / rows_per_block;
  const int64_t rt = static_cast<int64_t>(blockIdx.x) * rows_per_block + warp % rows_per_block;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * (8 * NT);
  const bool active = rt < a.row_tiles;
  const int64_t c_begin = part_begin(a.col_chunks, splits, split);
  const int64_t c_end = part_begin(a.col_chunks, splits, split + 1);
  constexpr int64_t kGroup = quant::block_format_traits(F).group_size;
  static_assert(gpu_layout_supports(kGroup), "groups must be whole lanes of a chunk (gpu_layout.h)");
  constexpr int slots = static_cast<int>(gpu_scale_slots(kGroup));
  const int slot = lane / static_cast<int>(gpu_lanes_per_scale_slot(kGroup));

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
    if constexpr (kAsync) {
      // ring[warp][stage][chunk][lane]: lane-private 16-byte slots (a lane reads back only what it copied).
      __shared__ uint4 ring[kWarps][kStages][kStageChunks][32];
      const int64_t iterations = (c_end - c_begin + kStageChunks - 1) / kStageChunks;
      auto issue = [&](int64_t it) {
        if (it < iterations) {
#pragma unroll
          for (int u = 0; u < kStageChunks; ++u) {
            const int64_t cc = c_begin + it * kStageChunks + u;
            if (cc < c_end) cp_async16(&ring[warp][it % kStages][u][lane], codes + cc * 128);
          }
        }
        cp_async_commit();  // an empty group for the tail keeps the group count uniform
      };
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st) issue(st);
      for (int64_t it = 0; it < iterations; ++it) {
        issue(it + kStages - 1);
        uint32_t s[kStageChunks];
        uint4 xv[kStageChunks][NT][2];
#pragma unroll
        for (int u = 0; u < kStageChunks; ++u) {
          const int64_t cc = c_begin + it * kStageChunks + u;
          const bool chunk_ok = cc < c_end;
          s[u] = chunk_ok ? __ldg(scales + cc * slots) : 0u;
          load_activations<NT>(xrow, tok_ok, cc, chunk_ok && 64 * cc + 16 * t < a.k, xv[u]);
        }
        cp_async_wait<kStages - 1>();  // the group of iteration `it` has landed
#pragma unroll
        for (int u = 0; u < kStageChunks; ++u) {
          if (c_begin + it * kStageChunks + u >= c_end) break;
          mma_chunk<F, NT>(acc, ring[warp][it % kStages][u][lane], s[u], xv[u]);
        }
      }
      cp_async_wait<0>();
    } else {
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
          // K % 16 == 0: a 16-column run is all in or out.
          load_activations<NT>(xrow, tok_ok, cc, chunk_ok && 64 * cc + 16 * t < a.k, xv[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (c + u >= c_end) break;
          mma_chunk<F, NT>(acc, w[u], s[u], xv[u]);
        }
      }
    }
  }

  // Only the decode variants split K inside the block (the tiled variant is launched with rows_per_block = kWarps).
  if constexpr (NT <= 2) {
    if (warp_splits > 1) {
      __shared__ float partial[kWarps][NT][4][32];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp][nt][i][lane] = acc[nt][i];
      }
      __syncthreads();
      if (warp / rows_per_block != 0) return;
      for (int other = 1; other < warp_splits; ++other) {
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
      if (gridDim.z > 1) {
        a.split_partial[(static_cast<int64_t>(blockIdx.z) * a.m + tok) * a.n + n] = acc[nt][i];
        continue;
      }
      store_output(a, tok, n, acc[nt][i]);
    }
  }
}

// y = epilogue(Σ_z partial[z]) in split order z = 0, 1, … (the same sum on every run).
__global__ void fp4_split_k_reduce(const Fp4GemmArgs a, int splits) {
  const int64_t total = a.m * a.n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = 0.f;
    for (int z = 0; z < splits; ++z) v += a.split_partial[z * total + i];
    store_output(a, i / a.n, i % a.n, v);
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

// The launches of launch_fp4_gemm for block format F.
template <quant::BlockFormat F>
void launch_fp4_gemm_of(const Fp4GemmArgs& args, int multiprocessors, cudaStream_t stream) {
  if (args.m <= 16) {
    const int rows = pick_rows_per_block(args.row_tiles, args.col_chunks, multiprocessors);
    const dim3 grid(static_cast<unsigned>((args.row_tiles + rows - 1) / rows), 1);
    if (args.m <= 8) {
      fp4_mma_kernel<F, 1, 1, true><<<grid, kThreads, 0, stream>>>(args, rows);
    } else {
      fp4_mma_kernel<F, 2, 1, true><<<grid, kThreads, 0, stream>>>(args, rows);
    }
    FP4SERVE_CUDA_CHECK_LAUNCH();
    return;
  }
  int64_t splits = plan_tiled_split_k(args.m, args.row_tiles, args.col_chunks, multiprocessors);
  if (args.split_partial == nullptr || split_k_partial_floats(splits, args.m, args.n) > args.split_partial_floats) {
    splits = 1;
  }
  const dim3 grid(static_cast<unsigned>((args.row_tiles + kWarps - 1) / kWarps),
                  static_cast<unsigned>((args.m + 63) / 64), static_cast<unsigned>(splits));
  fp4_mma_kernel<F, 8, 1, false><<<grid, kThreads, 0, stream>>>(args, kWarps);
  FP4SERVE_CUDA_CHECK_LAUNCH();
  if (splits > 1) {
    const int64_t blocks = std::min<int64_t>((args.m * args.n + 255) / 256, 8L * std::max(multiprocessors, 1));
    fp4_split_k_reduce<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(args, static_cast<int>(splits));
    FP4SERVE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void launch_fp4_gemm(const Fp4GemmArgs& args, int multiprocessors, cudaStream_t stream) {
  if (args.m <= 0) return;
  quant::visit_block_format(args.format,
                            [&]<quant::BlockFormat F>() { launch_fp4_gemm_of<F>(args, multiprocessors, stream); });
}

}  // namespace fp4serve::kernels::cuda
