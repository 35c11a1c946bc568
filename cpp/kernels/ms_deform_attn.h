// Multi-scale deformable attention (Deformable DETR), framework-free: the shape
// checks, the forward and the backward shared by the torch op and the ORT op.
//
// value               [N, S, M, D]      S = sum over levels of H_l * W_l (flattened maps)
// spatial_shapes      [L, 2]  int64     (H_l, W_l)
// level_start_index   [L]     int64     where level l starts in S
// sampling_locations  [N, Lq, M, L, P, 2]   normalized (x, y), 0..1 spans the map
// attention_weights   [N, Lq, M, L, P]
// out                 [N, Lq, M * D]
//
// out[n, q, m, :] = sum over l, p of attention_weights[n, q, m, l, p] *
//   bilinear(value level l of head m, pixel x = loc_x * W_l - 0.5, y = loc_y * H_l - 0.5),
// zero outside the map (grid_sample with align_corners=False, padding_mode="zeros").
// A sample contributes only if -1 < x < W_l and -1 < y < H_l; a NaN location fails
// that test and contributes nothing (as in Deformable DETR's and mmcv's kernels).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#include "kernels/broadcast.h"
#include "kernels/cpu_isa.h"
#include "kernels/device.h"
#include "kernels/float16.h"
#include "kernels/half_convert.h"
#include "kernels/scratch.h"

namespace opbridge::kernels {

struct MSDeformAttnShape {
  int64_t batch = 0, keys = 0, heads = 0, channels = 0, queries = 0, levels = 0, points = 0;
};

// What the CPU forward's task functions write for value storage S (T arithmetic): bfloat16 rows read as stored are
// written as bfloat16, each row's float sums rounded once in registers; otherwise T.
template <class T, class S>
using MSDeformAttnRow = std::conditional_t<std::is_same_v<S, BFloat16>, BFloat16, T>;

// How the calling front end names the op and its inputs in error messages.
struct MSDeformAttnNames {
  const char* op;
  const char* value;
  const char* spatial_shapes;
  const char* level_start_index;
  const char* sampling_locations;
  const char* attention_weights;
};

// Checks the shapes of the five inputs and the level table (the data of spatial_shapes and
// level_start_index, int64, read on the host; null where the table is in device memory, whose values the CUDA
// kernels check) and fills `shape`.
inline Status check_ms_deform_attn(const MSDeformAttnNames& names, const std::vector<int64_t>& value,
                                   const std::vector<int64_t>& spatial_shapes,
                                   const std::vector<int64_t>& level_start_index,
                                   const std::vector<int64_t>& sampling_locations,
                                   const std::vector<int64_t>& attention_weights, const int64_t* spatial_data,
                                   const int64_t* start_data, MSDeformAttnShape& shape) {
  const std::string op = names.op;
  auto fail = [&](const std::string& message) { return Status{op + ": " + message}; };
  if (value.size() != 4) {
    return fail(std::string(names.value) + " must be 4-D [batch, keys, heads, channels], got shape " +
                shape_to_string(value));
  }
  if (spatial_shapes.size() != 2 || spatial_shapes[1] != 2 || spatial_shapes[0] < 1) {
    return fail(std::string(names.spatial_shapes) + " must have shape [levels, 2] with levels >= 1, got " +
                shape_to_string(spatial_shapes));
  }
  const int64_t levels = spatial_shapes[0];
  if (level_start_index.size() != 1 || level_start_index[0] != levels) {
    return fail(std::string(names.level_start_index) + " must have shape [" + std::to_string(levels) +
                "] (one start per level), got " + shape_to_string(level_start_index));
  }
  const std::vector<int64_t> locations_want{value[0], -1, value[2], levels, -1, 2};
  bool locations_ok = sampling_locations.size() == 6;
  for (size_t i = 0; locations_ok && i < 6; ++i) {
    locations_ok = sampling_locations[i] >= 0 && (locations_want[i] < 0 || sampling_locations[i] == locations_want[i]);
  }
  if (!locations_ok) {
    return fail(std::string(names.sampling_locations) + " must have shape [batch " + std::to_string(value[0]) +
                ", queries, heads " + std::to_string(value[2]) + ", levels " + std::to_string(levels) +
                ", points, 2], got " + shape_to_string(sampling_locations));
  }
  const std::vector<int64_t> weights_want(sampling_locations.begin(), sampling_locations.end() - 1);
  if (attention_weights != weights_want) {
    return fail(std::string(names.attention_weights) + " must have shape " + shape_to_string(weights_want) +
                " (sampling_locations' without the last dimension), got " + shape_to_string(attention_weights));
  }
  for (int64_t size : value) {
    if (size < 0) return fail(std::string(names.value) + " has a negative size: " + shape_to_string(value));
  }
  // The level table: non-negative sizes whose areas tile S in order (where its values are on the host: the CUDA
  // kernels check a table in device memory themselves, kernels/ms_deform_attn.cuh).
  constexpr int64_t kMaxSide = int64_t(1) << 31;
  int64_t total = spatial_data != nullptr ? 0 : value[1];
  for (int64_t l = 0; spatial_data != nullptr && l < levels; ++l) {
    const int64_t height = spatial_data[2 * l], width = spatial_data[2 * l + 1];
    if (height < 0 || width < 0 || height >= kMaxSide || width >= kMaxSide) {
      return fail(std::string(names.spatial_shapes) + "[" + std::to_string(l) + "] = (" + std::to_string(height) +
                  ", " + std::to_string(width) + ") must hold non-negative sizes (height, width) below 2^31");
    }
    if (start_data[l] != total) {
      return fail(std::string(names.level_start_index) + "[" + std::to_string(l) +
                  "] = " + std::to_string(start_data[l]) + " must be " + std::to_string(total) +
                  ", the sum of height * width of the levels before it (from " + names.spatial_shapes + ")");
    }
    total += height * width;
    if (total > value[1]) break;  // reported below; stops the sum from overflowing
  }
  if (total != value[1]) {
    return fail("the levels of " + std::string(names.spatial_shapes) + " cover " + std::to_string(total) +
                " keys (sum of height * width), but " + names.value + " has " + std::to_string(value[1]) +
                " (its dimension 1)");
  }
  shape.batch = value[0];
  shape.keys = value[1];
  shape.heads = value[2];
  shape.channels = value[3];
  shape.queries = sampling_locations[1];
  shape.levels = levels;
  shape.points = sampling_locations[4];
  return {};
}

// The (up to) four corners of one bilinear sample that lie inside its level's map. I: the integer type of its
// corners (int64; the CUDA kernels use int32 where value has fewer than 2^30 keys: the same values).
template <class T, class I = int64_t>
struct MSDeformAttnSample {
  I key[4];     // rows of the level in value (start + y * W + x)
  T weight[4];  // bilinear weights
  bool inside[4];
  T high_y, low_y, high_x, low_x;  // 1 - ly, ly, 1 - lx, lx
  bool any = false;
};

template <class T, class I = int64_t>
OPBRIDGE_HD inline MSDeformAttnSample<T, I> ms_deform_attn_sample(T loc_x, T loc_y, I height, I width, I start) {
  MSDeformAttnSample<T, I> s;
  const T x = loc_x * static_cast<T>(width) - T(0.5), y = loc_y * static_cast<T>(height) - T(0.5);
  if (!(x > T(-1) && y > T(-1) && x < static_cast<T>(width) && y < static_cast<T>(height))) return s;  // NaN: out
  // floor(x) for x > -1: truncate x + 1 (cheaper than std::floor), corrected where x + 1 rounded up.
  I x0 = static_cast<I>(x + T(1)) - 1, y0 = static_cast<I>(y + T(1)) - 1;
  x0 -= static_cast<T>(x0) > x;
  y0 -= static_cast<T>(y0) > y;
  s.low_x = x - static_cast<T>(x0);
  s.low_y = y - static_cast<T>(y0);
  s.high_x = T(1) - s.low_x;
  s.high_y = T(1) - s.low_y;
  const bool top = y0 >= 0, bottom = y0 + 1 < height, left = x0 >= 0, right = x0 + 1 < width;
  s.inside[0] = top && left;
  s.inside[1] = top && right;
  s.inside[2] = bottom && left;
  s.inside[3] = bottom && right;
  const I base = start + y0 * width + x0;  // keys of corners outside the map are never read
  s.key[0] = base;
  s.key[1] = base + 1;
  s.key[2] = base + width;
  s.key[3] = base + width + 1;
  s.weight[0] = s.inside[0] ? s.high_y * s.high_x : T(0);
  s.weight[1] = s.inside[1] ? s.high_y * s.low_x : T(0);
  s.weight[2] = s.inside[2] ? s.low_y * s.high_x : T(0);
  s.weight[3] = s.inside[3] ? s.low_y * s.low_x : T(0);
  s.any = true;  // inside (-1, W) x (-1, H) at least one corner is on the map
  return s;
}

// One sample's gradients of its attention weight and location, from dots[c] = g . v_c (the output gradient
// times corner c's value row; zero for a corner off the map) and its attention weight a.
template <class T, class I>
OPBRIDGE_HD inline void ms_deform_attn_sample_grads(const MSDeformAttnSample<T, I>& sample, const T dots[4], T a,
                                                    I height, I width, T& grad_attn, T& grad_x, T& grad_y) {
  grad_attn =
      sample.weight[0] * dots[0] + sample.weight[1] * dots[1] + sample.weight[2] * dots[2] + sample.weight[3] * dots[3];
  // d(sample)/dx = hy * (v01 - v00) + ly * (v11 - v10); x = loc_x * W - 0.5.
  const T dx = sample.high_y * (dots[1] - dots[0]) + sample.low_y * (dots[3] - dots[2]);
  const T dy = sample.high_x * (dots[2] - dots[0]) + sample.low_x * (dots[3] - dots[1]);
  grad_x = a * dx * static_cast<T>(width);
  grad_y = a * dy * static_cast<T>(height);
}

// ---------------------------------------------------------------------------------------------------------------
// The CPU kernels. Per (query, head), the L * P samples' corner rows and weights are computed together, 16 samples
// to a vector (positions, floors, weights, row indices in lanes; the next (query, head)'s while the current one is
// summed), then the corner rows are gathered and summed. The channel loops have a compile-time length for the usual
// head sizes (D = 32 in Deformable DETR, DINO and Mask2Former; 16, 64), so a row is a few whole vector registers.
// The forward runs the (query, head) pairs in the inputs' order, or, where value's rows are gathered many times
// (encoders), head by head on a head-major copy of value (ms_deform_attn_head_major; docs/architecture.md,
// "Performance"): the same bits either way.
//
// The vectors are GCC's generic vector types, as wide as the registers of the instruction set the code is compiled
// for (64 bytes with AVX-512F, 32 with AVX2, 16 baseline). The task functions (ms_deform_attn_forward_task,
// ms_deform_attn_backward_task) are compiled once per instruction set, each in a translation unit of its own with
// that instruction set's flags (cpp/kernels/ms_deform_attn_isa.cc, into a namespace named after it), and the one
// the CPU runs is chosen at run time (kernels/cpu_isa.h: OPBRIDGE_ISA_DISPATCH, cpu_isa). Not GCC's target_clones: a
// clone compiled for AVX-512F under a function attribute lowered the sample loop's vector comparisons one lane at a
// time (1.4x slower than the same code built with -mavx512f), and 64-byte vectors on AVX2 went through the stack
// (7x slower); docs/architecture.md. Without OPBRIDGE_ISA_DISPATCH (the kernel tests, other compilers and CPUs)
// the task functions are compiled here for the including file's own target. Every instruction set does the same
// operations in the same order (no fused multiply-adds: see the build flags; the one sum across lanes, the
// backward's dot, has a fixed 64-byte width), so the results do not depend on the CPU.

// The helpers below pass vectors by value only inlined, so the ABI of a vector argument never applies.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
namespace msda_detail {

template <class T, int N>
struct VectorOf;
#define OPBRIDGE_MSDA_VECTOR(T, N)                              \
  template <>                                                   \
  struct VectorOf<T, N> {                                       \
    typedef T type __attribute__((vector_size(sizeof(T) * N))); \
  };
OPBRIDGE_MSDA_VECTOR(float, 16)
OPBRIDGE_MSDA_VECTOR(double, 16)
OPBRIDGE_MSDA_VECTOR(int32_t, 16)
OPBRIDGE_MSDA_VECTOR(int64_t, 16)
OPBRIDGE_MSDA_VECTOR(float, 8)
OPBRIDGE_MSDA_VECTOR(double, 8)
OPBRIDGE_MSDA_VECTOR(int32_t, 8)
OPBRIDGE_MSDA_VECTOR(int64_t, 8)
OPBRIDGE_MSDA_VECTOR(float, 4)
OPBRIDGE_MSDA_VECTOR(double, 4)
OPBRIDGE_MSDA_VECTOR(int32_t, 4)
OPBRIDGE_MSDA_VECTOR(int64_t, 4)
OPBRIDGE_MSDA_VECTOR(double, 2)
OPBRIDGE_MSDA_VECTOR(uint16_t, 16)
OPBRIDGE_MSDA_VECTOR(uint32_t, 16)
OPBRIDGE_MSDA_VECTOR(uint16_t, 8)
OPBRIDGE_MSDA_VECTOR(uint32_t, 8)
OPBRIDGE_MSDA_VECTOR(uint16_t, 4)
OPBRIDGE_MSDA_VECTOR(uint32_t, 4)
#undef OPBRIDGE_MSDA_VECTOR

// The register width of the instruction set this is compiled for.
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX2__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif
// Samples per vector of the sample loop (float positions); the taps are padded to whole vectors of the widest.
constexpr int kLanes = kVectorBytes / 4;
constexpr int kMaxLanes = 16;

template <class V, class T>
[[gnu::always_inline]] inline V load(const T* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
[[gnu::always_inline]] inline void store(T* p, const V& v) {
  __builtin_memcpy(p, &v, sizeof(V));
}

// Channels per row chunk: one register. The arithmetic is lane by lane, so the register width changes no result.
template <class T>
constexpr int kChunk = kVectorBytes / static_cast<int>(sizeof(T));
// Channels per chunk of a dot product, whose lanes are summed at the end: 64 bytes on every instruction set (two
// AVX2 registers, four SSE ones), so the order of that sum is the same everywhere.
template <class T>
constexpr int kDotChunk = 64 / static_cast<int>(sizeof(T));

// Where the loads of a query's inputs start ahead of their use: the inputs of the query `kAhead` queries on (the
// same head's rows are M rows apart, a stride the hardware prefetchers do not follow far enough).
constexpr int64_t kAhead = 4;

// The shuffle that takes the even lanes of two vectors (x of kLanes (x, y) pairs; + 1: the odd lanes, y).
template <class MV, int kCount = kLanes>
struct EvenLanes;
template <class MV>
struct EvenLanes<MV, 16> {
  static constexpr MV value = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
};
template <class MV>
struct EvenLanes<MV, 8> {
  static constexpr MV value = {0, 2, 4, 6, 8, 10, 12, 14};
};
template <class MV>
struct EvenLanes<MV, 4> {
  static constexpr MV value = {0, 2, 4, 6};
};

// Copies `bytes` bytes to `to` with stores that bypass the cache (x86: 16-byte non-temporal stores, which write
// whole lines without first reading them from memory), for output that this kernel does not read back: the head-major
// forward's output, block by block (512x512 encoder 6.2 -> 5.2 ms at 1 thread, docs/architecture.md).
inline void copy_streaming(void* to, const void* from, int64_t bytes) {
  char* __restrict out = static_cast<char*>(to);
  const char* __restrict in = static_cast<const char*>(from);
  int64_t b = 0;
#if defined(__SSE2__) && !defined(__CUDACC__)
  if ((reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(in)) % 16 == 0) {
    for (; b + 16 <= bytes; b += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + b), _mm_load_si128(reinterpret_cast<const __m128i*>(in + b)));
    }
    _mm_sfence();  // the stores are weakly ordered: done before the caller's threads are joined
  }
#endif
  std::memcpy(out + b, in + b, static_cast<size_t>(bytes - b));
}

// Prefetches [p, p + bytes) into the cache.
[[gnu::always_inline]] inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b);
}

// Stores one register to `to` with stores that bypass the cache where the instruction set has them (x86: non-temporal
// stores, which write whole lines without first reading them from memory): the head-major forward's output rows, which
// lie M rows apart and which it never reads back. Without them every row's first store waits for its line from memory
// (800x1333 encoder, head passes, a NumPy output: 38 ms with plain stores, 28 ms with these; docs/architecture.md).
// `to` is aligned to the register's size when kWide, else to 16 bytes (an output in a NumPy buffer, 16 bytes past a
// line): then 16 bytes a store.
template <bool kWide, class C, class T>
[[gnu::always_inline]] inline void store_streaming(T* to, const C& v) {
#if defined(__SSE2__) && !defined(__CUDACC__)
  // 16 bytes a store where `to` is on 16 bytes only, and where the instruction set has no store as wide as C (a
  // 32-byte vector of words in an SSE2 build).
  if constexpr (!kWide || sizeof(C) == 16 || sizeof(C) > kVectorBytes) {
    for (size_t b = 0; b < sizeof(C); b += 16) {
      __m128i part;
      __builtin_memcpy(&part, reinterpret_cast<const char*>(&v) + b, 16);
      _mm_stream_si128(reinterpret_cast<__m128i*>(reinterpret_cast<char*>(to) + b), part);
    }
    return;
  }
#endif
#if defined(__AVX512F__) && !defined(__CUDACC__)
  if constexpr (sizeof(C) == 64) return _mm512_stream_si512(reinterpret_cast<__m512i*>(to), (__m512i)v);
#endif
#if defined(__AVX__) && !defined(__CUDACC__)
  if constexpr (sizeof(C) == 32) return _mm256_stream_si256(reinterpret_cast<__m256i*>(to), (__m256i)v);
#endif
  store(to, v);
}

// Orders the streaming stores before anything that follows (the caller's threads are joined after the tasks).
[[gnu::always_inline]] inline void fence_streaming() {
#if defined(__SSE2__) && !defined(__CUDACC__)
  _mm_sfence();
#endif
}

// value's storage S: T itself, or bfloat16 (the top half of a float32) read into float arithmetic. bfloat16 rows are
// read kPairChunk channels at a time as kPairChunk / 2 32-bit words: a word's low half is an even channel and its
// high half the odd one after it, so one shift and one mask give the even and the odd channels as floats, exactly
// (no conversion per channel). The accumulator then holds each chunk as [even channels, odd channels], which the
// row's end rounds and packs back into such words (write_bf16_row): no shuffle back into channel order.
constexpr int kPairChunk = 16;
#if defined(__BYTE_ORDER__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "a word's low half is its first bfloat16 (even channel)");
#endif
// The chunk for D channels (0: known at run time): a whole register of words where D is a multiple of it (32
// channels with AVX-512), else kPairChunk.
template <int D>
constexpr int pair_chunk() {
  constexpr int wide = kVectorBytes / 2;
  return wide > kPairChunk && D > 0 && D % wide == 0 ? wide : kPairChunk;
}
template <int W>
using PairFloats = typename VectorOf<float, W / 2>::type;
template <int W>
using PairWords = typename VectorOf<uint32_t, W / 2>::type;
template <class Words, class Floats = typename VectorOf<float, sizeof(Words) / 4>::type>
[[gnu::always_inline]] inline Floats even_channels(const Words& words) {
  const Words bits = words << 16;
  Floats out;
  __builtin_memcpy(&out, &bits, sizeof out);
  return out;
}
template <class Words, class Floats = typename VectorOf<float, sizeof(Words) / 4>::type>
[[gnu::always_inline]] inline Floats odd_channels(const Words& words) {
  const Words bits = words & 0xffff0000u;
  Floats out;
  __builtin_memcpy(&out, &bits, sizeof out);
  return out;
}
template <class T, class S>
[[gnu::always_inline]] inline T value_at(const S* p) {
  if constexpr (std::is_same_v<S, T>) {
    return *p;
  } else if constexpr (std::is_same_v<S, SoftFloat16>) {
    return SoftFloat16::to_float(p->bits);
  } else {
    const uint32_t wide = static_cast<uint32_t>(p->bits) << 16;
    float out;
    __builtin_memcpy(&out, &wide, sizeof out);
    return out;
  }
}
// to[i] = from[i] for i < count: T itself copied, or a half type widened exactly (float16: F16C where the CPU has
// it, kernels/half_convert.h).
template <class T, class L>
inline void widen_into(T* __restrict to, const L* __restrict from, int64_t count) {
  if constexpr (std::is_same_v<L, T>) {
    std::memcpy(to, from, sizeof(T) * static_cast<size_t>(count));
  } else if constexpr (std::is_same_v<L, SoftFloat16>) {
    float16_to_float(reinterpret_cast<const uint16_t*>(from), to, count);
  } else {
    for (int64_t i = 0; i < count; ++i) to[i] = value_at<T>(from + i);
  }
}
// float sums rounded once into half out: bfloat16, or float16 (F16C where the CPU has it, kernels/half_convert.h).
inline void round_half(BFloat16* to, const float* from, int64_t count) { round_to_bf16(to, from, count); }
inline void round_half(SoftFloat16* to, const float* from, int64_t count) {
  float_to_float16(from, reinterpret_cast<uint16_t*>(to), count);
}
// out[k] = acc's sums rounded to bfloat16 (as bf16_bits: to nearest even, NaN a quiet NaN) for k < d, where acc holds
// its whole W-channel chunks as [even channels, odd channels] and the rest in channel order: each chunk's two halves
// rounded in their 32-bit lanes and packed into words of (even, odd) channels, as value's rows are read. stream:
// with stores that bypass the cache (store_streaming; wide: `out` on a register's boundary, else on 16 bytes).
template <int W>
[[gnu::always_inline]] inline void write_bf16_row(BFloat16* __restrict out, const float* __restrict acc, int64_t d,
                                                  bool stream, bool wide) {
  constexpr int kHalf = W / 2;
  using Words = PairWords<W>;
  int64_t k = 0;
  for (; k + W <= d; k += W) {
    const Words even = load<Words>(acc + k), odd = load<Words>(acc + k + kHalf);
    const Words low = (even + 0x7fffu + ((even >> 16) & 1u)) >> 16;
    const Words high = (odd + 0x7fffu + ((odd >> 16) & 1u)) & 0xffff0000u;
    const Words words = ((even & 0x7fffffffu) > 0x7f800000u ? Words{} + 0x7fc0u : low) |
                        ((odd & 0x7fffffffu) > 0x7f800000u ? Words{} + 0x7fc00000u : high);
    if (!stream) {
      store(&out[k].bits, words);
    } else if (wide) {
      store_streaming<true>(&out[k].bits, words);
    } else {
      store_streaming<false>(&out[k].bits, words);
    }
  }
  for (; k < d; ++k) {  // bf16_bits written out: no inline function outside this file from an instruction set's file
    uint32_t x;
    __builtin_memcpy(&x, acc + k, sizeof x);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    out[k].bits = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
  }
}

}  // namespace msda_detail

// A query's samples, corner-major, padded to whole vectors: row[c][i] is the value row (key * M + m) of corner c of
// sample i, or -1 where that corner is off the map (it then reads a row of zeros: an infinite value there must not
// turn 0 * inf into NaN); weight[c][i] is the attention weight times the bilinear weight, 0 for a corner off the
// map. I: the integer type of positions and rows, int32_t when every row index fits, else int64_t.
// The arrays are raw pointers into the struct's own storage, so the task functions, compiled per instruction set,
// touch no standard-library code (whose inline functions one instruction set's file could otherwise emit for all).
template <class T, class I>
struct MSDeformAttnTaps {
  int64_t count = 0, padded = 0;  // L * P, rounded up to whole vectors of the widest instruction set
  I* row[4];
  T* weight[4];
  T *low_x, *low_y;         // the fractions of x and y (backward)
  T *loc_x, *loc_y, *attn;  // the query's inputs, deinterleaved and padded (NaN: no sample)
  T *width_f, *height_f;    // per sample: its level's W and H
  I *width, *height, *start;
  T* sums;  // one row of D sums: the forward's accumulator where D is known at run time only and out is bfloat16
  MSDeformAttnTaps(const MSDeformAttnTaps&) = delete;
  MSDeformAttnTaps& operator=(const MSDeformAttnTaps&) = delete;
  MSDeformAttnTaps(MSDeformAttnTaps&&) = default;  // the storage's buffers move with it: the pointers stay valid
  explicit MSDeformAttnTaps(const MSDeformAttnShape& s, const int64_t* spatial_shapes, const int64_t* level_start)
      : count(s.levels * s.points),
        padded((count + msda_detail::kMaxLanes - 1) / msda_detail::kMaxLanes * msda_detail::kMaxLanes),
        reals_(static_cast<size_t>(11 * padded + std::max<int64_t>(1, s.channels))),
        integers_(static_cast<size_t>(7 * padded)) {
    const auto n = static_cast<size_t>(padded);
    T* r = reals_.get();
    I* k = integers_.get();
    for (int c = 0; c < 4; ++c) {
      row[c] = k + c * n, std::fill_n(row[c], n, I(-1));
      weight[c] = r + c * n, std::fill_n(weight[c], n, T(0));
    }
    low_x = r + 4 * n, low_y = r + 5 * n, attn = r + 6 * n, loc_x = r + 7 * n, loc_y = r + 8 * n;
    width_f = r + 9 * n, height_f = r + 10 * n, sums = r + 11 * n;
    width = k + 4 * n, height = k + 5 * n, start = k + 6 * n;
    for (T* v : {low_x, low_y, attn}) std::fill_n(v, n, T(0));
    for (T* v : {loc_x, loc_y}) std::fill_n(v, n, std::numeric_limits<T>::quiet_NaN());
    std::fill_n(width_f, n, T(1)), std::fill_n(height_f, n, T(1));
    std::fill_n(width, n, I(1)), std::fill_n(height, n, I(1)), std::fill_n(start, n, I(0));
    for (int64_t l = 0; l < s.levels; ++l) {
      for (int64_t p = 0; p < s.points; ++p) {
        const auto i = static_cast<size_t>(l * s.points + p);
        height[i] = static_cast<I>(spatial_shapes[2 * l]), width[i] = static_cast<I>(spatial_shapes[2 * l + 1]);
        start[i] = static_cast<I>(level_start[l]);
        height_f[i] = static_cast<T>(height[i]), width_f[i] = static_cast<T>(width[i]);
      }
    }
  }

 private:
  AlignedArray<T> reals_;
  AlignedArray<I> integers_;
};

// Whether int32_t rows serve: every row index key * M + m below 2^31 (then so are the sizes and starts).
inline bool ms_deform_attn_rows_fit_int32(const MSDeformAttnShape& s) {
  return s.keys * std::max<int64_t>(1, s.heads) < (int64_t(1) << 31);
}
// Whether int32_t serves the forward, whose taps hold element offsets (key * M + m) * D, with room for the corners
// one row and column past the map that are computed before they are masked.
inline bool ms_deform_attn_offsets_fit_int32(const MSDeformAttnShape& s) {
  return (2 * s.keys + 2) * std::max<int64_t>(1, s.heads) * std::max<int64_t>(1, s.channels) < (int64_t(1) << 31);
}

// Fills `taps` for one (query, head) from loc [L * P, 2] and attn [L * P] of that query and head: the arithmetic of
// ms_deform_attn_sample, 16 samples at a time. A corner is row (key * heads + head) of value times `stride` (1: a
// row index, the backward's; D: the offset of its first element, the forward's: no multiply per corner in the sample
// loop), or `off_map` where it lies off the map (-1: the caller reads zeros instead; the head-major forward's row of
// zeros). kFractions: also
// the fractions of x and y (the backward's).
template <class T, class I, bool kFractions = true>
[[gnu::always_inline]] inline void ms_deform_attn_taps(MSDeformAttnTaps<T, I>& taps, const T* __restrict loc,
                                                       const T* __restrict attn, I heads, I head, I off_map = I(-1),
                                                       I stride = I(1)) {
  using namespace msda_detail;
  using V = typename VectorOf<T, kLanes>::type;
  using IV = typename VectorOf<I, kLanes>::type;
  using MV = typename VectorOf<std::conditional_t<sizeof(T) == 4, int32_t, int64_t>, kLanes>::type;  // T's masks
  for (int64_t i = taps.count / kLanes * kLanes; i < taps.count; ++i) {  // a partial vector: through the padding
    taps.loc_x[i] = loc[2 * i], taps.loc_y[i] = loc[2 * i + 1], taps.attn[i] = attn[i];
  }
  for (int64_t i = 0; i < taps.padded; i += kLanes) {
    const V width_f = load<V>(&taps.width_f[i]), height_f = load<V>(&taps.height_f[i]);
    const IV width = load<IV>(&taps.width[i]), height = load<IV>(&taps.height[i]);
    V loc_x, loc_y, a;
    if (i + kLanes <= taps.count) {  // a whole vector of samples: (x, y) pairs split by two shuffles
      const V first = load<V>(loc + 2 * i), second = load<V>(loc + 2 * i + kLanes);
      loc_x = __builtin_shuffle(first, second, EvenLanes<MV>::value);
      loc_y = __builtin_shuffle(first, second, EvenLanes<MV>::value + 1);
      a = load<V>(attn + i);
    } else {
      loc_x = load<V>(&taps.loc_x[i]), loc_y = load<V>(&taps.loc_y[i]), a = load<V>(&taps.attn[i]);
    }
    const V x = loc_x * width_f - T(0.5), y = loc_y * height_f - T(0.5);
    const MV any_t = (x > T(-1)) & (y > T(-1)) & (x < width_f) & (y < height_f);  // NaN: false
    const IV any = __builtin_convertvector(any_t, IV);
    // floor() of a value in (-1, size): truncate value + 1, corrected where value + 1 rounded up; positions off the
    // map are replaced by 0 first (their conversion to an integer would be undefined).
    const V xs = any_t ? x : V{}, ys = any_t ? y : V{};
    IV x0 = __builtin_convertvector(xs + T(1), IV) - 1, y0 = __builtin_convertvector(ys + T(1), IV) - 1;
    x0 += __builtin_convertvector(__builtin_convertvector(x0, V) > xs, IV);  // masks are -1 where true
    y0 += __builtin_convertvector(__builtin_convertvector(y0, V) > ys, IV);
    const V lx = xs - __builtin_convertvector(x0, V), ly = ys - __builtin_convertvector(y0, V);
    const V hx = T(1) - lx, hy = T(1) - ly;
    const IV top = any & (y0 >= 0), bottom = any & (y0 + 1 < height), left = x0 >= 0, right = x0 + 1 < width;
    const IV in0 = top & left, in1 = top & right, in2 = bottom & left, in3 = bottom & right;
    const IV r0 = (((load<IV>(&taps.start[i]) + y0 * width + x0) * heads) + head) * stride, r1 = r0 + heads * stride;
    const IV r2 = r0 + width * (heads * stride), r3 = r2 + heads * stride;
    if constexpr (kFractions) store(&taps.low_x[i], lx), store(&taps.low_y[i], ly);
    const V p0 = a * (hy * hx), p1 = a * (hy * lx), p2 = a * (ly * hx), p3 = a * (ly * lx);
    const MV m0 = __builtin_convertvector(in0, MV), m1 = __builtin_convertvector(in1, MV);
    const MV m2 = __builtin_convertvector(in2, MV), m3 = __builtin_convertvector(in3, MV);
    store(&taps.weight[0][i], m0 ? p0 : V{}), store(&taps.weight[1][i], m1 ? p1 : V{});
    store(&taps.weight[2][i], m2 ? p2 : V{}), store(&taps.weight[3][i], m3 ? p3 : V{});
    const IV off = IV{} + off_map;
    store(&taps.row[0][i], in0 ? r0 : off), store(&taps.row[1][i], in1 ? r1 : off);
    store(&taps.row[2][i], in2 ? r2 : off), store(&taps.row[3][i], in3 ? r3 : off);
  }
}

// Queries per forward task: enough work to amortize the scheduling, small enough to balance threads.
inline int64_t ms_deform_attn_block_queries(const MSDeformAttnShape& s) {
  const int64_t per_query = std::max<int64_t>(1, s.heads * s.levels * s.points * s.channels);
  return std::clamp<int64_t>((int64_t(1) << 15) / per_query, 1, 1024);
}

// out[k] (+)= w0 r0[k] + w1 r1[k] + w2 r2[k] + w3 r3[k] for k < d (D > 0: d = D at compile time), in 64-byte
// chunks, then one channel at a time for the rest. The rows are value's storage S: T, bfloat16 (float T) in
// kPairChunk chunks whose sums out holds as [even channels, odd channels] (msda_detail::interleave_pairs), or
// float16 (float T) widened 16 channels a load with AVX-512: each channel's sum has the operations of the float
// rows', in the same order.
template <class T, int D, bool kAdd, class S>
[[gnu::always_inline]] inline void ms_deform_attn_blend(T* __restrict out, const S* __restrict r0,
                                                        const S* __restrict r1, const S* __restrict r2,
                                                        const S* __restrict r3, T w0, T w1, T w2, T w3, int64_t d) {
  using namespace msda_detail;
  const int64_t n = D > 0 ? D : d;
  int64_t k = 0;
  if constexpr (std::is_same_v<S, T>) {
    using C = typename VectorOf<T, kChunk<T>>::type;
    for (; k + kChunk<T> <= n; k += kChunk<T>) {
      const C sum = w0 * load<C>(r0 + k) + w1 * load<C>(r1 + k) + w2 * load<C>(r2 + k) + w3 * load<C>(r3 + k);
      store(out + k, kAdd ? load<C>(out + k) + sum : sum);
    }
  } else if constexpr (std::is_same_v<S, SoftFloat16>) {
    static_assert(std::is_same_v<T, float>, "half storage: float16 into float");
#if defined(__AVX512F__) && !defined(__CUDACC__)
    // 16 channels a load, widened exactly by the CPU (vcvtph2ps); the float rows' operations in their order. Other
    // instruction sets take the scalar loop below (the callers widen value first there: ms_deform_attn_copy_half).
    const auto at = [&](const S* r) __attribute__((always_inline)) {
      return _mm512_maskz_cvtph_ps(__mmask16(0xffff), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + k)));
    };
    for (; k + 16 <= n; k += 16) {
      const __m512 sum = w0 * at(r0) + w1 * at(r1) + w2 * at(r2) + w3 * at(r3);
      _mm512_storeu_ps(out + k, kAdd ? _mm512_loadu_ps(out + k) + sum : sum);
    }
#endif
  } else {
    static_assert(std::is_same_v<S, BFloat16> && std::is_same_v<T, float>, "half storage: bfloat16 into float");
    constexpr int kW = pair_chunk<D>(), kHalf = kW / 2;
    using Words = PairWords<kW>;
    using Floats = PairFloats<kW>;
    for (; k + kW <= n; k += kW) {
      const Words v0 = load<Words>(r0 + k), v1 = load<Words>(r1 + k);
      const Words v2 = load<Words>(r2 + k), v3 = load<Words>(r3 + k);
      const Floats even =
          w0 * even_channels(v0) + w1 * even_channels(v1) + w2 * even_channels(v2) + w3 * even_channels(v3);
      const Floats odd = w0 * odd_channels(v0) + w1 * odd_channels(v1) + w2 * odd_channels(v2) + w3 * odd_channels(v3);
      store(out + k, kAdd ? load<Floats>(out + k) + even : even);
      store(out + k + kHalf, kAdd ? load<Floats>(out + k + kHalf) + odd : odd);
    }
  }
  for (; k < n; ++k) {
    const T sum =
        w0 * value_at<T>(r0 + k) + w1 * value_at<T>(r1 + k) + w2 * value_at<T>(r2 + k) + w3 * value_at<T>(r3 + k);
    out[k] = kAdd ? out[k] + sum : sum;
  }
}

// The forward of rows [first, last) of image n: D > 0 the channel count known at compile time, 0 any.
//   query-major (kHeadMajor false): a row is one (query, head), in the inputs' order (read sequentially); value_n
//     [S, M, D] as given, a corner off the map reads `zeros`;
//   head-major (kHeadMajor true): a row is one query of head `head`; value_n is that head's rows [S + 1, D], row S
//     zeros (corners off the map read it), loc_n and attn_n that head's inputs [Lq, L * P (, 2)]
//     (ms_deform_attn_transpose_value, ms_deform_attn_transpose_queries).
// Either way out_n is [Lq, M, D] and every (query, head) sums its samples in the same order: the same bits. value_n
// and zeros are value's storage S (T, or bfloat16 read into float arithmetic: the same bits as value widened first).
// out_n is MSDeformAttnRow<T, S>: T, or for bfloat16 storage bfloat16, each row's sums rounded once as it is written.
template <class T, class I, int D, bool kHeadMajor, class S>
[[gnu::always_inline]] inline void ms_deform_attn_forward_block(const S* value_n, const T* loc_n, const T* attn_n,
                                                                MSDeformAttnRow<T, S>* out_n,
                                                                const MSDeformAttnShape& s, int64_t head, int64_t first,
                                                                int64_t last, MSDeformAttnTaps<T, I>* taps_pair,
                                                                const S* zeros, bool stream_out) {
  using R = MSDeformAttnRow<T, S>;
  constexpr bool kBFloat16 = std::is_same_v<S, BFloat16>;
  const int64_t d = D > 0 ? D : s.channels, m_count = s.heads, lp = taps_pair[0].count;
  alignas(64) T local[D > 0 ? D : 1];  // the accumulator, in registers when D is known
  // stream_out (head-major): out's rows, M rows apart, are written with streaming stores where every row starts on a
  // register (wide) or on 16 bytes.
  const auto aligned = [&](size_t bytes) {
    return D * sizeof(R) % bytes == 0 && reinterpret_cast<uintptr_t>(out_n) % bytes == 0;
  };
  const bool stream = stream_out && kHeadMajor && D > 0 && aligned(16);
  const bool wide = stream && aligned(msda_detail::kVectorBytes);
  // Forced inline, as every helper here: the code must be compiled in the task function, with its instruction set.
  auto prepare = [&](int64_t row, MSDeformAttnTaps<T, I>& taps) __attribute__((always_inline)) {
    if constexpr (kHeadMajor) {
      ms_deform_attn_taps<T, I, false>(taps, loc_n + row * lp * 2, attn_n + row * lp, I(1), I(0),
                                       static_cast<I>(s.keys * d), static_cast<I>(d));
    } else {
      ms_deform_attn_taps<T, I, false>(taps, loc_n + row * lp * 2, attn_n + row * lp, static_cast<I>(m_count),
                                       static_cast<I>(row % m_count), I(-1), static_cast<I>(d));
    }
  };
  if (first < last) prepare(first, taps_pair[0]);
  for (int64_t row = first; row < last; ++row) {
    const MSDeformAttnTaps<T, I>& taps = taps_pair[(row - first) & 1];
    if (row + 1 < last) prepare(row + 1, taps_pair[(row + 1 - first) & 1]);
    R* __restrict out = out_n + (kHeadMajor ? row * m_count + head : row) * d;
    T* __restrict acc = [&]() __attribute__((always_inline)) {  // the row's sums: registers (D known), out or taps' row
      if constexpr (kBFloat16) {
        return D > 0 ? local : taps_pair[0].sums;
      } else {
        return D > 0 ? local : out;
      }
    }();
    const I* __restrict row0 = taps.row[0];
    const I* __restrict row1 = taps.row[1];
    const I* __restrict row2 = taps.row[2];
    const I* __restrict row3 = taps.row[3];
    // Sample i's four corners blended into acc: sample 0 assigns, the rest add (a loop without a branch, whose
    // weights the compiler broadcasts straight from memory).
    auto blend = [&](int64_t i, auto add) __attribute__((always_inline)) {
      const int64_t k0 = row0[i], k1 = row1[i], k2 = row2[i], k3 = row3[i];
      const S* r0 = kHeadMajor || k0 >= 0 ? value_n + k0 : zeros;
      const S* r1 = kHeadMajor || k1 >= 0 ? value_n + k1 : zeros;
      const S* r2 = kHeadMajor || k2 >= 0 ? value_n + k2 : zeros;
      const S* r3 = kHeadMajor || k3 >= 0 ? value_n + k3 : zeros;
      ms_deform_attn_blend<T, D, decltype(add)::value>(acc, r0, r1, r2, r3, taps.weight[0][i], taps.weight[1][i],
                                                       taps.weight[2][i], taps.weight[3][i], d);
    };
    if (lp > 0) blend(0, std::false_type{});
    for (int64_t i = 1; i < lp; ++i) blend(i, std::true_type{});
    if (lp == 0) {
      for (int64_t k = 0; k < d; ++k) acc[k] = T(0);
    }
    if constexpr (kBFloat16) {
      msda_detail::write_bf16_row<msda_detail::pair_chunk<D>()>(out, acc, d, stream, wide);
    } else if (D > 0 && stream) {
      using C = typename msda_detail::VectorOf<T, msda_detail::kChunk<T>>::type;
      for (int64_t k = 0; k < d; k += msda_detail::kChunk<T>) {
        const C v = msda_detail::load<C>(acc + k);
        wide ? msda_detail::store_streaming<true>(out + k, v) : msda_detail::store_streaming<false>(out + k, v);
      }
    } else if (D > 0) {
      for (int64_t k = 0; k < d; ++k) out[k] = acc[k];
    }
  }
  if (stream) msda_detail::fence_streaming();
}

template <class T, class I, int D, class S>
[[gnu::always_inline]] inline void ms_deform_attn_forward_query_major(
    const S* value_n, const T* loc_n, const T* attn_n, MSDeformAttnRow<T, S>* out_n, const MSDeformAttnShape& s,
    int64_t head, int64_t first, int64_t last, MSDeformAttnTaps<T, I>* taps, const S* zeros, bool stream_out) {
  ms_deform_attn_forward_block<T, I, D, false>(value_n, loc_n, attn_n, out_n, s, head, first, last, taps, zeros,
                                               stream_out);
}
template <class T, class I, int D, class S>
[[gnu::always_inline]] inline void ms_deform_attn_forward_head_major(
    const S* value_n, const T* loc_n, const T* attn_n, MSDeformAttnRow<T, S>* out_n, const MSDeformAttnShape& s,
    int64_t head, int64_t first, int64_t last, MSDeformAttnTaps<T, I>* taps, const S* zeros, bool stream_out) {
  ms_deform_attn_forward_block<T, I, D, true>(value_n, loc_n, attn_n, out_n, s, head, first, last, taps, zeros,
                                              stream_out);
}

// x . y over d channels (D > 0: at compile time) in a fixed order: 64-byte chunks (kDotChunk) summed lane by lane, the
// lanes added in a fixed tree, then the rest one by one. Written out so that no instruction set reassociates the sum.
template <class T, int D>
[[gnu::always_inline]] inline T ms_deform_attn_dot(const T* __restrict x, const T* __restrict y, int64_t d) {
  using namespace msda_detail;
  using C = typename VectorOf<T, kDotChunk<T>>::type;
  const int64_t n = D > 0 ? D : d;
  C lanes{};
  int64_t k = 0;
  for (; k + kDotChunk<T> <= n; k += kDotChunk<T>) lanes += load<C>(x + k) * load<C>(y + k);
  T sum;
  for (int w = kDotChunk<T> / 2; w >= 1; w /= 2) {  // a fixed tree: lane l += lane l + w
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  }
  sum = lanes[0];
  for (; k < n; ++k) sum += x[k] * y[k];
  return sum;
}

// The gradients of one (image, head) for every query, in a fixed order (queries, then samples): value's rows of
// the head (grad_value_n, accumulated), and the head's sampling_locations and attention_weights (written).
template <class T, class I, int D>
[[gnu::always_inline]] inline void ms_deform_attn_backward_head(const T* grad_out_n, const T* value_n, const T* loc_n,
                                                                const T* attn_n, const MSDeformAttnShape& s,
                                                                int64_t head, T* grad_value_n, T* grad_loc_n,
                                                                T* grad_attn_n, MSDeformAttnTaps<T, I>& taps,
                                                                const T* zeros, T* scratch, T* dots) {
  using namespace msda_detail;
  using C = typename VectorOf<T, kChunk<T>>::type;
  const int64_t d = D > 0 ? D : s.channels, m_count = s.heads, lp = taps.count;
  T* __restrict dot0 = dots;
  T* __restrict dot1 = dots + lp;
  T* __restrict dot2 = dots + 2 * lp;
  T* __restrict dot3 = dots + 3 * lp;
  for (int64_t q = 0; q < s.queries; ++q) {
    const int64_t query_row = q * m_count + head;
    if (q + kAhead < s.queries) {
      const int64_t ahead = query_row + kAhead * m_count;
      prefetch(loc_n + ahead * lp * 2, lp * 2 * static_cast<int64_t>(sizeof(T)));
      prefetch(attn_n + ahead * lp, lp * static_cast<int64_t>(sizeof(T)));
      prefetch(grad_out_n + ahead * d, d * static_cast<int64_t>(sizeof(T)));
    }
    const T* __restrict attn = attn_n + query_row * lp;
    ms_deform_attn_taps(taps, loc_n + query_row * lp * 2, attn, static_cast<I>(m_count), static_cast<I>(head));
    const T* __restrict g = grad_out_n + query_row * d;
    for (int64_t i = 0; i < lp; ++i) {
      const int64_t k[4] = {taps.row[0][i], taps.row[1][i], taps.row[2][i], taps.row[3][i]};  // int64: addresses
      const T* r[4];
      T* gr[4];
      for (int c = 0; c < 4; ++c) {  // a corner off the map reads zeros and writes a scratch row of its own
        r[c] = k[c] >= 0 ? value_n + k[c] * d : zeros;
        gr[c] = k[c] >= 0 ? grad_value_n + k[c] * d : scratch + c * d;
      }
      // g . v_c for the four corners give every gradient but value's (zero off the map, below).
      dot0[i] = ms_deform_attn_dot<T, D>(g, r[0], d);
      dot1[i] = ms_deform_attn_dot<T, D>(g, r[1], d);
      dot2[i] = ms_deform_attn_dot<T, D>(g, r[2], d);
      dot3[i] = ms_deform_attn_dot<T, D>(g, r[3], d);
      const T w0 = taps.weight[0][i], w1 = taps.weight[1][i], w2 = taps.weight[2][i], w3 = taps.weight[3][i];
      T* __restrict g0 = gr[0];
      T* __restrict g1 = gr[1];
      T* __restrict g2 = gr[2];
      T* __restrict g3 = gr[3];
      int64_t c = 0;
      for (; c + kChunk<T> <= d; c += kChunk<T>) {
        const C gc = load<C>(g + c);
        store(g0 + c, load<C>(g0 + c) + w0 * gc);
        store(g1 + c, load<C>(g1 + c) + w1 * gc);
        store(g2 + c, load<C>(g2 + c) + w2 * gc);
        store(g3 + c, load<C>(g3 + c) + w3 * gc);
      }
      for (; c < d; ++c) {
        g0[c] += w0 * g[c];
        g1[c] += w1 * g[c];
        g2[c] += w2 * g[c];
        g3[c] += w3 * g[c];
      }
    }
    // The samples' weight and location gradients (ms_deform_attn_sample_grads' arithmetic).
    T* __restrict grad_loc = grad_loc_n + query_row * lp * 2;
    T* __restrict grad_attn = grad_attn_n + query_row * lp;
    for (int64_t i = 0; i < lp; ++i) {
      const bool in0 = taps.row[0][i] >= 0, in1 = taps.row[1][i] >= 0, in2 = taps.row[2][i] >= 0,
                 in3 = taps.row[3][i] >= 0;
      // Corners off the map read zeros; an infinite gradient times those zeros would be NaN.
      const T v0 = in0 ? dot0[i] : T(0), v1 = in1 ? dot1[i] : T(0), v2 = in2 ? dot2[i] : T(0),
              v3 = in3 ? dot3[i] : T(0);
      const T lx = taps.low_x[i], ly = taps.low_y[i], hx = T(1) - lx, hy = T(1) - ly, a = attn[i];
      const T dx = hy * (v1 - v0) + ly * (v3 - v2), dy = hx * (v2 - v0) + lx * (v3 - v1);
      if (in0 || in1 || in2 || in3) {
        grad_attn[i] = hy * hx * v0 + hy * lx * v1 + ly * hx * v2 + ly * lx * v3;
        grad_loc[2 * i] = a * dx * taps.width_f[i];
        grad_loc[2 * i + 1] = a * dy * taps.height_f[i];
      } else {
        grad_attn[i] = grad_loc[2 * i] = grad_loc[2 * i + 1] = T(0);
      }
    }
  }
}

// The task functions, by the mode of this file (see "The CPU kernels" above):
//   OPBRIDGE_ISA_NAMESPACE the file of one instruction set (cpp/kernels/ms_deform_attn_isa.cc, compiled with its
//                          flags): defined, in that namespace (isa_avx512f, isa_avx2, isa_baseline);
//   OPBRIDGE_ISA_DISPATCH  declared in those namespaces, and called through cpu_isa's choice (kernels/cpu_isa.h);
//   neither                defined here for this file's own target (the kernel tests build them with -mavx2,
//                          -mavx512f and nothing, so every instruction set's arithmetic is tested).
#define OPBRIDGE_MSDA_FORWARD_PARAMS(T, I, S)                                                                 \
  const S *value_n, const T *loc_n, const T *attn_n, MSDeformAttnRow<T, S>*out_n, const MSDeformAttnShape &s, \
      int64_t head, int64_t first, int64_t last, MSDeformAttnTaps<T, I>*taps, const S *zeros, bool stream_out
#define OPBRIDGE_MSDA_FORWARD_ARGS value_n, loc_n, attn_n, out_n, s, head, first, last, taps, zeros, stream_out
#define OPBRIDGE_MSDA_BACKWARD_PARAMS(T, I)                                                                         \
  const T *grad_out_n, const T *value_n, const T *loc_n, const T *attn_n, const MSDeformAttnShape &s, int64_t head, \
      T *grad_value_n, T *grad_loc_n, T *grad_attn_n, MSDeformAttnTaps<T, I>&taps, const T *zeros, T *scratch, T *dots
#define OPBRIDGE_MSDA_BACKWARD_ARGS \
  grad_out_n, value_n, loc_n, attn_n, s, head, grad_value_n, grad_loc_n, grad_attn_n, taps, zeros, scratch, dots
#define OPBRIDGE_MSDA_FOR_TYPES(X) X(float, int32_t) X(float, int64_t) X(double, int32_t) X(double, int64_t)
// The forward also reads bfloat16 value storage into float arithmetic.
#define OPBRIDGE_MSDA_FOR_HALF_TYPES(X) \
  X(float, int32_t, BFloat16) X(float, int64_t, BFloat16) X(float, int32_t, SoftFloat16) X(float, int64_t, SoftFloat16)

#if defined(OPBRIDGE_ISA_NAMESPACE) || !defined(OPBRIDGE_ISA_DISPATCH)
#if defined(OPBRIDGE_ISA_NAMESPACE)
#define OPBRIDGE_MSDA_LINKAGE
namespace OPBRIDGE_ISA_NAMESPACE {
#else
#define OPBRIDGE_MSDA_LINKAGE [[maybe_unused]] static
#endif
// The task functions' bodies for D = 16, 32, 64 or any (0), by the channel count (ms_deform_attn_streams_rows knows
// these three).
#define OPBRIDGE_MSDA_BY_CHANNELS(channels, body, T, I, ...) \
  switch (channels) {                                        \
    case 16:                                                 \
      return body<T, I, 16>(__VA_ARGS__);                    \
    case 32:                                                 \
      return body<T, I, 32>(__VA_ARGS__);                    \
    case 64:                                                 \
      return body<T, I, 64>(__VA_ARGS__);                    \
    default:                                                 \
      return body<T, I, 0>(__VA_ARGS__);                     \
  }

// The forward's storage S is deduced from value_n (the head-major orders' copy of value keeps it).
#define OPBRIDGE_DEFINE_MSDA_FORWARD_TASK(T, I, S)                                                               \
  OPBRIDGE_MSDA_LINKAGE void ms_deform_attn_forward_task(OPBRIDGE_MSDA_FORWARD_PARAMS(T, I, S)) {                \
    if (head >= 0) {                                                                                             \
      OPBRIDGE_MSDA_BY_CHANNELS(s.channels, ms_deform_attn_forward_head_major, T, I, OPBRIDGE_MSDA_FORWARD_ARGS) \
    }                                                                                                            \
    OPBRIDGE_MSDA_BY_CHANNELS(s.channels, ms_deform_attn_forward_query_major, T, I, OPBRIDGE_MSDA_FORWARD_ARGS)  \
  }
#define OPBRIDGE_DEFINE_MSDA_TASKS(T, I)                                                                   \
  OPBRIDGE_DEFINE_MSDA_FORWARD_TASK(T, I, T)                                                               \
  OPBRIDGE_MSDA_LINKAGE void ms_deform_attn_backward_task(OPBRIDGE_MSDA_BACKWARD_PARAMS(T, I)) {           \
    OPBRIDGE_MSDA_BY_CHANNELS(s.channels, ms_deform_attn_backward_head, T, I, OPBRIDGE_MSDA_BACKWARD_ARGS) \
  }
OPBRIDGE_MSDA_FOR_TYPES(OPBRIDGE_DEFINE_MSDA_TASKS)
OPBRIDGE_MSDA_FOR_HALF_TYPES(OPBRIDGE_DEFINE_MSDA_FORWARD_TASK)
#undef OPBRIDGE_DEFINE_MSDA_TASKS
#undef OPBRIDGE_DEFINE_MSDA_FORWARD_TASK
#undef OPBRIDGE_MSDA_BY_CHANNELS
#undef OPBRIDGE_MSDA_LINKAGE
#if defined(OPBRIDGE_ISA_NAMESPACE)
}  // namespace OPBRIDGE_ISA_NAMESPACE
#endif
#endif

#if defined(OPBRIDGE_ISA_DISPATCH)
#define OPBRIDGE_DECLARE_MSDA_FORWARD_TASK(T, I, S) \
  void ms_deform_attn_forward_task(OPBRIDGE_MSDA_FORWARD_PARAMS(T, I, S));
#define OPBRIDGE_DECLARE_MSDA_TASKS(T, I)     \
  OPBRIDGE_DECLARE_MSDA_FORWARD_TASK(T, I, T) \
  void ms_deform_attn_backward_task(OPBRIDGE_MSDA_BACKWARD_PARAMS(T, I));
#define OPBRIDGE_DECLARE_MSDA_ALL                      \
  OPBRIDGE_MSDA_FOR_TYPES(OPBRIDGE_DECLARE_MSDA_TASKS) \
  OPBRIDGE_MSDA_FOR_HALF_TYPES(OPBRIDGE_DECLARE_MSDA_FORWARD_TASK)
namespace isa_avx512f {
OPBRIDGE_DECLARE_MSDA_ALL
}
namespace isa_avx2 {
OPBRIDGE_DECLARE_MSDA_ALL
}
namespace isa_baseline {
OPBRIDGE_DECLARE_MSDA_ALL
}
#undef OPBRIDGE_DECLARE_MSDA_ALL
#undef OPBRIDGE_DECLARE_MSDA_TASKS
#undef OPBRIDGE_DECLARE_MSDA_FORWARD_TASK
#define OPBRIDGE_DISPATCH_MSDA_TASK(name, PARAMS, ARGS, ...) \
  inline void name(PARAMS(__VA_ARGS__)) {                    \
    switch (cpu_isa()) {                                     \
      case CpuIsa::avx512f:                                  \
        return isa_avx512f::name(ARGS);                      \
      case CpuIsa::avx2:                                     \
        return isa_avx2::name(ARGS);                         \
      default:                                               \
        return isa_baseline::name(ARGS);                     \
    }                                                        \
  }
#define OPBRIDGE_DISPATCH_MSDA_FORWARD_TASK(T, I, S)                                                                 \
  OPBRIDGE_DISPATCH_MSDA_TASK(ms_deform_attn_forward_task, OPBRIDGE_MSDA_FORWARD_PARAMS, OPBRIDGE_MSDA_FORWARD_ARGS, \
                              T, I, S)
#define OPBRIDGE_DISPATCH_MSDA_TASKS(T, I)                                                 \
  OPBRIDGE_DISPATCH_MSDA_FORWARD_TASK(T, I, T)                                             \
  OPBRIDGE_DISPATCH_MSDA_TASK(ms_deform_attn_backward_task, OPBRIDGE_MSDA_BACKWARD_PARAMS, \
                              OPBRIDGE_MSDA_BACKWARD_ARGS, T, I)
OPBRIDGE_MSDA_FOR_TYPES(OPBRIDGE_DISPATCH_MSDA_TASKS)
OPBRIDGE_MSDA_FOR_HALF_TYPES(OPBRIDGE_DISPATCH_MSDA_FORWARD_TASK)
#undef OPBRIDGE_DISPATCH_MSDA_TASKS
#undef OPBRIDGE_DISPATCH_MSDA_FORWARD_TASK
#undef OPBRIDGE_DISPATCH_MSDA_TASK
#endif
#undef OPBRIDGE_MSDA_FOR_HALF_TYPES
#undef OPBRIDGE_MSDA_FOR_TYPES
#undef OPBRIDGE_MSDA_FORWARD_PARAMS
#undef OPBRIDGE_MSDA_FORWARD_ARGS
#undef OPBRIDGE_MSDA_BACKWARD_PARAMS
#undef OPBRIDGE_MSDA_BACKWARD_ARGS

// The callers' side, which the instruction sets' builds (OPBRIDGE_ISA_NAMESPACE) neither need nor see: its inline
// functions (ms_deform_attn_wide_half) read the build's own flags, and one compiled for AVX-512 must never be the
// copy the linker keeps for every caller.
#if !defined(OPBRIDGE_ISA_NAMESPACE)
// Whether the forward runs head by head on a head-major copy of value (ms_deform_attn_forward_block): where every
// value row is gathered many times (an encoder's self-attention: each key sampled by L * P samples of about as many
// queries), the copy is paid back many times. Queries of one head then run one after another, so the rows that
// neighbouring queries share stay in L1 (value's [S, M, D] rows of one head lie M rows apart: every head's
// neighbours would meet in the same few cache sets, and the other heads' rows would evict them between two
// queries). Few queries on a large map (a decoder's cross-attention) keep the inputs' order and read value in place.
inline bool ms_deform_attn_head_major(const MSDeformAttnShape& s) {
  return s.heads > 1 && s.channels > 0 && s.queries * s.levels * s.points >= 4 * s.keys;
}

// value [S, M, D] of one image -> value_t [M, S + 1, D] for keys [first, last) (row S of each head zeros: written
// by the task that copies the last key), in value's storage S (bfloat16 stays bfloat16: half the bytes to gather).
template <class S, class V>
void ms_deform_attn_transpose_value(const S* value_n, V* value_t, const MSDeformAttnShape& s, int64_t first,
                                    int64_t last) {
  const int64_t d = s.channels, m_count = s.heads;
  for (int64_t key = first; key < last; ++key) {
    for (int64_t m = 0; m < m_count; ++m) {  // a loop the compiler vectorizes: no call per row
      V* __restrict to = value_t + (m * (s.keys + 1) + key) * d;
      const S* __restrict from = value_n + (key * m_count + m) * d;
      for (int64_t k = 0; k < d; ++k) to[k] = msda_detail::value_at<V>(from + k);
    }
  }
  if (last == s.keys) {
    for (int64_t m = 0; m < m_count; ++m) std::fill_n(value_t + (m * (s.keys + 1) + s.keys) * d, d, V{});
  }
}

// Queries [first, last)'s sampling_locations [Lq, M, L * P * 2] and attention_weights [Lq, M, L * P] of one image,
// head by head: loc_t [M, total, L * P * 2], attn_t [M, total, L * P], query q at q - origin of its head.
// The inputs' storage L is T, or a half type widened on the way.
template <class T, class L>
void ms_deform_attn_transpose_queries(const L* loc_n, const L* attn_n, T* loc_t, T* attn_t, const MSDeformAttnShape& s,
                                      int64_t first, int64_t last, int64_t total, int64_t origin) {
  const int64_t m_count = s.heads, lp = s.levels * s.points;
  for (int64_t q = first; q < last; ++q) {
    for (int64_t m = 0; m < m_count; ++m) {
      const int64_t to = m * total + q - origin;
      msda_detail::widen_into(loc_t + to * lp * 2, loc_n + (q * m_count + m) * lp * 2, lp * 2);
      msda_detail::widen_into(attn_t + to * lp, attn_n + (q * m_count + m) * lp, lp);
    }
  }
}

// Whether the head-major forward runs each head over every query (MSDeformAttnOrder::head_passes), on head-major
// copies of the image's inputs: where value's head-major copy is larger than the caches keep between two blocks of
// queries. Block by block (MSDeformAttnOrder::head_major), the eight heads' neighbourhoods of each block take turns
// in the cache and every block fetches its neighbourhood's rows again, from memory once value no longer fits: the
// 800x1333 encoder (value 23 MB) took 31-36 ms block by block, 27-28 ms head by head; the 512x512 one (5.6 MB) 5.3 ms
// block by block, 5.7 ms head by head (1 thread, docs/architecture.md).
inline bool ms_deform_attn_head_passes(const MSDeformAttnShape& s, size_t value_bytes) {
  return static_cast<size_t>(s.heads * (s.keys + 1) * s.channels) * value_bytes >= (size_t(12) << 20);
}

// Whether the head-major tasks write out's rows (elements of `bytes` bytes, D = d) with streaming stores: D known at
// compile time (OPBRIDGE_MSDA_BY_CHANNELS) and every row on 16 bytes (ms_deform_attn_forward_block).
inline bool ms_deform_attn_streams_rows(const void* out, int64_t d, size_t bytes) {
  return (d == 16 || d == 32 || d == 64) && (static_cast<size_t>(d) * bytes) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out) % 16 == 0;
}

// Whether this CPU's kernels read half rows a 64-byte register at a time (AVX-512): bfloat16 32 channels a load,
// float16 16 (widened by vcvtph2ps). Other instruction sets read float16 one channel at a time, so callers widen a
// float16 value first there.
inline bool ms_deform_attn_wide_half() {
#if defined(OPBRIDGE_ISA_DISPATCH)
  return cpu_isa() == CpuIsa::avx512f;
#else
  return msda_detail::kVectorBytes == 64;
#endif
}

// Whether the head-major orders keep a half value (S) as stored in their copy, rather than widened to T: with
// AVX-512 (a register of words: 32 bfloat16 channels a load, the float rows' arithmetic and half their bytes), and
// elsewhere where a bfloat16 value's float copy would be large (8 MiB: bound by memory, where half the bytes win; a
// copy in cache reads 16 channels a load and is bound by the shift and mask). 2026-11-28, AMD EPYC Zen 5 at 1
// thread, bfloat16 against float32: AVX-512 1.45x (800x1333 encoder) and 1.04x (512x512) with the bfloat16 copy,
// against 0.94x and 0.98x widened; AVX2 (OPBRIDGE_CPU_ISA=avx2) 1.07x and 0.89x with it, 0.94x and 0.97x widened.
enum class MSDeformAttnCopy { automatic, half, widened };
template <class T, class S>
inline bool ms_deform_attn_copy_half(const MSDeformAttnShape& s, MSDeformAttnCopy copy) {
  if (std::is_same_v<S, T> || copy != MSDeformAttnCopy::automatic) {
    return std::is_same_v<S, T> || copy == MSDeformAttnCopy::half;
  }
  const bool large = static_cast<size_t>(s.heads * (s.keys + 1) * s.channels) * sizeof(T) >= (size_t(8) << 20);
  return ms_deform_attn_wide_half() || (std::is_same_v<S, BFloat16> && large);
}

// out [N, Lq, M * D]. spatial_shapes and level_start_index as checked by check_ms_deform_attn.
// parallel_for(tasks, task) runs task(0..tasks-1), in any order and on any threads. The orders (automatic: by
// ms_deform_attn_head_major and ms_deform_attn_head_passes; the tests run each), which all give the same bits:
//   query_major  tasks of (image, block of queries), in the inputs' order;
//   head_major   per image, value's head-major copy, then tasks of one block of queries, which copy their inputs
//                head-major (a few hundred KiB, in L2) and run the block one head after the other;
//   head_passes  per image, head-major copies of value and of all the inputs, then tasks of (head, block of queries),
//                head by head.
#ifndef OPBRIDGE_MSDA_BLOCK_BYTES
#define OPBRIDGE_MSDA_BLOCK_BYTES (256 << 10)
#endif
// value's storage S is T, or bfloat16 or float16 with T float: the same bits as value widened to float first, without
// the widened copy. Every order reads half rows as stored where ms_deform_attn_copy_half says so (the head-major
// copies keep them half): with AVX-512, bfloat16 32 channels a 64-byte load and float16 16 (vcvtph2ps), half the bytes
// of float rows to gather and to keep in cache (800x1333 encoder, 1 thread: 1.45x the float32 forward;
// docs/architecture.md). out is T, or bfloat16 or float16 (float T): the float sums rounded once as they are written
// (a block's sums in cache, then rounded; no float32 output to write and convert).
enum class MSDeformAttnOrder { automatic, query_major, head_major, head_passes };
template <class S, class L, class O, class ParallelFor>
void ms_deform_attn(const S* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                    const L* sampling_locations, const L* attention_weights, O* out, const MSDeformAttnShape& s,
                    ParallelFor&& parallel_for, MSDeformAttnOrder order = MSDeformAttnOrder::automatic,
                    MSDeformAttnCopy copy = MSDeformAttnCopy::automatic) {
  using T = std::conditional_t<std::is_same_v<L, BFloat16> || std::is_same_v<L, SoftFloat16>, float, L>;
  static_assert(std::is_same_v<O, T> ||
                    (std::is_same_v<T, float> && (std::is_same_v<O, BFloat16> || std::is_same_v<O, SoftFloat16>)),
                "out: T, or bfloat16 or float16 (float T) rounded once as it is written");
  static_assert(std::is_same_v<L, T> ||
                    (std::is_same_v<T, float> && (std::is_same_v<L, BFloat16> || std::is_same_v<L, SoftFloat16>)),
                "sampling_locations and attention_weights: T, or bfloat16 or float16 (float T) widened as read");
  static_assert(!std::is_same_v<S, BFloat16> || std::is_same_v<O, BFloat16>,
                "a bfloat16 value read as stored gives bfloat16 out (the tasks round each row as they write it)");
  const int64_t d = s.channels, m_count = s.heads, lp = s.levels * s.points;
  const AlignedArray<S> zeros(static_cast<size_t>(d));
  std::fill_n(zeros.get(), d, S{});
  const AlignedArray<T> zeros_t(static_cast<size_t>(d));  // the zeros of a copy widened to T
  std::fill_n(zeros_t.get(), d, T(0));
  const int64_t kBlockBytes = OPBRIDGE_MSDA_BLOCK_BYTES;
  const bool copy_half = ms_deform_attn_copy_half<T, S>(s, copy);
  if (order == MSDeformAttnOrder::automatic) {
    order = !ms_deform_attn_head_major(s)                                      ? MSDeformAttnOrder::query_major
            : ms_deform_attn_head_passes(s, copy_half ? sizeof(S) : sizeof(T)) ? MSDeformAttnOrder::head_passes
                                                                               : MSDeformAttnOrder::head_major;
  }
  auto run = [&](auto index) {
    using I = decltype(index);
    auto taps_pair = [&] {
      return std::array<MSDeformAttnTaps<T, I>, 2>{MSDeformAttnTaps<T, I>(s, spatial_shapes, level_start_index),
                                                   MSDeformAttnTaps<T, I>(s, spatial_shapes, level_start_index)};
    };
    if (order == MSDeformAttnOrder::query_major) {
      const int64_t block = ms_deform_attn_block_queries(s);
      const int64_t blocks = (s.queries + block - 1) / block;
      parallel_for(s.batch * blocks, [&](int64_t task) {
        const int64_t n = task / blocks, first = task % blocks * block, last = std::min(s.queries, first + block);
        const int64_t rows = n * s.queries * m_count;
        auto taps = taps_pair();
        // float16 out: the block's float sums (at most 2^15), then rounded. None where the task writes out's type
        // (T, or bfloat16 rows from a bfloat16 value).
        constexpr bool kRows = std::is_same_v<O, MSDeformAttnRow<T, S>>;
        const AlignedArray<T> sums =
            kRows ? AlignedArray<T>() : AlignedArray<T>(static_cast<size_t>((last - first) * m_count * d));
        MSDeformAttnRow<T, S>* const out_n = [&] {
          if constexpr (kRows) {
            return out + rows * d;
          } else {
            return sums.get() - first * m_count * d;
          }
        }();
        // Half locations and weights: the block's, widened (at most 3 * 2^15 / D values).
        const int64_t inputs = std::is_same_v<L, T> ? 0 : (last - first) * m_count * lp;
        const AlignedArray<T> widened =
            inputs == 0 ? AlignedArray<T>() : AlignedArray<T>(static_cast<size_t>(inputs * 3));
        const auto block_inputs = [&]() -> std::pair<const T*, const T*> {
          if constexpr (std::is_same_v<L, T>) {
            return {sampling_locations + rows * lp * 2, attention_weights + rows * lp};
          } else {
            const int64_t at = (rows + first * m_count) * lp;
            msda_detail::widen_into(widened.get(), sampling_locations + at * 2, inputs * 2);
            msda_detail::widen_into(widened.get() + inputs * 2, attention_weights + at, inputs);
            const int64_t origin = first * m_count * lp;  // the task reads rows from first * M on
            return {widened.get() - origin * 2, widened.get() + inputs * 2 - origin};
          }
        };
        const auto [loc_n, attn_n] = block_inputs();
        ms_deform_attn_forward_task(value + n * s.keys * m_count * d, loc_n, attn_n, out_n, s, int64_t(-1),
                                    first * m_count, last * m_count, taps.data(), zeros.get(), false);
        if constexpr (!kRows) {
          msda_detail::round_half(out + (rows + first * m_count) * d, sums.get(), (last - first) * m_count * d);
        }
      });
      return;
    }
    // The head-major orders' copy of value, in V: value's storage S, or T (bfloat16 widened on the way).
    const auto head_major = [&](auto copy) {
      using V = decltype(copy);
      using R = MSDeformAttnRow<T, V>;              // what the tasks write: T, or bfloat16 from a bfloat16 copy
      constexpr bool kRows = std::is_same_v<O, R>;  // else float sums, rounded into out after the tasks
      const V* zeros_v = [&] {
        if constexpr (std::is_same_v<V, S>) {
          return zeros.get();
        } else {
          return zeros_t.get();
        }
      }();
      const bool passes = order == MSDeformAttnOrder::head_passes;
      const int64_t copy_block = 256,
                    copies = std::max<int64_t>(
                        1, (s.keys + copy_block - 1) / copy_block);  // 1: the zero rows of an empty map
      // head_major: queries per task (their inputs a few hundred KiB); head_passes: per task of one head.
      const int64_t block =
          passes ? 1024
                 : std::clamp<int64_t>(kBlockBytes / std::max<int64_t>(1, sizeof(T) * m_count * lp * 3), 1, 1024);
      const int64_t blocks = (s.queries + block - 1) / block;
      const int64_t value_count = m_count * (s.keys + 1) * d, inputs_count = passes ? m_count * s.queries * lp * 3 : 0;
      const size_t value_bytes = (sizeof(V) * static_cast<size_t>(value_count) + 63) / 64 * 64;
      // head_passes with half out (bfloat16 or float16): the image's float sums [Lq, M, D], streamed by the passes
      // (each writes its head's D channels of every row: too large to stay in cache) and rounded after them.
      const int64_t sums_count = passes && !kRows ? s.queries * m_count * d : 0;
      const ThreadScratch scratch(value_bytes + sizeof(T) * static_cast<size_t>(inputs_count + sums_count));
      V* value_t = scratch.get<V>();
      // head_passes: sampling_locations [M, Lq, L * P * 2], then attention_weights [M, Lq, L * P].
      T* loc_all = reinterpret_cast<T*>(scratch.get<unsigned char>() + value_bytes);
      T* attn_all = loc_all + m_count * s.queries * lp * 2;
      T* sums_all = attn_all + m_count * s.queries * lp;
      for (int64_t n = 0; n < s.batch; ++n) {
        const int64_t rows = n * s.queries * m_count;
        const L* loc_n = sampling_locations + rows * lp * 2;
        const L* attn_n = attention_weights + rows * lp;
        // The copies of value (and head_passes: of the inputs, one block of queries a task).
        parallel_for(copies + (passes ? blocks : 0), [&](int64_t task) {
          if (task < copies) {
            return ms_deform_attn_transpose_value(value + n * s.keys * m_count * d, value_t, s, task * copy_block,
                                                  std::min(s.keys, (task + 1) * copy_block));
          }
          const int64_t first = (task - copies) * block;
          ms_deform_attn_transpose_queries(loc_n, attn_n, loc_all, attn_all, s, first,
                                           std::min(s.queries, first + block), s.queries, int64_t(0));
        });
        if (passes) {
          R* const out_n = [&] {
            if constexpr (kRows) {
              return out + rows * d;
            } else {
              return sums_all;
            }
          }();
          parallel_for(m_count * blocks, [&](int64_t task) {
            const int64_t m = task / blocks, first = task % blocks * block, last = std::min(s.queries, first + block);
            auto taps = taps_pair();
            ms_deform_attn_forward_task(value_t + m * (s.keys + 1) * d, loc_all + m * s.queries * lp * 2,
                                        attn_all + m * s.queries * lp, out_n, s, m, first, last, taps.data(), zeros_v,
                                        true);
          });
          if constexpr (!kRows) {
            const int64_t per_block = block * m_count * d, total = s.queries * m_count * d;
            parallel_for(blocks, [&](int64_t task) {
              const int64_t first = task * per_block;
              msda_detail::round_half(out + rows * d + first, sums_all + first,
                                      std::min(total, first + per_block) - first);
            });
          }
          continue;
        }
        // The blocks' output: straight into out with streaming stores where its rows can take them (D known, rows on
        // 16 bytes), else into each block's cached buffer, copied out whole: head by head, out's rows lie M rows apart,
        // and every row's first plain store would wait for its line from memory.
        const bool direct = kRows && ms_deform_attn_streams_rows(out + rows * d, d, sizeof(R));
        parallel_for(blocks, [&](int64_t task) {
          const int64_t first = task * block, last = std::min(s.queries, first + block), count = last - first;
          // The block's inputs, head-major (and its output buffer: room for T, R is T or smaller).
          const AlignedArray<T> work(static_cast<size_t>(m_count * count * (lp * 3 + (direct ? 0 : d))));
          T* loc_t = work.get();
          T* attn_t = loc_t + m_count * count * lp * 2;
          R* out_t = reinterpret_cast<R*>(attn_t + m_count * count * lp);
          ms_deform_attn_transpose_queries(loc_n, attn_n, loc_t, attn_t, s, first, last, count, first);
          R* const out_n = [&] {
            if constexpr (kRows) {
              return direct ? out + rows * d : out_t - first * m_count * d;
            } else {
              return out_t - first * m_count * d;
            }
          }();
          auto taps = taps_pair();
          for (int64_t m = 0; m < m_count; ++m) {
            ms_deform_attn_forward_task(value_t + m * (s.keys + 1) * d, loc_t + (m * count - first) * lp * 2,
                                        attn_t + (m * count - first) * lp, out_n, s, m, first, last, taps.data(),
                                        zeros_v, direct);
          }
          if constexpr (kRows) {
            if (!direct) {
              msda_detail::copy_streaming(out + (rows + first * m_count) * d, out_t,
                                          static_cast<int64_t>(sizeof(R)) * count * m_count * d);
            }
          } else {
            msda_detail::round_half(out + (rows + first * m_count) * d, out_t, count * m_count * d);
          }
        });
      }
    };
    if (copy_half) {
      head_major(S{});
    } else {
      head_major(T{});
    }
  };
  if (ms_deform_attn_offsets_fit_int32(s)) {
    run(int32_t{});
  } else {
    run(int64_t{});
  }
}

// Gradients of value [N, S, M, D] (must be zero on entry), sampling_locations and attention_weights
// (written in full) from grad_out [N, Lq, M * D]. One task per (image, head): a task owns the
// value rows of its head, so the scatter into grad_value has no races, and its order is fixed
// (queries, levels, points in turn): the same bits for the same inputs at any thread count.
template <class T, class ParallelFor>
void ms_deform_attn_backward(const T* grad_out, const T* value, const int64_t* spatial_shapes,
                             const int64_t* level_start_index, const T* sampling_locations, const T* attention_weights,
                             const MSDeformAttnShape& s, T* grad_value, T* grad_sampling_locations,
                             T* grad_attention_weights, ParallelFor&& parallel_for) {
  const int64_t d = s.channels, m_count = s.heads, lp = s.levels * s.points;
  const AlignedArray<T> zeros(static_cast<size_t>(d));
  std::fill_n(zeros.get(), d, T(0));
  auto run = [&](auto index) {
    using I = decltype(index);
    parallel_for(s.batch * m_count, [&](int64_t task) {
      const int64_t n = task / m_count, head = task % m_count;
      MSDeformAttnTaps<T, I> taps(s, spatial_shapes, level_start_index);
      // Rows a corner outside the map writes to and never reads back: one per corner, so the four rows of a
      // sample never alias.
      std::vector<T> scratch(static_cast<size_t>(4 * d)), dots(static_cast<size_t>(4 * lp));
      const int64_t values = n * s.keys * m_count * d, rows = n * s.queries * m_count;
      ms_deform_attn_backward_task(grad_out + rows * d, value + values, sampling_locations + rows * lp * 2,
                                   attention_weights + rows * lp, s, head, grad_value + values,
                                   grad_sampling_locations + rows * lp * 2, grad_attention_weights + rows * lp, taps,
                                   zeros.get(), scratch.data(), dots.data());
    });
  };
  if (ms_deform_attn_rows_fit_int32(s)) {
    run(int32_t{});
  } else {
    run(int64_t{});
  }
}

#endif  // !defined(OPBRIDGE_ISA_NAMESPACE)

#pragma GCC diagnostic pop

}  // namespace opbridge::kernels
