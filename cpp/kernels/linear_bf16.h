// A bfloat16 GEMM with float32 sums for the bfloat16 deformable convolutions (kernels/deform_conv2d.h,
// deform_conv2d_bf16_products) of the ORT library and of the torch library, on CPUs with AVX512-BF16:
//
//   c[i * c_row + j * c_col] = bf16(sum_k a[i, k] * b[j, k] + bias[j])   for i < n, j < m
//
// a [n, k] and b [m, k] row-major (rows lda and ldb apart), bias [m] or null, all bfloat16; the sums in float32, the
// products exact (two bfloat16 significands fit in a float32 one), added a pair of k at a time, the odd element of
// the pair first (the order of vdpbf16ps); the result rounded once to nearest even (NaN stays NaN). On CPUs with
// AVX512-BF16 by vdpbf16ps, 16 outputs a register (which reads subnormal inputs as zero and flushes subnormal sums:
// the float32 sums otherwise bit for bit the portable loop's); on CPUs with AMX-BF16 tiles (Intel Xeons since
// Sapphire Rapids, Linux) by TDPBF16PS, 16 x 16 outputs a tile (float32 sums too, subnormals flushed likewise, the
// pair's elements added in the tile unit's order: within the float32 bound of the sums, not always the loop's bits);
// elsewhere by that loop. Runs on the calling thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/float16.h"
#include "kernels/scratch.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#include <cpuid.h>
#include <immintrin.h>
#define OPBRIDGE_LINEAR_BF16_INSTRUCTIONS 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define OPBRIDGE_LINEAR_BF16_AMX 1  // the tiles need the kernel's permission (arch_prctl): Linux 5.16 and newer
#endif
#endif

namespace opbridge::kernels {

// Panels of 16 rows of b, k in pairs: panel[(p * 16 + j) * 2 + e] = b[panel_first + j, 2p + e], zeros past m and k
// (pairs padded to a multiple of 16: whole AMX tiles of 16 pairs, 64 bytes a pair).
constexpr int64_t kLinearPanel = 16;

inline float bf16_value(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// The portable sums of one output: pairs of k in order, the odd element first. Not loop-vectorized: GCC 11 and 12
// vectorize this reduction chain (two additions to one sum an iteration, the second element's first) into wrong
// sums (1.28 for 0.288 on 576 products at -O3), which the kernel test caught.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-vectorize")))
#endif
inline float linear_bf16_sum(const uint16_t* a, const uint16_t* b, int64_t k) {
  float sum = 0.0f;
  int64_t p = 0;
  for (; p + 2 <= k; p += 2) {
    sum += bf16_value(a[p + 1]) * bf16_value(b[p + 1]);
    sum += bf16_value(a[p]) * bf16_value(b[p]);
  }
  if (p < k) {
    sum += 0.0f;  // the pair's missing odd element (times zero), as the vector path adds it
    sum += bf16_value(a[p]) * bf16_value(b[p]);
  }
  return sum;
}

#if defined(OPBRIDGE_LINEAR_BF16_INSTRUCTIONS)
// vdpbf16ps %zmm<m>, %zmm<v>, %zmm<d> (d += pairs of v times pairs of m) as bytes: the assemblers of the toolchains
// the wheels are built with predate the mnemonic (as for vcvtneps2bf16 in deform_conv2d.h). Register numbers are
// constant expressions the assembler evaluates: EVEX.512.F3.0F38.W0 52 /r.
#define OPBRIDGE_DPBF16(d, v, m)                                                                        \
  ".byte 0x62, ((((~(" #d "))>>3)&1)<<7)|((((~(" #m "))>>4)&1)<<6)|((((~(" #m "))>>3)&1)<<5)|((((~(" #d \
  "))>>4)&1)<<4)|2, "                                                                                   \
  "(((~(" #v "))&15)<<3)|6, 0x40|((((~(" #v "))>>4)&1)<<3), 0x52, 0xc0|(((" #d ")&7)<<3)|((" #m ")&7)"

// Rows [0, R) of a's tile against two panels (32 outputs): sums[r * 32 + j]. Row r's sums in zmm(2r) and zmm(2r+1),
// the panels' pair in zmm24 and zmm25, the row's pair of a broadcast in zmm26 (register variables: the operands
// the instruction bytes name).
// clang-format off
#define OPBRIDGE_TILE_ROWS(X)                                                                                 \
  X(0, 0, 1) X(1, 2, 3) X(2, 4, 5) X(3, 6, 7) X(4, 8, 9) X(5, 10, 11) X(6, 12, 13) X(7, 14, 15) X(8, 16, 17) \
  X(9, 18, 19) X(10, 20, 21) X(11, 22, 23)
// clang-format on
#define OPBRIDGE_TILE_STEP(r, s0, s1)                                                                           \
  if constexpr (R > r) {                                                                                        \
    register __m512i pair_of_a asm("zmm26") = _mm512_set1_epi32(linear_bf16_pair(a + r * lda + column, alone)); \
    asm(OPBRIDGE_DPBF16(s0, 26, 24) : "+v"(sums##s0) : "v"(pair_of_a), "v"(panel0));                            \
    asm(OPBRIDGE_DPBF16(s1, 26, 25) : "+v"(sums##s1) : "v"(pair_of_a), "v"(panel1));                            \
  }
#define OPBRIDGE_TILE_STORE(r, s0, s1)              \
  if constexpr (R > r) {                            \
    _mm512_storeu_ps(sums + r * 32, sums##s0);      \
    _mm512_storeu_ps(sums + r * 32 + 16, sums##s1); \
  }

// The pair of k at `at` as one 32-bit word (the low half the even element), or the last element alone (its pair's
// odd half zero: nothing read past the row). Inlined even unoptimized: GCC keeps a register variable's register only
// at the asm that names it, and a call between its assignment and that asm may clobber it (GCC's manual, "Local
// Register Variables"), so nothing in the tile's loop is a call.
typedef int32_t linear_bf16_word __attribute__((aligned(1), may_alias));
[[gnu::always_inline]] inline int32_t linear_bf16_pair(const uint16_t* at, bool alone) {
  return alone ? static_cast<int32_t>(at[0]) : *reinterpret_cast<const linear_bf16_word*>(at);
}

template <int R>
__attribute__((target("avx512f"))) void linear_bf16_tile(const uint16_t* a, int64_t lda, const uint16_t* panels,
                                                         int64_t panel_stride, int64_t k, float* sums) {
  register __m512 sums0 asm("zmm0") = _mm512_setzero_ps();
  register __m512 sums1 asm("zmm1") = _mm512_setzero_ps();
  register __m512 sums2 asm("zmm2") = _mm512_setzero_ps();
  register __m512 sums3 asm("zmm3") = _mm512_setzero_ps();
  register __m512 sums4 asm("zmm4") = _mm512_setzero_ps();
  register __m512 sums5 asm("zmm5") = _mm512_setzero_ps();
  register __m512 sums6 asm("zmm6") = _mm512_setzero_ps();
  register __m512 sums7 asm("zmm7") = _mm512_setzero_ps();
  register __m512 sums8 asm("zmm8") = _mm512_setzero_ps();
  register __m512 sums9 asm("zmm9") = _mm512_setzero_ps();
  register __m512 sums10 asm("zmm10") = _mm512_setzero_ps();
  register __m512 sums11 asm("zmm11") = _mm512_setzero_ps();
  register __m512 sums12 asm("zmm12") = _mm512_setzero_ps();
  register __m512 sums13 asm("zmm13") = _mm512_setzero_ps();
  register __m512 sums14 asm("zmm14") = _mm512_setzero_ps();
  register __m512 sums15 asm("zmm15") = _mm512_setzero_ps();
  register __m512 sums16 asm("zmm16") = _mm512_setzero_ps();
  register __m512 sums17 asm("zmm17") = _mm512_setzero_ps();
  register __m512 sums18 asm("zmm18") = _mm512_setzero_ps();
  register __m512 sums19 asm("zmm19") = _mm512_setzero_ps();
  register __m512 sums20 asm("zmm20") = _mm512_setzero_ps();
  register __m512 sums21 asm("zmm21") = _mm512_setzero_ps();
  register __m512 sums22 asm("zmm22") = _mm512_setzero_ps();
  register __m512 sums23 asm("zmm23") = _mm512_setzero_ps();
  const int64_t steps = (k + 1) / 2;  // pairs of k, the last one the odd k's element alone
  for (int64_t p = 0; p < steps; ++p) {
    const int64_t column = 2 * p;
    const bool alone = column + 1 == k;
    register __m512i panel0 asm("zmm24") = _mm512_loadu_si512(panels + p * 2 * kLinearPanel);
    register __m512i panel1 asm("zmm25") = _mm512_loadu_si512(panels + panel_stride + p * 2 * kLinearPanel);
    OPBRIDGE_TILE_ROWS(OPBRIDGE_TILE_STEP)
  }
  OPBRIDGE_TILE_ROWS(OPBRIDGE_TILE_STORE)
}
#undef OPBRIDGE_TILE_ROWS
#undef OPBRIDGE_TILE_STEP
#undef OPBRIDGE_TILE_STORE
#undef OPBRIDGE_DPBF16

// Rows of a in tiles of 12 (24 accumulators, two panel registers and a broadcast: 27 of 32 registers).
constexpr int kLinearRows = 12;

template <int R = kLinearRows>
void linear_bf16_rows(int rows, const uint16_t* a, int64_t lda, const uint16_t* panels, int64_t panel_stride, int64_t k,
                      float* sums) {
  if constexpr (R > 0) {
    if (rows == R) return linear_bf16_tile<R>(a, lda, panels, panel_stride, k, sums);
    return linear_bf16_rows<R - 1>(rows, a, lda, panels, panel_stride, k, sums);
  }
}
#endif

// Whether the instruction path runs on this CPU (AVX512-BF16).
inline bool linear_bf16_has_instructions() {
#if defined(OPBRIDGE_LINEAR_BF16_INSTRUCTIONS)
  return cpu_has_avx512_bf16();
#else
  return false;
#endif
}

// Whether this CPU has AMX-BF16 tiles (CPUID leaf 7, EDX bit 22: Intel Xeons since Sapphire Rapids), where oneDNN's
// bfloat16 GEMM (torch's) runs on them, several times the vdpbf16ps kernel above.
inline bool cpu_has_amx_bf16() {
#if defined(OPBRIDGE_LINEAR_BF16_INSTRUCTIONS)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && ((edx >> 22) & 1u) != 0;
  }();
  return has;
#else
  return false;
#endif
}

#if defined(OPBRIDGE_LINEAR_BF16_AMX)
// Whether this process may use the AMX tiles: the CPU has AMX-BF16 and Linux granted the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once a process; torch's oneDNN asks the same). A kernel
// before 5.16 refuses, as does one that finds an alternate signal stack too small for the tile state: then the
// vdpbf16ps kernel serves.
inline bool linear_bf16_amx_ready() {
  static const bool ready = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;
    return cpu_has_amx_bf16() && cpu_has_avx512_bf16() && syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return ready;
}

// The tile configuration (palette 1): tile t holds rows[t] rows of colsb[t] bytes.
struct alignas(64) LinearBf16TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The AMX instructions as bytes (the wheels' assembler predates them), their operands in fixed registers: tile
// numbers in the bytes, a memory operand's base in rax and its stride (bytes between rows) in rcx.
#define OPBRIDGE_AMX_LOAD_CONFIG(config) asm volatile(".byte 0xc4, 0xe2, 0x78, 0x49, 0x00" ::"a"(config) : "memory")
#define OPBRIDGE_AMX_RELEASE() asm volatile(".byte 0xc4, 0xe2, 0x78, 0x49, 0xc0" ::: "memory")
#define OPBRIDGE_AMX_ZERO(t) asm volatile(".byte 0xc4, 0xe2, 0x7b, 0x49, 0xc0 | (" #t " << 3)" ::: "memory")
#define OPBRIDGE_AMX_LOAD(t, base, stride) \
  asm volatile(".byte 0xc4, 0xe2, 0x7b, 0x4b, 0x04 | (" #t " << 3), 0x08" ::"a"(base), "c"(stride) : "memory")
#define OPBRIDGE_AMX_STORE(t, base, stride) \
  asm volatile(".byte 0xc4, 0xe2, 0x7a, 0x4b, 0x04 | (" #t " << 3), 0x08" ::"a"(base), "c"(stride) : "memory")
// tdpbf16ps: tile c += tile a (rows of pairs of k) times tile b (pairs of k of 16 outputs).
#define OPBRIDGE_AMX_DOT(c, a, b) \
  asm volatile(".byte 0xc4, 0xe2, ((~(" #b ") & 15) << 3) | 2, 0x5c, 0xc0 | (" #c " << 3) | (" #a ")" ::: "memory")

// Tiles: 0-3 the sums (rows [16 b, 16 b + 16) against panel q: tile 2 b + q), 4 and 5 the two blocks of 16 rows of
// a, 6 and 7 the two panels' 16 pairs of k. rows0 (1-16) rows in the first block, rows1 (0-16) in the second.
inline void linear_bf16_amx_configure(int rows0, int rows1) {
  LinearBf16TileConfig config;
  for (int t : {0, 1, 4}) config.rows[t] = static_cast<uint8_t>(rows0), config.colsb[t] = 64;
  if (rows1 > 0) {
    for (int t : {2, 3, 5}) config.rows[t] = static_cast<uint8_t>(rows1), config.colsb[t] = 64;
  }
  for (int t : {6, 7}) config.rows[t] = 16, config.colsb[t] = 64;
  OPBRIDGE_AMX_LOAD_CONFIG(&config);
}

// The configured rows of a against two panels (32 outputs): sums[r * 32 + j]. Chunks of 32 k: the first `whole` read
// from a (rows lda apart), the rest (one, where k is not a multiple of 32) from `tail` (32 rows of 32, zeros past k).
inline void linear_bf16_amx_block(bool rows1, const uint16_t* a, int64_t lda, const uint16_t* tail, int64_t whole,
                                  int64_t chunks, const uint16_t* panels, int64_t panel_stride, float* sums) {
  constexpr int64_t kChunk = 16 * 2 * kLinearPanel;  // a chunk's 16 pairs of a panel, 1 KiB
  constexpr int64_t kPairBytes = 2 * 2 * kLinearPanel, kSumsBytes = 32 * sizeof(float);
  OPBRIDGE_AMX_ZERO(0);
  OPBRIDGE_AMX_ZERO(1);
  if (rows1) {
    OPBRIDGE_AMX_ZERO(2);
    OPBRIDGE_AMX_ZERO(3);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const bool from_a = c < whole;
    const uint16_t* rows = from_a ? a + c * 32 : tail;
    const int64_t row_bytes = from_a ? lda * int64_t(sizeof(uint16_t)) : 64, second = from_a ? 16 * lda : 16 * 32;
    OPBRIDGE_AMX_LOAD(4, rows, row_bytes);
    OPBRIDGE_AMX_LOAD(6, panels + c * kChunk, kPairBytes);
    OPBRIDGE_AMX_LOAD(7, panels + panel_stride + c * kChunk, kPairBytes);
    OPBRIDGE_AMX_DOT(0, 4, 6);
    OPBRIDGE_AMX_DOT(1, 4, 7);
    if (rows1) {
      OPBRIDGE_AMX_LOAD(5, rows + second, row_bytes);
      OPBRIDGE_AMX_DOT(2, 5, 6);
      OPBRIDGE_AMX_DOT(3, 5, 7);
    }
  }
  OPBRIDGE_AMX_STORE(0, sums, kSumsBytes);
  OPBRIDGE_AMX_STORE(1, sums + 16, kSumsBytes);
  if (rows1) {
    OPBRIDGE_AMX_STORE(2, sums + 16 * 32, kSumsBytes);
    OPBRIDGE_AMX_STORE(3, sums + 16 * 32 + 16, kSumsBytes);
  }
}
inline void linear_bf16_amx_release() { OPBRIDGE_AMX_RELEASE(); }
#undef OPBRIDGE_AMX_LOAD_CONFIG
#undef OPBRIDGE_AMX_RELEASE
#undef OPBRIDGE_AMX_ZERO
#undef OPBRIDGE_AMX_LOAD
#undef OPBRIDGE_AMX_STORE
#undef OPBRIDGE_AMX_DOT
#else
inline bool linear_bf16_amx_ready() { return false; }
#endif

// The GEMM's kernels: `best` is the widest this CPU runs (AMX tiles, else vdpbf16ps, else the portable loop); the
// others name one (the tests compare them), falling back to the next narrower where the CPU lacks it.
enum class LinearBf16Kernel { best, portable, dpbf16, amx };

// Whether bfloat16 deformable convolutions multiply in bfloat16 (deform_conv2d_bf16_products) on this CPU: where it
// has AVX512-BF16, or as OPBRIDGE_CPU_BF16_GEMM=0 or 1 says (1 without the instructions: correct and slow), read
// once. The torch library (cpp/torch/cpu_gemm.h) and the ORT library both ask this;
// python/opbridge/ops/deform_conv2d.py mirrors it.
inline bool bf16_products_chosen() {
  static const bool chosen = [] {
    if (const char* forced = std::getenv("OPBRIDGE_CPU_BF16_GEMM")) {
      if (std::strcmp(forced, "0") == 0) return false;
      if (std::strcmp(forced, "1") == 0) return true;
      std::fprintf(stderr, "opbridge: OPBRIDGE_CPU_BF16_GEMM=%s is not one of 0, 1; ignored\n", forced);
    }
    return cpu_has_avx512_bf16();  // whatever the compiler (without the instruction path: the portable loop)
  }();
  return chosen;
}

struct LinearBf16Pool;

// b [m, k] packed for the instruction paths: panels of kLinearPanel rows, k in pairs,
// data[panel * panel_stride + (p * 16 + j) * 2 + e] = b[panel * 16 + j, 2p + e], zeros past m and k (pairs padded to a
// multiple of 16, and one panel more, so that outputs go by pairs of panels). Empty where the portable loop runs (no
// AVX512-BF16, k = 0, or asked for): linear_bf16 then reads b as it is.
class LinearBf16Weights {
 public:
  LinearBf16Weights(const uint16_t* b, int64_t ldb, int64_t m, int64_t k,
                    LinearBf16Kernel kernel = LinearBf16Kernel::best)
      : b_(b), ldb_(ldb), m_(m), k_(k) {
#if defined(OPBRIDGE_LINEAR_BF16_INSTRUCTIONS)
    if (kernel == LinearBf16Kernel::portable || !linear_bf16_has_instructions() || k <= 0 || m <= 0) return;
    kernel_ = (kernel == LinearBf16Kernel::best || kernel == LinearBf16Kernel::amx) && linear_bf16_amx_ready()
                  ? LinearBf16Kernel::amx
                  : LinearBf16Kernel::dpbf16;
    const int64_t pairs = (k + 31) / 32 * 16, panels = (m + kLinearPanel - 1) / kLinearPanel + 1;
    panel_stride_ = pairs * 2 * kLinearPanel;
    data_ = AlignedArray<uint16_t>(static_cast<size_t>(panels * panel_stride_));
    uint16_t* packed = data_.get();
    std::memset(packed, 0, sizeof(uint16_t) * static_cast<size_t>(panels * panel_stride_));
    // A panel's pairs in order, so that the writes are sequential (a row at a time wrote 2 bytes a 64-byte pair row
    // apart: 0.95 ms for 256 x 2304 on an Intel Xeon, a tenth of the bfloat16 node's GEMM).
    for (int64_t first = 0; first < m; first += kLinearPanel) {
      uint16_t* to = packed + first / kLinearPanel * panel_stride_;
      const uint16_t* from = b + first * ldb;
      const int64_t rows = std::min<int64_t>(kLinearPanel, m - first);
      for (int64_t pair = 0; pair < k / 2; ++pair) {
        for (int64_t j = 0; j < rows; ++j)
          std::memcpy(to + (pair * kLinearPanel + j) * 2, from + j * ldb + 2 * pair, 4);
      }
      if (k % 2 != 0) {
        for (int64_t j = 0; j < rows; ++j) to[(k / 2 * kLinearPanel + j) * 2] = from[j * ldb + k - 1];
      }
    }
#else
    (void)kernel;
#endif
  }
  bool packed() const { return data_.get() != nullptr; }
  // The kernel that multiplies by these weights: portable, dpbf16 or amx.
  LinearBf16Kernel kernel() const { return kernel_; }
  bool same(const uint16_t* b, int64_t ldb, int64_t m, int64_t k) const {
    return b == b_ && ldb == ldb_ && m == m_ && k == k_;
  }

 private:
  friend void linear_bf16(int64_t, const LinearBf16Weights&, const uint16_t*, int64_t, const uint16_t*, uint16_t*,
                          int64_t, int64_t);
  const uint16_t* b_;
  int64_t ldb_, m_, k_, panel_stride_ = 0;
  LinearBf16Kernel kernel_ = LinearBf16Kernel::portable;
  AlignedArray<uint16_t> data_;
};

// The GEMM above for weights packed once (deform_conv2d multiplies every block of columns by the same weights).
inline void linear_bf16(int64_t n, const LinearBf16Weights& w, const uint16_t* a, int64_t lda, const uint16_t* bias,
                        uint16_t* c, int64_t c_row, int64_t c_col) {
  const int64_t m = w.m_, k = w.k_;
  if (n <= 0 || m <= 0) return;
#if defined(OPBRIDGE_LINEAR_BF16_INSTRUCTIONS)
  if (w.packed()) {
    // Rounded results pixel-major ([n, m]) where c's rows are its columns (c_row 1: deform_conv2d's output planes),
    // then transposed in tiles: stores an output plane apart (often a multiple of 4 KiB) per element thrashed the
    // cache (the C64 128x128 forward's GEMMs took 2x as long).
    const bool transposed = c_row == 1 && c_col != 1;
    BasicThreadScratch<LinearBf16Pool, 1> result_memory(transposed ? sizeof(uint16_t) * static_cast<size_t>(n * m) : 0);
    uint16_t* result = transposed ? result_memory.get<uint16_t>() : c;
    const int64_t result_row = transposed ? m : c_row, result_col = transposed ? 1 : c_col;
    alignas(64) float sums[32 * 32];  // a block's sums, rows 32 apart: 12 rows (vdpbf16ps) or 32 (AMX)
    float bias_values[32];
    // Rows [i0, i0 + rows) of the block of outputs [first, first + 32), from sums, plus the bias, rounded once.
    const auto write = [&](int64_t i0, int rows, int64_t first) {
      const int64_t outputs = std::min<int64_t>(32, m - first);
      for (int64_t j = 0; j < outputs; ++j) bias_values[j] = bias != nullptr ? bf16_value(bias[first + j]) : 0.0f;
      for (int r = 0; r < rows; ++r) {
        const float* row = sums + r * 32;
        uint16_t* to = result + (i0 + r) * result_row + first * result_col;
        if (result_col == 1 && bias != nullptr) {  // contiguous: a loop the compiler vectorizes
          for (int64_t j = 0; j < outputs; ++j) to[j] = bf16_bits(row[j] + bias_values[j]);
        } else if (result_col == 1) {
          for (int64_t j = 0; j < outputs; ++j) to[j] = bf16_bits(row[j]);
        } else {
          for (int64_t j = 0; j < outputs; ++j) {
            to[j * result_col] = bf16_bits(bias != nullptr ? row[j] + bias_values[j] : row[j]);
          }
        }
      }
    };
#if defined(OPBRIDGE_LINEAR_BF16_AMX)
    if (w.kernel_ == LinearBf16Kernel::amx) {
      // Blocks of 32 rows of a (in the L2 cache) against every pair of panels; k in chunks of 32, the last one's
      // rows copied with zeros past k (a tile reads whole pairs: nothing past a row, and no 0 * inf).
      alignas(64) uint16_t tail[32 * 32];
      const int64_t whole = k / 32, chunks = (k + 31) / 32;
      int configured = -1;
      for (int64_t i0 = 0; i0 < n; i0 += 32) {
        const int rows = static_cast<int>(std::min<int64_t>(32, n - i0)), rows0 = std::min(rows, 16);
        if (rows != configured) linear_bf16_amx_configure(rows0, rows - rows0), configured = rows;
        if (chunks > whole) {
          std::memset(tail, 0, sizeof tail);
          for (int r = 0; r < rows; ++r) {
            std::memcpy(tail + r * 32, a + (i0 + r) * lda + whole * 32, sizeof(uint16_t) * (k - whole * 32));
          }
        }
        for (int64_t first = 0; first < m; first += 2 * kLinearPanel) {
          linear_bf16_amx_block(rows > 16, a + i0 * lda, lda, tail, whole, chunks,
                                w.data_.get() + first / kLinearPanel * w.panel_stride_, w.panel_stride_, sums);
          write(i0, rows, first);
        }
      }
      linear_bf16_amx_release();
      if (transposed) transpose_halves(result, m, c, c_col, n, m);
      return;
    }
#endif
    for (int64_t panel = 0; panel * kLinearPanel < m; panel += 2) {
      const uint16_t* panels = w.data_.get() + panel * w.panel_stride_;
      for (int64_t i0 = 0; i0 < n; i0 += kLinearRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kLinearRows, n - i0));
        linear_bf16_rows(rows, a + i0 * lda, lda, panels, w.panel_stride_, k, sums);
        write(i0, rows, panel * kLinearPanel);
      }
    }
    if (transposed) transpose_halves(result, m, c, c_col, n, m);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      const float sum = linear_bf16_sum(a + i * lda, w.b_ + j * w.ldb_, k);
      c[i * c_row + j * c_col] = bf16_bits(bias != nullptr ? sum + bf16_value(bias[j]) : sum);
    }
  }
}

// linear_bf16 with each b packed once, by the first call that multiplies by it (deform_conv2d_bf16_products calls it
// once per block of columns and weight group, from the tasks of one forward: a lock around the lookup). b is known
// by its address and shape: an instance lives for one forward, whose weights stay where they are.
class LinearBf16Packing {
 public:
  template <class H>
  void operator()(int64_t n, int64_t m, int64_t k, const H* a, int64_t lda, const H* b, int64_t ldb, const H* bias,
                  H* c, int64_t c_row, int64_t c_col) {
    static_assert(sizeof(H) == sizeof(uint16_t), "bfloat16 bits");
    const auto* from = reinterpret_cast<const uint16_t*>(b);
    const LinearBf16Weights* weights = nullptr;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& entry : packed_) {
        if (entry->same(from, ldb, m, k)) weights = entry.get();
      }
      if (weights == nullptr) {
        packed_.push_back(std::make_unique<LinearBf16Weights>(from, ldb, m, k));
        weights = packed_.back().get();
      }
    }
    linear_bf16(n, *weights, reinterpret_cast<const uint16_t*>(a), lda, reinterpret_cast<const uint16_t*>(bias),
                reinterpret_cast<uint16_t*>(c), c_row, c_col);
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<LinearBf16Weights>> packed_;
};

// The GEMM above in one call (b packed for it, then dropped); `kernel` names one (the tests compare them).
inline void linear_bf16(int64_t n, int64_t m, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                        const uint16_t* bias, uint16_t* c, int64_t c_row, int64_t c_col,
                        LinearBf16Kernel kernel = LinearBf16Kernel::best) {
  if (n <= 0 || m <= 0) return;
  linear_bf16(n, LinearBf16Weights(b, ldb, m, k, kernel), a, lda, bias, c, c_row, c_col);
}

}  // namespace opbridge::kernels
