// Deformable convolution v1/v2 (torchvision.ops.deform_conv2d, ONNX DeformConv):
// the one implementation behind torch.ops.opbridge.deform_conv2d and ORT's
// opbridge::DeformConv2d.
//
// A deformable im2col gathers, for every output pixel, input channel c and
// kernel tap k, the input bilinearly sampled at the tap's position plus its
// learned offset (times the mask, when given) into a column matrix
// [pixels, C_in * K]; each weight group then is one GEMM against its part of
// that matrix. Both run per block of output pixels, so the columns of a block
// stay in cache between the two. The GEMM is a parameter: each front end passes
// the best it has (torch's BLAS; OpenBLAS or the reference loop below for ORT).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif
#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

#include "kernels/broadcast.h"
#include "kernels/device.h"
#include "kernels/float16.h"
#include "kernels/scratch.h"

namespace opbridge::kernels {

struct DeformConv2dShape {
  int64_t batch = 0, in_channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t groups = 1, offset_groups = 1;
  int64_t out_h = 0, out_w = 0;
  bool has_bias = false, has_mask = false;
};

// Attributes as given by the front end (torch: symmetric padding, groups
// inferred from shapes; ONNX: pads [top, left, bottom, right], group attributes).
// A group count of 0 is inferred from the shapes as torch does (groups =
// in_channels / weight.shape[1], offset_groups = offset channels / (2 * kh * kw)):
// an export writes 0 where the exporter does not know the channel counts.
struct DeformConv2dAttributes {
  std::vector<int64_t> strides{1, 1}, dilations{1, 1}, pads{0, 0, 0, 0};
  int64_t groups = 1, offset_groups = 1;
  std::vector<int64_t> kernel_shape;  // empty: taken from the weight
};

struct DeformConv2dNames {
  const char* op;
  const char* input;
  const char* weight;
  const char* offset;
  const char* mask;
  const char* bias;
};

// Checks every shape and attribute relation before any memory is touched; the
// message names the op, the argument and what was expected.
inline Status check_deform_conv2d(const DeformConv2dNames& names, const std::vector<int64_t>& input,
                                  const std::vector<int64_t>& weight, const std::vector<int64_t>& offset,
                                  const std::vector<int64_t>* mask, const std::vector<int64_t>* bias,
                                  const DeformConv2dAttributes& attributes, DeformConv2dShape& s) {
  const std::string op = names.op;
  auto fail = [&](const std::string& message) { return Status{op + ": " + message}; };
  auto rank4 = [&](const char* name, const std::vector<int64_t>& shape) -> std::string {
    if (shape.size() != 4) {
      return std::string(name) + " must be 4-D, got shape " + shape_to_string(shape);
    }
    return {};
  };
  for (auto [name, shape] : {std::pair{names.input, &input}, {names.weight, &weight}, {names.offset, &offset}}) {
    if (auto message = rank4(name, *shape); !message.empty()) return fail(message);
  }
  if (mask != nullptr) {
    if (auto message = rank4(names.mask, *mask); !message.empty()) return fail(message);
  }
  if (bias != nullptr && bias->size() != 1) {
    return fail(std::string(names.bias) + " must be 1-D, got shape " + shape_to_string(*bias));
  }
  if (attributes.strides.size() != 2 || attributes.dilations.size() != 2 || attributes.pads.size() != 4) {
    return fail("strides and dilations need 2 values and pads 4 (top, left, bottom, right), got " +
                shape_to_string(attributes.strides) + ", " + shape_to_string(attributes.dilations) + " and " +
                shape_to_string(attributes.pads));
  }
  s.batch = input[0], s.in_channels = input[1], s.height = input[2], s.width = input[3];
  s.out_channels = weight[0], s.kernel_h = weight[2], s.kernel_w = weight[3];
  s.stride_h = attributes.strides[0], s.stride_w = attributes.strides[1];
  s.dilation_h = attributes.dilations[0], s.dilation_w = attributes.dilations[1];
  s.pad_top = attributes.pads[0], s.pad_left = attributes.pads[1];
  s.pad_bottom = attributes.pads[2], s.pad_right = attributes.pads[3];
  s.groups = attributes.groups, s.offset_groups = attributes.offset_groups;
  if (s.groups == 0 && weight[1] > 0 && s.in_channels % weight[1] == 0) s.groups = s.in_channels / weight[1];
  if (const int64_t taps2 = 2 * s.kernel_h * s.kernel_w; s.offset_groups == 0 && taps2 > 0 && offset[1] % taps2 == 0) {
    s.offset_groups = offset[1] / taps2;
  }
  s.has_mask = mask != nullptr, s.has_bias = bias != nullptr;
  if (s.stride_h <= 0 || s.stride_w <= 0 || s.dilation_h <= 0 || s.dilation_w <= 0) {
    return fail("strides and dilations must be positive, got " + shape_to_string(attributes.strides) + " and " +
                shape_to_string(attributes.dilations));
  }
  if (*std::min_element(attributes.pads.begin(), attributes.pads.end()) < 0) {
    return fail("pads must not be negative, got " + shape_to_string(attributes.pads));
  }
  if (!attributes.kernel_shape.empty() &&
      (attributes.kernel_shape.size() != 2 || attributes.kernel_shape[0] != s.kernel_h ||
       attributes.kernel_shape[1] != s.kernel_w)) {
    return fail("kernel_shape " + shape_to_string(attributes.kernel_shape) + " does not match " + names.weight +
                " of shape " + shape_to_string(weight));
  }
  if (s.kernel_h <= 0 || s.kernel_w <= 0 || s.out_channels <= 0) {
    return fail(std::string(names.weight) + " must have positive output channels and kernel size, got shape " +
                shape_to_string(weight));
  }
  if (s.groups <= 0 || s.in_channels % s.groups != 0 || s.out_channels % s.groups != 0 ||
      weight[1] * s.groups != s.in_channels) {
    return fail(std::to_string(s.groups) + " group(s) must divide the " + std::to_string(s.in_channels) +
                " input channels of " + names.input + " and the " + std::to_string(s.out_channels) +
                " output channels, with " + names.weight + ".shape[1] == in_channels / groups; got " + names.weight +
                " of shape " + shape_to_string(weight));
  }
  if (s.offset_groups <= 0 || s.in_channels % s.offset_groups != 0) {
    return fail(std::to_string(s.offset_groups) + " offset group(s) must divide the " + std::to_string(s.in_channels) +
                " input channels");
  }
  // Output size, in checked arithmetic: a huge dilation or pad must not overflow.
  // Pads are bounded first, so that adding two of them cannot overflow either.
  constexpr int64_t kMaxPad = int64_t(1) << 40;
  int64_t span_h = 0, span_w = 0, padded_h = 0, padded_w = 0;
  if (s.pad_top > kMaxPad || s.pad_left > kMaxPad || s.pad_bottom > kMaxPad || s.pad_right > kMaxPad ||
      __builtin_mul_overflow(s.dilation_h, s.kernel_h - 1, &span_h) ||
      __builtin_mul_overflow(s.dilation_w, s.kernel_w - 1, &span_w) ||
      __builtin_add_overflow(s.height, s.pad_top + s.pad_bottom, &padded_h) ||
      __builtin_add_overflow(s.width, s.pad_left + s.pad_right, &padded_w)) {
    return fail("dilations, pads or kernel size are too large");
  }
  s.out_h = padded_h - span_h - 1 < 0 ? 0 : (padded_h - span_h - 1) / s.stride_h + 1;
  s.out_w = padded_w - span_w - 1 < 0 ? 0 : (padded_w - span_w - 1) / s.stride_w + 1;
  if (s.out_h <= 0 || s.out_w <= 0) {
    return fail("the kernel (with dilation) does not fit in the padded input: " + std::string(names.input) +
                " of shape " + shape_to_string(input) + ", kernel " + std::to_string(s.kernel_h) + "x" +
                std::to_string(s.kernel_w));
  }
  const int64_t taps = s.kernel_h * s.kernel_w;
  const std::vector<int64_t> want_offset{s.batch, 2 * s.offset_groups * taps, s.out_h, s.out_w};
  if (offset != want_offset) {
    return fail(std::string(names.offset) + " must have shape " + shape_to_string(want_offset) +
                " (batch, 2 * offset_groups * kernel_h * kernel_w, out_h, out_w), got " + shape_to_string(offset));
  }
  if (mask != nullptr) {
    const std::vector<int64_t> want_mask{s.batch, s.offset_groups * taps, s.out_h, s.out_w};
    if (*mask != want_mask) {
      return fail(std::string(names.mask) + " must have shape " + shape_to_string(want_mask) +
                  " (batch, offset_groups * kernel_h * kernel_w, out_h, out_w), got " + shape_to_string(*mask));
    }
  }
  if (bias != nullptr && (*bias)[0] != s.out_channels) {
    return fail(std::string(names.bias) + " must have " + std::to_string(s.out_channels) +
                " elements (the output channels), got shape " + shape_to_string(*bias));
  }
  // Every buffer the kernel indexes must be addressable in int64.
  int64_t elements = 0;
  for (const auto* shape : {&input, &weight, &offset}) {
    if (!checked_numel(*shape, elements)) return fail("a tensor has too many elements");
  }
  const std::vector<int64_t> columns{s.in_channels, taps, s.out_h, s.out_w};
  const std::vector<int64_t> output{s.batch, s.out_channels, s.out_h, s.out_w};
  if (!checked_numel(columns, elements) || !checked_numel(output, elements)) {
    return fail("the output or the sampling buffer would have too many elements");
  }
  return {};
}

// Where kernel tap (i, j) of output pixel (oy, ox) samples the input, moved by its learned offset (dy, dx). I: the
// integer type of the grid position (int64; int32 in the CUDA kernels where it fits: the same values).
template <class T, class I = int64_t>
OPBRIDGE_HD inline void deform_conv2d_position(const DeformConv2dShape& s, I oy, I ox, I i, I j, T dy, T dx, T& y,
                                               T& x) {
  y = T(oy * I(s.stride_h) - I(s.pad_top) + i * I(s.dilation_h)) + dy;
  x = T(ox * I(s.stride_w) - I(s.pad_left) + j * I(s.dilation_w)) + dx;
}

// The weighted sum of four neighbour rows, out[c] = ((w0 r0[c] + w1 r1[c]) +
// w2 r2[c]) + w3 r3[c], times `scale` when `scaled` (the mask): the inner loop of
// the sampling, contiguous over channels, cloned for AVX-512/AVX2 and chosen at
// run time. Same operations in the same order in every clone (no fused
// multiply-adds, see the build flags): results do not depend on the CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define OPBRIDGE_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OPBRIDGE_VECTOR_CLONES
#endif

// blend4_pixels: the blends of n pixels of one tap in one call (the per-call cost of a dispatched function had
// been a fifth of the blend's time at 64 channels): pixel q's four rows are rows[4 q + k] + channel (k =
// top-left, top-right, bottom-left, bottom-right), its weights w0[q]..w3[q], its scale scales[q] (scales null: none),
// and its count channels go to out + q * stride.
#define OPBRIDGE_DEFINE_BLEND4(T)                                                                                   \
  [[gnu::always_inline]] inline void blend4_body(T* __restrict out, const T* __restrict r0, const T* __restrict r1, \
                                                 const T* __restrict r2, const T* __restrict r3, T w0, T w1, T w2,  \
                                                 T w3, bool scaled, T scale, int64_t n) {                           \
    if (scaled) {                                                                                                   \
      for (int64_t c = 0; c < n; ++c) out[c] = (w0 * r0[c] + w1 * r1[c] + w2 * r2[c] + w3 * r3[c]) * scale;         \
    } else {                                                                                                        \
      for (int64_t c = 0; c < n; ++c) out[c] = w0 * r0[c] + w1 * r1[c] + w2 * r2[c] + w3 * r3[c];                   \
    }                                                                                                               \
  }                                                                                                                 \
  [[maybe_unused]] OPBRIDGE_VECTOR_CLONES static void blend4(                                                       \
      T* __restrict out, const T* __restrict r0, const T* __restrict r1, const T* __restrict r2,                    \
      const T* __restrict r3, T w0, T w1, T w2, T w3, bool scaled, T scale, int64_t n) {                            \
    blend4_body(out, r0, r1, r2, r3, w0, w1, w2, w3, scaled, scale, n);                                             \
  }                                                                                                                 \
  [[maybe_unused]] OPBRIDGE_VECTOR_CLONES static void blend4_pixels(                                                \
      T* out, int64_t stride, const T* const* rows, int64_t channel, const T* w0, const T* w1, const T* w2,         \
      const T* w3, const T* scales, int n, int64_t count) {                                                         \
    for (int q = 0; q < n; ++q) {                                                                                   \
      const T* const* r = rows + 4 * q;                                                                             \
      blend4_body(out + q * stride, r[0] + channel, r[1] + channel, r[2] + channel, r[3] + channel, w0[q], w1[q],   \
                  w2[q], w3[q], scales != nullptr, scales != nullptr ? scales[q] : T(1), count);                    \
    }                                                                                                               \
  }
OPBRIDGE_DEFINE_BLEND4(float)
OPBRIDGE_DEFINE_BLEND4(double)
#undef OPBRIDGE_DEFINE_BLEND4

#if !defined(__CUDACC__)  // the CPU's im2col only (nvcc's front end need not parse GCC's vector extensions here)
// blend4 into bfloat16 columns: the float blend4's value, rounded once (deform_conv2d_bf16_products), 16 channels
// at a time in 64-byte vectors (GCC's vector extensions: one zmm register in the AVX-512 clone, two ymm in the AVX2
// one), whose sums and rounding (bf16_bits', lane by lane) the compiler would otherwise split into 32-byte halves
// and pack: with C_in 64, the rounding had made this loop twice the float loop's time (2026-11-28, perf).
[[gnu::always_inline]] inline void blend4_bf16_vectors_body(BFloat16* __restrict out, const float* __restrict r0,
                                                            const float* __restrict r1, const float* __restrict r2,
                                                            const float* __restrict r3, float w0, float w1, float w2,
                                                            float w3, bool scaled, float scale, int64_t n) {
  using Floats = float __attribute__((vector_size(64)));
  using Words = uint32_t __attribute__((vector_size(64)));
  using Halves = uint16_t __attribute__((vector_size(32)));
  auto* bits = reinterpret_cast<uint16_t*>(out);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    Floats a0, a1, a2, a3;
    std::memcpy(&a0, r0 + c, sizeof a0);
    std::memcpy(&a1, r1 + c, sizeof a1);
    std::memcpy(&a2, r2 + c, sizeof a2);
    std::memcpy(&a3, r3 + c, sizeof a3);
    Floats v = w0 * a0 + w1 * a1 + w2 * a2 + w3 * a3;
    if (scaled) v = v * scale;
    Words x;
    std::memcpy(&x, &v, sizeof x);
    const Words rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const auto nan = reinterpret_cast<Words>((x & 0x7fffffffu) > 0x7f800000u);  // all ones where NaN
    const Halves h = __builtin_convertvector((rounded & ~nan) | (nan & 0x7fc0u), Halves);
    std::memcpy(bits + c, &h, sizeof h);
  }
  for (; c < n; ++c) {
    const float v = w0 * r0[c] + w1 * r1[c] + w2 * r2[c] + w3 * r3[c];
    bits[c] = bf16_bits(scaled ? v * scale : v);
  }
}

[[maybe_unused]] OPBRIDGE_VECTOR_CLONES static void blend4_bf16_vectors(
    BFloat16* __restrict out, const float* __restrict r0, const float* __restrict r1, const float* __restrict r2,
    const float* __restrict r3, float w0, float w1, float w2, float w3, bool scaled, float scale, int64_t n) {
  blend4_bf16_vectors_body(out, r0, r1, r2, r3, w0, w1, w2, w3, scaled, scale, n);
}
[[maybe_unused]] OPBRIDGE_VECTOR_CLONES static void blend4_bf16_vectors_pixels(
    BFloat16* out, int64_t stride, const float* const* rows, int64_t channel, const float* w0, const float* w1,
    const float* w2, const float* w3, const float* scales, int n, int64_t count) {
  for (int q = 0; q < n; ++q) {
    const float* const* r = rows + 4 * q;
    blend4_bf16_vectors_body(out + q * stride, r[0] + channel, r[1] + channel, r[2] + channel, r[3] + channel, w0[q],
                             w1[q], w2[q], w3[q], scales != nullptr, scales != nullptr ? scales[q] : 1.0f, count);
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The same on CPUs with AVX512-BF16, whose vcvtneps2bf16 rounds 16 floats to nearest even in one instruction (the
// integer rounding and the narrowing were most of the loop above). It reads subnormal inputs as zero and keeps a
// NaN's sign and payload, where bf16_bits rounds subnormals and writes 0x7fc0: a vector holding either (found from
// its bits, whatever the CPU's denormal flags) is rounded lane by lane by bf16_bits instead, so the bits are
// bf16_bits' in every case. The instruction is written as its bytes (EVEX 62 F2 7E 48 72 C0: vcvtneps2bf16 %zmm0,
// %ymm0): the wheels' assembler (binutils of the manylinux toolchain) does not know its name.
[[gnu::always_inline]] __attribute__((target("avx512f"))) inline void blend4_bf16_instructions_body(
    BFloat16* __restrict out, const float* __restrict r0, const float* __restrict r1, const float* __restrict r2,
    const float* __restrict r3, float w0, float w1, float w2, float w3, bool scaled, float scale, int64_t n) {
  auto* bits = reinterpret_cast<uint16_t*>(out);
  const __m512 v0 = _mm512_set1_ps(w0), v1 = _mm512_set1_ps(w1), v2 = _mm512_set1_ps(w2), v3 = _mm512_set1_ps(w3);
  const __m512 by = _mm512_set1_ps(scale);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i largest_subnormal = _mm512_set1_epi32(0x007fffff), infinity = _mm512_set1_epi32(0x7f800000);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    __m512 v = _mm512_add_ps(
        _mm512_add_ps(_mm512_mul_ps(v0, _mm512_loadu_ps(r0 + c)), _mm512_mul_ps(v1, _mm512_loadu_ps(r1 + c))),
        _mm512_mul_ps(v2, _mm512_loadu_ps(r2 + c)));
    v = _mm512_add_ps(v, _mm512_mul_ps(v3, _mm512_loadu_ps(r3 + c)));
    if (scaled) v = _mm512_mul_ps(v, by);
    const __m512i x = _mm512_and_si512(_mm512_castps_si512(v), magnitude);
    // A subnormal (|x| - 1 below 2^23 - 1, unsigned: zero wraps above) or a NaN (|x| above infinity's bits).
    const __mmask16 special =
        _mm512_cmple_epu32_mask(_mm512_sub_epi32(x, one), _mm512_sub_epi32(largest_subnormal, one)) |
        _mm512_cmpgt_epu32_mask(x, infinity);
    if (special != 0) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, v);
      for (int k = 0; k < 16; ++k) bits[c + k] = bf16_bits(lanes[k]);
      continue;
    }
    register __m512 sums asm("zmm0") = v;
    asm(".byte 0x62, 0xf2, 0x7e, 0x48, 0x72, 0xc0" : "+v"(sums));  // vcvtneps2bf16 %zmm0, %ymm0
    const __m512 rounded = sums;
    std::memcpy(bits + c, &rounded, 32);  // the low 256 bits: 16 bfloat16 (GCC 12 warns on _mm512_castsi512_si256)
  }
  for (; c < n; ++c) {
    const float v = w0 * r0[c] + w1 * r1[c] + w2 * r2[c] + w3 * r3[c];
    bits[c] = bf16_bits(scaled ? v * scale : v);
  }
}
[[maybe_unused]] __attribute__((target("avx512f"))) static void blend4_bf16_instructions(
    BFloat16* __restrict out, const float* __restrict r0, const float* __restrict r1, const float* __restrict r2,
    const float* __restrict r3, float w0, float w1, float w2, float w3, bool scaled, float scale, int64_t n) {
  blend4_bf16_instructions_body(out, r0, r1, r2, r3, w0, w1, w2, w3, scaled, scale, n);
}
[[maybe_unused]] __attribute__((target("avx512f"))) static void blend4_bf16_instructions_pixels(
    BFloat16* out, int64_t stride, const float* const* rows, int64_t channel, const float* w0, const float* w1,
    const float* w2, const float* w3, const float* scales, int n, int64_t count) {
  for (int q = 0; q < n; ++q) {
    const float* const* r = rows + 4 * q;
    blend4_bf16_instructions_body(out + q * stride, r[0] + channel, r[1] + channel, r[2] + channel, r[3] + channel,
                                  w0[q], w1[q], w2[q], w3[q], scales != nullptr, scales != nullptr ? scales[q] : 1.0f,
                                  count);
  }
}
#endif

// blend4 into bfloat16 columns, by what this CPU has (the same bits either way).
[[maybe_unused]] static void blend4(BFloat16* __restrict out, const float* __restrict r0, const float* __restrict r1,
                                    const float* __restrict r2, const float* __restrict r3, float w0, float w1,
                                    float w2, float w3, bool scaled, float scale, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (cpu_has_avx512_bf16()) return blend4_bf16_instructions(out, r0, r1, r2, r3, w0, w1, w2, w3, scaled, scale, n);
#endif
  blend4_bf16_vectors(out, r0, r1, r2, r3, w0, w1, w2, w3, scaled, scale, n);
}

// blend4_pixels into bfloat16 columns, by what this CPU has.
[[maybe_unused]] static void blend4_pixels(BFloat16* out, int64_t stride, const float* const* rows, int64_t channel,
                                           const float* w0, const float* w1, const float* w2, const float* w3,
                                           const float* scales, int n, int64_t count) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (cpu_has_avx512_bf16()) {
    return blend4_bf16_instructions_pixels(out, stride, rows, channel, w0, w1, w2, w3, scales, n, count);
  }
#endif
  blend4_bf16_vectors_pixels(out, stride, rows, channel, w0, w1, w2, w3, scales, n, count);
}
#endif  // !defined(__CUDACC__)

// Deformable im2col of output pixels [first, first + count) of one image,
// pixel-major: columns[q * ld + (g * K + k) * C_g + ci] is input channel
// g * C_g + ci (weight group g, C_g channels per group) sampled at kernel tap k
// for pixel first + q, times the mask when given. `input_hwc` is the image
// channels-last ([H * W, C_in]) so that the four bilinear neighbours of a
// position are four contiguous rows of channels; `zeros` is C_in zeros, the row
// of a neighbour outside the image (which counts as zero, as in torchvision).
// The position and weights are computed once per pixel, tap and offset group,
// and shared by the group's channels. This is the plain loop, one pixel and tap
// at a time: deformable_im2col_block computes the same values with the positions
// in vectors, and falls back to this one where coordinates exceed 32 bits.
template <class T, class C = T>
void deformable_im2col_block_scalar(const T* input_hwc, const T* zeros, const T* offset, const T* mask,
                                    const DeformConv2dShape& s, int64_t first, int64_t count, C* columns, int64_t ld) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, channels = s.in_channels;
  const int64_t per_offset_group = channels / s.offset_groups, per_group = channels / s.groups;
  for (int64_t q = 0; q < count; ++q) {
    const int64_t p = first + q, oy = p / s.out_w, ox = p % s.out_w;
    C* column = columns + q * ld;
    for (int64_t og = 0; og < s.offset_groups; ++og) {
      for (int64_t tap = 0; tap < taps; ++tap) {
        const int64_t i = tap / s.kernel_w, j = tap % s.kernel_w;
        const T* dy = offset + (og * taps + tap) * 2 * pixels;
        T y, x;
        deform_conv2d_position(s, oy, ox, i, j, dy[p], dy[pixels + p], y, x);
        const T* rows[4] = {zeros, zeros, zeros, zeros};
        T w[4] = {T(0), T(0), T(0), T(0)};
        if (y > T(-1) && y < T(s.height) && x > T(-1) && x < T(s.width)) {  // also rejects NaN
          // floor() of a value in (-1, size): truncation, or -1 below zero (no libm call on baseline x86-64).
          const int64_t y_low = y >= T(0) ? static_cast<int64_t>(y) : -1;
          const int64_t x_low = x >= T(0) ? static_cast<int64_t>(x) : -1;
          const T ly = y - T(y_low), lx = x - T(x_low), hy = T(1) - ly, hx = T(1) - lx;
          w[0] = hy * hx, w[1] = hy * lx, w[2] = ly * hx, w[3] = ly * lx;
          const bool top = y_low >= 0, bottom = y_low + 1 < s.height, left = x_low >= 0, right = x_low + 1 < s.width;
          // Element offsets of the corners' rows; a pointer is formed only for a corner in the image (the cell's
          // top-left corner is outside it, before the buffer, where y_low or x_low is -1).
          const int64_t at = (y_low * s.width + x_low) * channels;
          if (top && left) rows[0] = input_hwc + at;
          if (top && right) rows[1] = input_hwc + (at + channels);
          if (bottom && left) rows[2] = input_hwc + (at + s.width * channels);
          if (bottom && right) rows[3] = input_hwc + (at + (s.width + 1) * channels);
        }
        const bool scaled = mask != nullptr;
        const T scale = scaled ? mask[(og * taps + tap) * pixels + p] : T(1);
        // This offset group's channels, split where a weight group ends.
        for (int64_t c = og * per_offset_group, end = c + per_offset_group; c < end;) {
          const int64_t g = c / per_group, stop = std::min(end, (g + 1) * per_group);
          C* out = column + (g * taps + tap) * per_group + (c - g * per_group);
          blend4(out, rows[0] + c, rows[1] + c, rows[2] + c, rows[3] + c, w[0], w[1], w[2], w[3], scaled, scale,
                 stop - c);
          c = stop;
        }
      }
    }
  }
}

#if !defined(__CUDACC__)
// One kernel tap's bilinear samples for n output pixels, in vectors across the pixels (the scalar loop's branches
// as selects): the sample position is (base_y[q] + add_y + dy[q], base_x[q] + add_x + dx[q]) (the integer part
// summed exactly, as deform_conv2d_position does), its cell's top-left corner (y_low[q], x_low[q]) and the four
// corners' weights w0..w3 (hy hx, hy lx, ly hx, ly lx), all as in deformable_im2col_block_scalar; corners[q] has bit
// k set where corner k (top-left, top-right, bottom-left, bottom-right) lies in the image. A position outside
// (-1, height) x (-1, width), or NaN, gets no corners and zero weights. Coordinates fit in 32 bits (checked by the
// caller).
// GCC keeps branches around float comparisons and conversions while the program may observe floating-point
// exceptions (-ftrapping-math, the default): this function's loop is vectorized only without (the values are the
// same: no exception is looked at, and every conversion is of a value in range).
#if defined(__GNUC__) && !defined(__clang__)
#define OPBRIDGE_NO_TRAPPING_MATH __attribute__((optimize("no-trapping-math")))
#else
#define OPBRIDGE_NO_TRAPPING_MATH
#endif
#define OPBRIDGE_DEFINE_TAP_SAMPLES(T)                                                                              \
  [[maybe_unused]] OPBRIDGE_VECTOR_CLONES OPBRIDGE_NO_TRAPPING_MATH static void tap_samples(                        \
      const T* __restrict dy, const T* __restrict dx, const int32_t* __restrict base_y,                             \
      const int32_t* __restrict base_x, int32_t add_y, int32_t add_x, int32_t height, int32_t width, int n,         \
      T* __restrict w0, T* __restrict w1, T* __restrict w2, T* __restrict w3, int32_t* __restrict y_low,            \
      int32_t* __restrict x_low, int32_t* __restrict corners) {                                                     \
    for (int q = 0; q < n; ++q) {                                                                                   \
      const T y = T(base_y[q] + add_y) + dy[q], x = T(base_x[q] + add_x) + dx[q];                                   \
      const bool inside = (y > T(-1)) & (y < T(height)) & (x > T(-1)) & (x < T(width));                             \
      const T ys = inside ? y : T(0), xs = inside ? x : T(0); /* in range before the conversions */                 \
      /* floor() of a value in (-1, size): truncation, minus one below zero (no branch: vectorized) */              \
      const int32_t yl = static_cast<int32_t>(ys) - (ys < T(0)), xl = static_cast<int32_t>(xs) - (xs < T(0));       \
      const T ly = ys - T(yl), lx = xs - T(xl), hy = T(1) - ly, hx = T(1) - lx;                                     \
      w0[q] = inside ? hy * hx : T(0), w1[q] = inside ? hy * lx : T(0);                                             \
      w2[q] = inside ? ly * hx : T(0), w3[q] = inside ? ly * lx : T(0);                                             \
      y_low[q] = yl, x_low[q] = xl;                                                                                 \
      const int32_t top = yl >= 0, bottom = yl + 1 < height, left = xl >= 0, right = xl + 1 < width;                \
      corners[q] = inside ? ((top & left) | (top & right) << 1 | (bottom & left) << 2 | (bottom & right) << 3) : 0; \
    }                                                                                                               \
  }
OPBRIDGE_DEFINE_TAP_SAMPLES(float)
OPBRIDGE_DEFINE_TAP_SAMPLES(double)
#undef OPBRIDGE_DEFINE_TAP_SAMPLES
#undef OPBRIDGE_NO_TRAPPING_MATH
#endif  // !defined(__CUDACC__)

// Whether every coordinate deformable_im2col_block forms fits in 32 bits: the tap positions' integer parts (first
// output pixel's minus the padding, last one's plus the kernel's extent) and the image's size.
inline bool deform_conv2d_coordinates_fit_int32(const DeformConv2dShape& s) {
  constexpr int64_t limit = int64_t(1) << 30;  // margin for the sums of two such values
  const auto fits = [&](int64_t out, int64_t stride, int64_t pad, int64_t kernel, int64_t dilation, int64_t size) {
    return out <= limit && stride <= limit && pad <= limit && kernel <= limit && dilation <= limit && size < limit &&
           (out - 1) * stride + (kernel - 1) * dilation < limit;
  };
  return fits(s.out_h, s.stride_h, s.pad_top, s.kernel_h, s.dilation_h, s.height) &&
         fits(s.out_w, s.stride_w, s.pad_left, s.kernel_w, s.dilation_w, s.width);
}

// Each offset group's channels, split where a weight group ends: segments [starts[og], starts[og + 1]) are offset
// group og's, each a run of `count` channels from `channel` in one weight group, whose column in a pixel's row of
// the forward's columns ((g * K + k) * C_g + ci) is `column` + k * C_g at tap k.
struct ChannelSegment {
  int64_t channel, count, column;
};
struct ChannelSegments {
  std::vector<ChannelSegment> segments;
  std::vector<size_t> starts{0};

  explicit ChannelSegments(const DeformConv2dShape& s) {
    const int64_t taps = s.kernel_h * s.kernel_w, per_group = s.in_channels / s.groups;
    const int64_t per_offset_group = s.in_channels / s.offset_groups;
    for (int64_t og = 0; og < s.offset_groups; ++og) {
      for (int64_t c = og * per_offset_group, end = c + per_offset_group; c < end;) {
        const int64_t g = c / per_group, stop = std::min(end, (g + 1) * per_group);
        segments.push_back({c, stop - c, g * taps * per_group + (c - g * per_group)});
        c = stop;
      }
      starts.push_back(segments.size());
    }
  }
};

// Deformable im2col of output pixels [first, first + count) of one image,
// pixel-major: columns[q * ld + (g * K + k) * C_g + ci] is input channel
// g * C_g + ci (weight group g, C_g channels per group) sampled at kernel tap k
// for pixel first + q, times the mask when given. `input_hwc` is the image
// channels-last ([H * W, C_in]) so that the four bilinear neighbours of a
// position are four contiguous rows of channels; `zeros` is C_in zeros, the row
// of a neighbour outside the image (which counts as zero, as in torchvision).
// Pixels go in chunks of 16: for each offset group and tap, tap_samples computes
// the chunk's positions and weights in vectors, then each pixel's four rows are
// blended into its columns. The same values as deformable_im2col_block_scalar,
// bit for bit (which it runs where coordinates exceed 32 bits).
template <class T, class C = T>
void deformable_im2col_block(const T* input_hwc, const T* zeros, const T* offset, const T* mask,
                             const DeformConv2dShape& s, int64_t first, int64_t count, C* columns, int64_t ld) {
#if defined(__CUDACC__)
  deformable_im2col_block_scalar(input_hwc, zeros, offset, mask, s, first, count, columns, ld);
#else
  if (!deform_conv2d_coordinates_fit_int32(s)) {
    deformable_im2col_block_scalar(input_hwc, zeros, offset, mask, s, first, count, columns, ld);
    return;
  }
  constexpr int kChunk = 16;
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, channels = s.in_channels;
  const int64_t per_group = channels / s.groups;
  const auto height = static_cast<int32_t>(s.height), width = static_cast<int32_t>(s.width);
  alignas(64) int32_t base_y[kChunk], base_x[kChunk], y_low[kChunk], x_low[kChunk], corners[kChunk];
  alignas(64) T w[4][kChunk];
  const T* rows[4 * kChunk];
  const bool scaled = mask != nullptr;
  const ChannelSegments split(s);
  const std::vector<ChannelSegment>& segments = split.segments;
  const std::vector<size_t>& starts = split.starts;
  for (int64_t q0 = 0; q0 < count; q0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, count - q0));
    for (int64_t q = 0, oy = (first + q0) / s.out_w, ox = (first + q0) % s.out_w; q < n; ++q) {
      base_y[q] = static_cast<int32_t>(oy * s.stride_h - s.pad_top);
      base_x[q] = static_cast<int32_t>(ox * s.stride_w - s.pad_left);
      if (++ox == s.out_w) ox = 0, ++oy;
    }
    for (int64_t og = 0; og < s.offset_groups; ++og) {
      for (int64_t tap = 0; tap < taps; ++tap) {
        const auto i = static_cast<int32_t>(tap / s.kernel_w), j = static_cast<int32_t>(tap % s.kernel_w);
        const T* dy = offset + (og * taps + tap) * 2 * pixels + first + q0;
        tap_samples(dy, dy + pixels, base_y, base_x, i * static_cast<int32_t>(s.dilation_h),
                    j * static_cast<int32_t>(s.dilation_w), height, width, n, w[0], w[1], w[2], w[3], y_low, x_low,
                    corners);
        const T* scales = scaled ? mask + (og * taps + tap) * pixels + first + q0 : nullptr;
        for (int q = 0; q < n; ++q) {
          // A row pointer is formed only for a corner in the image; the others read the zero row.
          const int64_t at = (static_cast<int64_t>(y_low[q]) * s.width + x_low[q]) * channels;
          const int32_t inside = corners[q];
          rows[4 * q] = inside & 1 ? input_hwc + at : zeros;
          rows[4 * q + 1] = inside & 2 ? input_hwc + (at + channels) : zeros;
          rows[4 * q + 2] = inside & 4 ? input_hwc + (at + s.width * channels) : zeros;
          rows[4 * q + 3] = inside & 8 ? input_hwc + (at + (s.width + 1) * channels) : zeros;
        }
        C* out = columns + q0 * ld + tap * per_group;
        for (size_t k = starts[og]; k < starts[og + 1]; ++k) {
          const ChannelSegment& g = segments[k];
          blend4_pixels(out + g.column, ld, rows, g.channel, w[0], w[1], w[2], w[3], scales, n, g.count);
        }
      }
    }
  }
#endif
}

// x . y in 16 independent lanes (so that the compiler vectorizes it without
// reassociating a single sum), cloned like blend4.
#define OPBRIDGE_DEFINE_DOT(T)                                                                                    \
  [[maybe_unused]] OPBRIDGE_VECTOR_CLONES static T dot(const T* __restrict x, const T* __restrict y, int64_t k) { \
    T lanes[16] = {};                                                                                             \
    int64_t p = 0;                                                                                                \
    for (; p + 16 <= k; p += 16) {                                                                                \
      for (int l = 0; l < 16; ++l) lanes[l] += x[p + l] * y[p + l];                                               \
    }                                                                                                             \
    T sum = T(0);                                                                                                 \
    for (int l = 0; l < 16; ++l) sum += lanes[l];                                                                 \
    for (; p < k; ++p) sum += x[p] * y[p];                                                                        \
    return sum;                                                                                                   \
  }
OPBRIDGE_DEFINE_DOT(float)
OPBRIDGE_DEFINE_DOT(double)
#undef OPBRIDGE_DEFINE_DOT

// C[M, N] = A[M, K] * B[N, K]^T, row-major with leading dimensions: the portable
// single-threaded GEMM for front ends without a BLAS (several times slower than
// one: see docs/architecture.md).
template <class T>
void gemm_reference(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
                    int64_t ldc) {
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t col = 0; col < n; ++col) c[row * ldc + col] = dot(a + row * lda, b + col * ldb, k);
  }
}

// Pixels per task of the channels-last copy: the tile's rows of the copy (for 256 channels, 32 KiB) stay in L1
// while every channel's run of pixels is read in order. Writing one channel at a time across the whole plane
// instead (a store every C * 4 bytes) took 9 ms of a 50 ms 256-channel 50x84 forward.
constexpr int64_t kTransposeTile = 32;

// target[p * channels + c] = source[c * plane + p] for pixels p in [first, last) (S: the source's storage, read
// into T).
template <class T, class S = T>
void transpose_to_channels_last(const S* source, T* target, int64_t channels, int64_t plane, int64_t first,
                                int64_t last) {
  for (int64_t c = 0; c < channels; ++c) {
    const S* row = source + c * plane;
    for (int64_t p = first; p < last; ++p) target[p * channels + c] = static_cast<T>(row[p]);
  }
}

// to[j * to_row + i] = from[i * from_row + j] for i < rows, j < cols: a transpose of floats, in 4 x 4 tiles of SSE
// registers, four destination rows at a time (one element at a time elsewhere and at the edges). deform_conv2d's
// channels-last copy of a float32 input: transpose_to_channels_last's one element at a time took 0.9x the blend's
// time (C64 128x128, perf).
inline void transpose_floats(const float* from, int64_t from_row, float* to, int64_t to_row, int64_t rows,
                             int64_t cols) {
  int64_t j0 = 0;
#if defined(__SSE2__) && !defined(__CUDACC__)
  for (; j0 + 4 <= cols; j0 += 4) {
    int64_t i0 = 0;
    for (; i0 + 4 <= rows; i0 += 4) {
      __m128 a0 = _mm_loadu_ps(from + i0 * from_row + j0), a1 = _mm_loadu_ps(from + (i0 + 1) * from_row + j0);
      __m128 a2 = _mm_loadu_ps(from + (i0 + 2) * from_row + j0), a3 = _mm_loadu_ps(from + (i0 + 3) * from_row + j0);
      _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
      _mm_storeu_ps(to + j0 * to_row + i0, a0);
      _mm_storeu_ps(to + (j0 + 1) * to_row + i0, a1);
      _mm_storeu_ps(to + (j0 + 2) * to_row + i0, a2);
      _mm_storeu_ps(to + (j0 + 3) * to_row + i0, a3);
    }
    for (int64_t j = j0; j < j0 + 4; ++j) {
      for (int64_t i = i0; i < rows; ++i) to[j * to_row + i] = from[i * from_row + j];
    }
  }
#endif
  for (int64_t j = j0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) to[j * to_row + i] = from[i * from_row + j];
  }
}

// Output pixels per task: the block's sampled columns (C_in * kh * kw values per
// pixel) stay within a few MiB, so im2col and the GEMM that reads them share the cache.
// An image splits into a multiple of 4 blocks of (nearly) equal size, so that 1, 2
// or 4 threads get the same work each: 10 blocks of 448 pixels and one of 168 left
// one of two threads idle for 12% of the time on a 50x84 map.
inline int64_t deform_conv2d_block_pixels(const DeformConv2dShape& s, size_t element_size) {
  const int64_t depth = s.in_channels * s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  const int64_t budget = int64_t(4) << 20;  // bytes of columns per task
  int64_t largest = budget / std::max<int64_t>(1, depth * static_cast<int64_t>(element_size));
  largest = std::clamp<int64_t>(largest / 16 * 16, 16, 512);
  int64_t blocks = (pixels + largest - 1) / largest;
  if (blocks > 1) blocks = (blocks + 3) / 4 * 4;
  const int64_t block = ((pixels + blocks - 1) / blocks + 15) / 16 * 16;
  return std::max<int64_t>(1, std::min(block, pixels));
}

// out [N, C_out, H_out, W_out] from input [N, C_in, H, W], weight
// [C_out, C_in / groups, kh, kw], offset, optional mask and bias (nullptr when
// absent), for a shape that passed check_deform_conv2d.
//
// The input is first laid out channels-last and the weight as [C_out, kh * kw,
// C_in / groups], to match the columns. Then the work is split into tasks of
// (image, block of output pixels); each task samples its block's columns into a
// buffer of its own and multiplies every weight group by them:
// gemm(m, n, k, a, lda, b, ldb, c, ldc) computes c = a * b^T (row-major,
// leading dimensions given; b is [n, k]) on the calling thread.
// The layouts the forward samples and multiplies: the input channels-last (input_hwc, [N, H * W, C_in], read from
// its storage S into T) and the weight as [C_out, kh * kw, C_in / groups] (weight_k, from its storage W into Wk).
template <class S, class T, class W, class Wk, class ParallelFor>
void deform_conv2d_layouts(const S* input, const W* weight, const DeformConv2dShape& s, T* input_hwc, Wk* weight_k,
                           ParallelFor&& parallel_for) {
  const int64_t taps = s.kernel_h * s.kernel_w, plane = s.height * s.width, per_group = s.in_channels / s.groups;
  const int64_t tiles = (plane + kTransposeTile - 1) / kTransposeTile;
  parallel_for(s.batch * tiles + s.out_channels, [&](int64_t task) {
    if (task >= s.batch * tiles) {  // one output channel's weights, as [kh * kw, C_in / groups]
      const int64_t o = task - s.batch * tiles;
      for (int64_t ci = 0; ci < per_group; ++ci) {
        for (int64_t t = 0; t < taps; ++t)
          weight_k[(o * taps + t) * per_group + ci] = static_cast<Wk>(weight[(o * per_group + ci) * taps + t]);
      }
      return;
    }
    const int64_t image = task / tiles, first = task % tiles * kTransposeTile;
    const int64_t last = std::min(plane, first + kTransposeTile);
    if constexpr (std::is_same_v<S, BFloat16> && std::is_same_v<T, float>) {  // 8 x 8 tiles, widened as written
      transpose_halves(reinterpret_cast<const uint16_t*>(input + image * s.in_channels * plane) + first, plane,
                       input_hwc + (image * plane + first) * s.in_channels, s.in_channels, s.in_channels, last - first);
    } else if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float>) {  // 4 x 4 tiles
      transpose_floats(input + image * s.in_channels * plane + first, plane,
                       input_hwc + (image * plane + first) * s.in_channels, s.in_channels, s.in_channels, last - first);
    } else {
      transpose_to_channels_last(input + image * s.in_channels * plane, input_hwc + image * plane * s.in_channels,
                                 s.in_channels, plane, first, last);
    }
  });
}

// The forward's tasks of (image, block of output pixels): each samples its block's columns into a buffer of its own,
// of type C (T, or bfloat16 rounded as im2col writes it), and hands them to product(image, first, count, columns,
// ld) on the same thread. input_hwc is the channels-last input (deform_conv2d_layouts).
template <class C, class T, class ParallelFor, class Product>
void deform_conv2d_column_blocks(const T* input_hwc, const T* offset, const T* mask, const DeformConv2dShape& s,
                                 ParallelFor&& parallel_for, Product&& product) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const std::vector<T> zeros(static_cast<size_t>(s.in_channels), T(0));
  const int64_t block = deform_conv2d_block_pixels(s, sizeof(C));
  const int64_t blocks = (pixels + block - 1) / block, ld = s.in_channels * taps;
  parallel_for(s.batch * blocks, [&](int64_t task) {
    const int64_t image = task / blocks, first = task % blocks * block;
    const int64_t count = std::min(block, pixels - first);
    const ThreadScratch columns(sizeof(C) * static_cast<size_t>(count * ld));  // im2col writes all of it
    deformable_im2col_block(input_hwc + image * plane * s.in_channels, zeros.data(),
                            offset + image * 2 * s.offset_groups * taps * pixels,
                            mask != nullptr ? mask + image * s.offset_groups * taps * pixels : nullptr, s, first, count,
                            columns.get<C>(), ld);
    product(image, first, count, static_cast<const C*>(columns.get<C>()), ld);
  });
}

template <class T, class ParallelFor, class Gemm>
void deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out,
                   const DeformConv2dShape& s, ParallelFor&& parallel_for, Gemm&& gemm) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t out_per_group = s.out_channels / s.groups, per_group = s.in_channels / s.groups;
  const int64_t depth = per_group * taps;  // GEMM inner dimension per group
  // The channels-last input and the reordered weight, in scratch memory the calling thread keeps (no page
  // faults and no zero-fill of megabytes on every call; every element is written below).
  const size_t input_count = static_cast<size_t>(s.batch * plane * s.in_channels);
  const ThreadScratch copies(sizeof(T) * (input_count + static_cast<size_t>(s.out_channels * depth)));
  T* const input_hwc = copies.get<T>();
  T* const weight_k = input_hwc + input_count;
  deform_conv2d_layouts(input, weight, s, input_hwc, weight_k, parallel_for);
  deform_conv2d_column_blocks<T>(input_hwc, offset, mask, s, parallel_for,
                                 [&](int64_t image, int64_t first, int64_t count, const T* columns, int64_t ld) {
                                   T* image_out = out + image * s.out_channels * pixels + first;
                                   for (int64_t group = 0; group < s.groups; ++group) {
                                     gemm(out_per_group, count, depth, weight_k + group * out_per_group * depth, depth,
                                          columns + group * depth, ld, image_out + group * out_per_group * pixels,
                                          pixels);
                                   }
                                   if (bias != nullptr) {
                                     for (int64_t channel = 0; channel < s.out_channels; ++channel) {
                                       T* row = image_out + channel * pixels;
                                       for (int64_t q = 0; q < count; ++q) row[q] += bias[channel];
                                     }
                                   }
                                 });
}

// The forward with bfloat16 products (deform_conv2d's bfloat16 path on CPUs with bfloat16 dot-product
// instructions, where a bfloat16 GEMM runs at twice the float32 one's speed): the columns sampled in float32 as
// deform_conv2d samples them and rounded to bfloat16 as they are written (to nearest even), then each weight group's
// product by linear(n, m, k, a, lda, b, ldb, bias, c, c_row, c_col): c[i * c_row + j * c_col] = a[n, k] . b[m, k]^T +
// bias[m] in float32 sums, rounded once to bfloat16 (bias null: none). So the output has two roundings, the sampled
// columns' and its own (the float32 path: one). input, weight, bias and out are bfloat16 (the input read into the
// float32 channels-last copy); offset and mask float32 (widened by the caller where they came as bfloat16).
template <class ParallelFor, class Linear>
void deform_conv2d_bf16_products(const BFloat16* input, const BFloat16* weight, const float* offset, const float* mask,
                                 const BFloat16* bias, BFloat16* out, const DeformConv2dShape& s,
                                 ParallelFor&& parallel_for, Linear&& linear) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t out_per_group = s.out_channels / s.groups, depth = s.in_channels / s.groups * taps;
  const size_t input_count = static_cast<size_t>(s.batch * plane * s.in_channels);
  const ThreadScratch copies(sizeof(float) * input_count +
                             sizeof(BFloat16) * static_cast<size_t>(s.out_channels * depth));
  float* const input_hwc = copies.get<float>();
  auto* const weight_k = reinterpret_cast<BFloat16*>(input_hwc + input_count);
  deform_conv2d_layouts(input, weight, s, input_hwc, weight_k, parallel_for);
  deform_conv2d_column_blocks<BFloat16>(
      input_hwc, offset, mask, s, parallel_for,
      [&](int64_t image, int64_t first, int64_t count, const BFloat16* rounded, int64_t ld) {
        BFloat16* image_out = out + image * s.out_channels * pixels + first;
        for (int64_t group = 0; group < s.groups; ++group) {
          linear(count, out_per_group, depth, rounded + group * depth, ld, weight_k + group * out_per_group * depth,
                 depth, bias != nullptr ? bias + group * out_per_group : nullptr,
                 image_out + group * out_per_group * pixels, 1, pixels);
        }
      });
}

}  // namespace opbridge::kernels
