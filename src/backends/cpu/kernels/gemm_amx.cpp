// SPDX-License-Identifier: Apache-2.0
// ActivationPrecision::Bf16 GEMMs on Intel AMX tiles (linear.h: AmxUse, amx_status).
//
// The weights come from the bf16 panel GEMM's decoder (decode_bf16_panel): 32 output rows × pairs of K columns,
// exact in bf16 (FP4, bf16 Dense; FP8 / Int8: code · scale, Int4: (q − z)·s, rounded to bf16). That is already the layout TDPBF16PS takes as its B operand (16 rows of K pairs × 16 output
// columns, 4 bytes each): a B tile is one half of a panel's width at a row stride of 128 bytes. x is rounded to
// bf16 pairs once per call and is the A operand (16 rows × 32 columns of K, at x's row stride). Per thread,
// groups of panels are swept in the bf16 panel GEMM's order: for each block of 256 columns of K, every panel of
// the group is decoded once (16 KiB, in L1) and multiplied with all rows of x, two row blocks × two column halves
// (four fp32 accumulator tiles) per step; partial sums live in y between K blocks, the epilogue (global scale,
// bias) runs after the last.
//
// Why bf16 tiles and not int8 ones (TDPBSSD, twice the multiply-adds per instruction): an NVFP4 weight needs its
// E4M3 block scale every 16 columns of K, so an int8 tile would stop every 16 columns to scale its sums (as the VNNI
// int8 kernel's epilogue does), while E2M1 · block scale is exact in bf16 and a bf16 tile sums over all of K.
#include <fmt/format.h>
#include <hwy/aligned_allocator.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define FP4SERVE_AMX_BUILD 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#else
#define FP4SERVE_AMX_BUILD 0
#endif

namespace fp4serve::kernels {
namespace {

std::atomic<AmxUse> amx_use{AmxUse::Hardware};

#if FP4SERVE_AMX_BUILD

#define FP4SERVE_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define FP4SERVE_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

// Linux's names (asm/prctl.h, kernel 5.16+), spelled out for older headers.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

constexpr int64_t kTileRowsAmx = 16;   // rows of an A / C tile
constexpr int64_t kTileK = 32;         // columns of K per TDPBF16PS (64 bytes of bf16 per A row)
constexpr int64_t kKBlock = 256;       // columns of K decoded per panel block (the panel: 16 KiB)
constexpr int64_t kPanelWidth = 32;    // decode_bf16_panel's R on AVX-512: two B tiles of 16 output columns
constexpr int64_t kBlockRows = 2 * kTileRowsAmx;

// LDTILECFG's 64-byte operand, palette 1 (Intel SDM vol. 2, LDTILECFG): every tile 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = static_cast<uint8_t>(kTileRowsAmx);
  }
  return c;
}

// The tile instructions. GCC's intrinsics are macros that paste the tile number into the instruction text, so a
// template parameter cannot name the tile: each op spells out the numbers the micro-kernel uses. Their asm tells
// the compiler neither what memory it reads nor what it writes, so each op is a compiler barrier.
struct HardwareTiles {
  FP4SERVE_AMX_TARGET static void configure(const TileConfig& c) {
    asm volatile("" ::: "memory");  // GCC 12's ldtilecfg operand covers 8 of the 64 bytes
    _tile_loadconfig(&c);
  }
  FP4SERVE_AMX_TARGET static void release() { _tile_release(); }
  template <int T>
  FP4SERVE_AMX_TARGET static void zero() {
    if constexpr (T == 0) _tile_zero(0);
    else if constexpr (T == 1) _tile_zero(1);
    else if constexpr (T == 2) _tile_zero(2);
    else { static_assert(T == 3); _tile_zero(3); }
  }
  template <int T>
  FP4SERVE_AMX_TARGET static void load(const void* p, int64_t stride) {
    asm volatile("" ::: "memory");
    if constexpr (T == 0) _tile_loadd(0, p, stride);
    else if constexpr (T == 1) _tile_loadd(1, p, stride);
    else if constexpr (T == 2) _tile_loadd(2, p, stride);
    else if constexpr (T == 3) _tile_loadd(3, p, stride);
    else if constexpr (T == 4) _tile_loadd(4, p, stride);
    else if constexpr (T == 5) _tile_loadd(5, p, stride);
    else if constexpr (T == 6) _tile_loadd(6, p, stride);
    else { static_assert(T == 7); _tile_loadd(7, p, stride); }
  }
  template <int T>
  FP4SERVE_AMX_TARGET static void store(void* p, int64_t stride) {
    if constexpr (T == 0) _tile_stored(0, p, stride);
    else if constexpr (T == 1) _tile_stored(1, p, stride);
    else if constexpr (T == 2) _tile_stored(2, p, stride);
    else { static_assert(T == 3); _tile_stored(3, p, stride); }
    asm volatile("" ::: "memory");
  }
  template <int C, int A, int B>
  FP4SERVE_AMX_TARGET static void dot() {
    if constexpr (C == 0 && A == 4 && B == 6) _tile_dpbf16ps(0, 4, 6);
    else if constexpr (C == 1 && A == 4 && B == 7) _tile_dpbf16ps(1, 4, 7);
    else if constexpr (C == 2 && A == 5 && B == 6) _tile_dpbf16ps(2, 5, 6);
    else { static_assert(C == 3 && A == 5 && B == 7); _tile_dpbf16ps(3, 5, 7); }
  }
};

// The same ops in C++ after the Intel SDM's descriptions (vol. 2: TILELOADD, TILESTORED, TILEZERO, TDPBF16PS with
// DAZ inputs; LDTILECFG and TILERELEASE clear the tiles): AmxUse::Emulated, for tests on CPUs without AMX. Which
// products meet which sums, and where, is the instruction's; the order of the fp32 additions inside one TDPBF16PS
// (and FTZ of its results) may differ from the hardware's, which the tests' fp32 bound covers.
struct EmulatedTiles {
  struct State {
    TileConfig config;
    alignas(64) uint8_t tile[8][16][64] = {};
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void configure(const TileConfig& c) {
    state() = State{};
    state().config = c;
  }
  static void release() { state() = State{}; }
  template <int T>
  static void zero() {
    std::memset(state().tile[T], 0, sizeof(state().tile[T]));
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    State& s = state();
    std::memset(s.tile[T], 0, sizeof(s.tile[T]));
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(s.tile[T][r], static_cast<const uint8_t*>(p) + r * stride, s.config.colsb[T]);
    }
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    const State& s = state();
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.tile[T][r], s.config.colsb[T]);
    }
  }
  // make_fp32 with DAZ: a subnormal bf16 reads as zero of its sign.
  static float bf16_daz(const uint8_t* p) {
    uint16_t h = 0;
    std::memcpy(&h, p, 2);
    if ((h & 0x7F80) == 0) h &= 0x8000;
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f = 0;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  template <int C, int A, int B>
  static void dot() {
    State& s = state();
    const int rows = s.config.rows[C], n_cols = s.config.colsb[C] / 4, pairs = s.config.colsb[A] / 4;
    for (int m = 0; m < rows; ++m) {
      for (int k = 0; k < pairs; ++k) {
        for (int n = 0; n < n_cols; ++n) {
          float acc = 0;
          std::memcpy(&acc, &s.tile[C][m][4 * n], 4);
          acc += bf16_daz(&s.tile[A][m][4 * k]) * bf16_daz(&s.tile[B][k][4 * n]);
          acc += bf16_daz(&s.tile[A][m][4 * k + 2]) * bf16_daz(&s.tile[B][k][4 * n + 2]);
          std::memcpy(&s.tile[C][m][4 * n], &acc, 4);
        }
      }
    }
  }
};

// C (+)= A · B for kRowBlocks blocks of 16 rows of x and the 32 output columns of a panel: a [rows][lda] bf16
// pairs (words), b the panel (kc/2 rows of 32 words), c [rows][ldc] fp32; kc a multiple of kTileK.
// Tiles: C 0–3 (row block i, column half j: 2i + j), A 4–5, B 6–7.
// The AMX target lets GCC inline HardwareTiles' ops here (one basic block of tile instructions instead of a call
// per instruction); the EmulatedTiles instantiation uses no AMX instruction.
template <class Tiles, int kRowBlocks>
FP4SERVE_AMX_TARGET void TileStep(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t kc, float* c, int64_t ldc, bool load_c) {
  const int64_t sa = lda * 4, sc = ldc * 4, sb = kPanelWidth * 4;
  float* c1 = c + kTileRowsAmx * ldc;
  if (load_c) {
    Tiles::template load<0>(c, sc);
    Tiles::template load<1>(c + 16, sc);
    if constexpr (kRowBlocks == 2) {
      Tiles::template load<2>(c1, sc);
      Tiles::template load<3>(c1 + 16, sc);
    }
  } else {
    Tiles::template zero<0>();
    Tiles::template zero<1>();
    if constexpr (kRowBlocks == 2) {
      Tiles::template zero<2>();
      Tiles::template zero<3>();
    }
  }
  for (int64_t kk = 0; kk < kc; kk += kTileK) {
    const uint32_t* bk = b + (kk / 2) * kPanelWidth;
    Tiles::template load<6>(bk, sb);
    Tiles::template load<7>(bk + 16, sb);
    Tiles::template load<4>(a + kk / 2, sa);
    Tiles::template dot<0, 4, 6>();
    Tiles::template dot<1, 4, 7>();
    if constexpr (kRowBlocks == 2) {
      Tiles::template load<5>(a + kTileRowsAmx * lda + kk / 2, sa);
      Tiles::template dot<2, 5, 6>();
      Tiles::template dot<3, 5, 7>();
    }
  }
  Tiles::template store<0>(c, sc);
  Tiles::template store<1>(c + 16, sc);
  if constexpr (kRowBlocks == 2) {
    Tiles::template store<2>(c1, sc);
    Tiles::template store<3>(c1 + 16, sc);
  }
}

// Row i of x [m][k] fp32 → row i of xp [m_pad][ldx] bf16 pairs (nearest even, as vcvtne2ps2bf16), columns past k
// zero, all of it zero for a row past m.
FP4SERVE_BF16_TARGET void RoundRow(const float* x, int64_t i, int64_t m, int64_t k, int64_t ldx, uint32_t* xp) {
  uint32_t* row = xp + i * ldx;
  int64_t done = 0;
  if (i < m) {
    for (; done < k; done += 16) {
      const __m256i pairs = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i * k + done)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + done / 2), pairs);
    }
  }
  std::memset(row + done / 2, 0, static_cast<size_t>(ldx - done / 2) * sizeof(uint32_t));
}

// apply_epilogue (gemm_shared.h) on rows × cols of c from output row n0: divide or multiply by the global scale,
// then add the bias (GCC may fuse a multiplication and the bias into one FMA, as the panel GEMM's EpilogueRow may).
FP4SERVE_BF16_TARGET void EpilogueBlock(const prepare::PreparedLinear& w, int64_t n0, int64_t cols, float* c, int64_t ldc,
                                       int64_t rows) {
  const bool scaled = !w.global_scale.empty(), biased = !w.bias.empty();
  if (!scaled && !biased) return;
  const bool divisor = w.convention == prepare::GlobalScaleConvention::Divisor;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 mask = cols - j >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (cols - j)) - 1);
      __m512 v = _mm512_maskz_loadu_ps(mask, c + i * ldc + j);
      if (scaled) {
        const __m512 g = _mm512_mask_loadu_ps(_mm512_set1_ps(1.f), mask, w.global_scale.data() + n0 + j);
        v = divisor ? _mm512_div_ps(v, g) : _mm512_mul_ps(v, g);
      }
      if (biased) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, w.bias.data() + n0 + j));
      _mm512_mask_storeu_ps(c + i * ldc + j, mask, v);
    }
  }
}

// A per-thread buffer of at least n words, 64-byte aligned (hwy's allocator), grown when a call needs more.
uint32_t* Aligned(hwy::AlignedFreeUniquePtr<uint32_t[]>& buffer, size_t& capacity, size_t n) {
  if (n > capacity) {
    buffer = hwy::AllocateAligned<uint32_t>(n);
    if (!buffer) throw std::bad_alloc();
    capacity = n;
  }
  return buffer.get();
}

template <class Tiles>
void AmxGemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  const int64_t k_total = w.in_features, n_total = w.out_features;
  const int64_t ldx = (k_total + kTileK - 1) / kTileK * kTileK / 2;  // words per row of xp: K padded to kTileK
  const int64_t m_pad = (m + kTileRowsAmx - 1) / kTileRowsAmx * kTileRowsAmx;
  // 64-byte aligned: every tile row is then one cache line.
  thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> pairs;
  thread_local size_t pairs_capacity = 0;
  uint32_t* xp = Aligned(pairs, pairs_capacity, static_cast<size_t>(m_pad * ldx));

  const int64_t panels = (n_total + kPanelWidth - 1) / kPanelWidth;
  const int64_t k_blocks = (k_total + kKBlock - 1) / kKBlock;
  const int64_t threads = omp_get_max_threads();
  const int64_t group_panels = std::max<int64_t>(1, std::min<int64_t>(8, panels / (2 * threads)));
  const int64_t panel_groups = (panels + group_panels - 1) / group_panels;
  const TileConfig config = full_tiles();
  // One region: x is rounded by a worksharing loop whose barrier makes every row ready, then the panels are shared.
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m_pad; ++i) RoundRow(x, i, m, k_total, ldx, xp);
    Tiles::configure(config);
    alignas(64) uint32_t panel[kKBlock / 2 * kPanelWidth];  // 16 KiB on the thread's stack: no allocation here
    alignas(64) float edge[kBlockRows * kPanelWidth];  // a block that is not all inside y
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < panel_groups; ++g) {
      const int64_t p_end = std::min(panels, (g + 1) * group_panels);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const int64_t k0 = kb * kKBlock, kc = std::min(kKBlock, k_total - k0);
        const int64_t kc_tiles = (kc + kTileK - 1) / kTileK * kTileK;  // K % 16 == 0: at most 16 zero columns
        const bool last = kb + 1 == k_blocks;
        for (int64_t p = g * group_panels; p < p_end; ++p) {
          decode_bf16_panel(w, p, k0, kc, panel);
          std::memset(panel + kc / 2 * kPanelWidth, 0, static_cast<size_t>((kc_tiles - kc) / 2 * kPanelWidth) * 4);
          const int64_t n0 = p * kPanelWidth, cols = std::min(kPanelWidth, n_total - n0);
          for (int64_t m0 = 0; m0 < m_pad; m0 += kBlockRows) {
            const int64_t block_rows = std::min(kBlockRows, m_pad - m0), rows = std::min(block_rows, m - m0);
            const uint32_t* a = xp + m0 * ldx + k0 / 2;
            const auto step = [&](float* c, int64_t ldc, bool load_c) {
              if (block_rows == kBlockRows) {
                TileStep<Tiles, 2>(a, ldx, panel, kc_tiles, c, ldc, load_c);
              } else {
                TileStep<Tiles, 1>(a, ldx, panel, kc_tiles, c, ldc, load_c);
              }
            };
            float* yb = y + m0 * n_total + n0;
            if (rows == block_rows && cols == kPanelWidth) {
              step(yb, n_total, kb > 0);  // the block lies inside y: it accumulates there
              if (last) EpilogueBlock(w, n0, cols, yb, n_total, rows);
              continue;
            }
            // Rows past m or columns past N: the sums go through `edge`.
            for (int64_t i = 0; i < block_rows; ++i) {
              float* e = edge + i * kPanelWidth;
              std::memset(e, 0, sizeof(float) * kPanelWidth);
              if (kb > 0 && i < rows) std::memcpy(e, yb + i * n_total, sizeof(float) * static_cast<size_t>(cols));
            }
            step(edge, kPanelWidth, /*load_c=*/true);
            if (last) EpilogueBlock(w, n0, cols, edge, kPanelWidth, rows);
            for (int64_t i = 0; i < rows; ++i) {
              std::memcpy(yb + i * n_total, edge + i * kPanelWidth, sizeof(float) * static_cast<size_t>(cols));
            }
          }
        }
      }
    }
    Tiles::release();
  }
}

// The kernel's micro-step (TileStep, both row-block counts, loading and zeroing C) on small integers at strides
// that are not the tile width: products and sums are exact in fp32, so y must equal the integer result exactly.
// The forked probe runs it on the hardware tiles, so that a wrong tile number or stride in HardwareTiles turns AMX
// off (with the reason) instead of giving wrong logits; tests run it on the emulated tiles.
template <class Tiles>
bool tile_step_check() {
  constexpr int64_t kRows = 32, kK = 64, kLdx = kK / 2 + 8, kLdc = kPanelWidth + 8;
  const auto a_value = [](int64_t i, int64_t k) { return static_cast<int>((7 * i + 3 * k) % 9) - 4; };
  const auto b_value = [](int64_t k, int64_t n) { return static_cast<int>((5 * k + 11 * n) % 7) - 3; };
  const auto c_value = [](int64_t i, int64_t n) { return static_cast<int>((i + n) % 5) - 2; };
  const auto bf16 = [](int v) {
    const float f = static_cast<float>(v);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    return bits >> 16;
  };
  alignas(64) uint32_t a[kRows * kLdx] = {};
  alignas(64) uint32_t b[kK / 2 * kPanelWidth] = {};
  alignas(64) float c[kRows * kLdc] = {};
  alignas(64) float fresh[kTileRowsAmx * kLdc] = {};
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t k = 0; k < kK; k += 2) a[i * kLdx + k / 2] = bf16(a_value(i, k)) | bf16(a_value(i, k + 1)) << 16;
    for (int64_t n = 0; n < kPanelWidth; ++n) c[i * kLdc + n] = static_cast<float>(c_value(i, n));
  }
  for (int64_t k = 0; k < kK; k += 2) {
    for (int64_t n = 0; n < kPanelWidth; ++n) b[k / 2 * kPanelWidth + n] = bf16(b_value(k, n)) | bf16(b_value(k + 1, n)) << 16;
  }
  Tiles::configure(full_tiles());
  TileStep<Tiles, 2>(a, kLdx, b, kK, c, kLdc, /*load_c=*/true);
  TileStep<Tiles, 1>(a + kTileRowsAmx * kLdx, kLdx, b, kK, fresh, kLdc, /*load_c=*/false);
  Tiles::release();
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t n = 0; n < kPanelWidth; ++n) {
      int dot = 0;
      for (int64_t k = 0; k < kK; ++k) dot += a_value(i, k) * b_value(k, n);
      if (c[i * kLdc + n] != static_cast<float>(dot + c_value(i, n))) return false;
      if (i >= kTileRowsAmx && fresh[(i - kTileRowsAmx) * kLdc + n] != static_cast<float>(dot)) return false;
    }
  }
  return true;
}

AmxStatus find_amx_here() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0 || ((d >> 24) & 1U) == 0) return {false, "no"};
  if (((d >> 22) & 1U) == 0) return {false, "present without AMX-BF16, not used (the kernel runs bf16 tiles)"};
  if (!__builtin_cpu_supports("avx512bf16")) return {false, "present, not used: the CPU lacks AVX512-BF16"};
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || ((c >> 27) & 1U) == 0) {
    return {false, "present, not used: the OS has not enabled XSAVE (CPUID.1:ECX.OSXSAVE = 0)"};
  }
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3U << 17)) != (3U << 17)) {
    return {false, fmt::format("present, not used: the OS does not save tile state (XCR0 = {:#x})", xcr0_lo)};
  }
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    return {false, fmt::format("present, not used: Linux refused the tile-data permission "
                               "(arch_prctl(ARCH_REQ_XCOMP_PERM): {})", std::strerror(errno))};
  }
  const pid_t child = fork();
  if (child < 0) return {false, fmt::format("present, not used: could not fork the probe ({})", std::strerror(errno))};
  if (child == 0) {
    // A faulting probe must die at once and quietly: no core dump of the parent's (weights-sized) address space,
    // the default action for the signals a failed tile instruction raises (whatever handlers the embedding process
    // installed), and a watchdog.
    prctl(PR_SET_DUMPABLE, 0);
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    sigset_t faults;
    sigemptyset(&faults);
    for (int sig : {SIGILL, SIGSEGV, SIGBUS, SIGFPE, SIGALRM}) {
      signal(sig, SIG_DFL);
      sigaddset(&faults, sig);
    }
    sigprocmask(SIG_UNBLOCK, &faults, nullptr);
    alarm(5);
    _exit(tile_step_check<HardwareTiles>() ? 0 : 1);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return {false, fmt::format("present, not used: lost the probe ({})", std::strerror(errno))};
  }
  if (WIFSIGNALED(status)) {
    return {false, fmt::format("present, not used: the probe's tile instructions raised signal {}", WTERMSIG(status))};
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return {false, "present, not used: the probe's micro-step gave a wrong result on these tiles (please report it)"};
  }
  return {true, "bf16 tiles (TDPBF16PS) for bf16 GEMMs above the GEMV's rows"};
}

#else

AmxStatus find_amx_here() { return {false, "no (AMX kernels need an x86-64 GCC build)"}; }

#endif

AmxStatus find_amx() {
  const char* env = std::getenv("FP4SERVE_AMX");
  if (env != nullptr && (std::strcmp(env, "off") == 0 || std::strcmp(env, "0") == 0)) {
    return {false, fmt::format("off (FP4SERVE_AMX={})", env)};
  }
  return find_amx_here();
}

}  // namespace

void set_amx_use(AmxUse use) { amx_use.store(use, std::memory_order_relaxed); }

const AmxStatus& amx_status() {
  static const AmxStatus status = find_amx();
  return status;
}

bool amx_active() {
  return amx_use.load(std::memory_order_relaxed) == AmxUse::Hardware && bf16_dot_active() && amx_status().usable;
}

bool amx_tile_step_check_emulated() {
#if FP4SERVE_AMX_BUILD
  return tile_step_check<EmulatedTiles>();
#else
  return false;
#endif
}

bool amx_bf16_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
#if FP4SERVE_AMX_BUILD
  const AmxUse use = amx_use.load(std::memory_order_relaxed);
  if (use == AmxUse::Off || m < 1 || !bf16_dot_usable()) return false;
  if (use == AmxUse::Hardware && !amx_status().usable) return false;
  uint32_t none = 0;
  if (decode_bf16_panel(w, 0, 0, 0, &none) != kPanelWidth) return false;  // kc = 0: asks, writes nothing
  if (use == AmxUse::Emulated) {
    AmxGemm<EmulatedTiles>(w, x, m, y);
  } else {
    AmxGemm<HardwareTiles>(w, x, m, y);
  }
  return true;
#else
  (void)w, (void)x, (void)m, (void)y;
  return false;
#endif
}

}  // namespace fp4serve::kernels
