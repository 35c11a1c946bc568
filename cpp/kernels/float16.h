// IEEE binary16 for the CPU kernels: the compiler's _Float16 where it has one (GCC >= 12 on x86-64), else
// SoftFloat16, a 16-bit value converted to and from float in software with the same results: round to nearest
// even, subnormals, infinities, NaNs stay NaN. The wheels are built with an older GCC (the manylinux toolchain,
// docs/packaging.md) whose x86-64 target has no _Float16; the ops then compute half precision exactly as before
// (in float, rounded once) and link no libgcc helper of a newer GCC. Bit-compatible with at::Half and
// Ort::Float16_t either way. OPBRIDGE_SOFT_FLOAT16 forces the software type (its tests, cpp/tests/test_float16.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

#include "kernels/device.h"

namespace opbridge::kernels {

struct SoftFloat16 {
  uint16_t bits = 0;

  SoftFloat16() = default;
  OPBRIDGE_HD explicit SoftFloat16(float value) : bits(from_float(value)) {}
  OPBRIDGE_HD explicit operator float() const { return to_float(bits); }

  // float -> binary16, round to nearest even.
  OPBRIDGE_HD static uint16_t from_float(float value) {
    uint32_t x;
    std::memcpy(&x, &value, sizeof x);
    const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    uint32_t magnitude = x & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) {  // infinity, or NaN (kept quiet, with the payload's top bits)
      return sign | (magnitude > 0x7f800000u ? uint16_t(0x7e00u | ((magnitude >> 13) & 0x3ffu)) : uint16_t(0x7c00u));
    }
    if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above round to infinity
    if (magnitude < 0x38800000u) {                        // below 2^-14: a subnormal or zero
      // Adding 0.5 leaves the value's multiple of 2^-24 (the subnormal step), rounded to nearest even by the FPU,
      // in the low mantissa bits.
      float shifted;
      std::memcpy(&shifted, &magnitude, sizeof shifted);
      shifted += 0.5f;
      uint32_t bits;
      std::memcpy(&bits, &shifted, sizeof bits);
      return sign | static_cast<uint16_t>(bits - 0x3f000000u);
    }
    // A normal number: rebias the exponent (127 -> 15), then round the 13 dropped bits to nearest even (a carry
    // into the exponent is the right result, up to infinity).
    const uint32_t odd = (magnitude >> 13) & 1u;
    magnitude += 0xc8000fffu + odd;
    return sign | static_cast<uint16_t>(magnitude >> 13);
  }

  // Always inlined: the kernels built per instruction set call it (kernels/cpu_isa.h: no shared inline copies).
  OPBRIDGE_HD_INLINE static float to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t x;
    if (exponent == 0x1fu) {
      x = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
      x = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else {  // zero or subnormal: mantissa * 2^-24, exact in float
      const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
      std::memcpy(&x, &value, sizeof x);
      x |= sign;
    }
    float out;
    std::memcpy(&out, &x, sizeof out);
    return out;
  }
};

// bfloat16, the top half of a float32: float -> bfloat16 rounds to nearest even, and a NaN becomes 0x7fc0, bit for
// bit as c10::BFloat16 (Ort::BFloat16_t has the same layout). Arithmetic is the caller's, in float.
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  OPBRIDGE_HD explicit BFloat16(float value) : bits(from_float(value)) {}
  OPBRIDGE_HD explicit operator float() const { return to_float(bits); }

  OPBRIDGE_HD static uint16_t from_float(float value) {
    uint32_t x;
    std::memcpy(&x, &value, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  OPBRIDGE_HD static float to_float(uint16_t b) {
    const uint32_t x = static_cast<uint32_t>(b) << 16;
    float out;
    std::memcpy(&out, &x, sizeof out);
    return out;
  }
};

#if defined(__FLT16_MAX__) && !defined(OPBRIDGE_SOFT_FLOAT16)
using float16 = _Float16;
#else
using float16 = SoftFloat16;
#endif
using bfloat16 = BFloat16;

// Whether this CPU has AVX512-BF16 (vcvtneps2bf16, vdpbf16ps), checked once.
inline bool cpu_has_avx512_bf16() {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDACC__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
  }();
  return has;
#else
  return false;
#endif
}

// The bfloat16 bits of v rounded to nearest even (BFloat16::from_float's result; NaN a quiet NaN), branch-free so
// that loops of it vectorize.
inline uint16_t bf16_bits(float v) {
  uint32_t x;
  std::memcpy(&x, &v, sizeof x);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

// to[i] = from[i] rounded to bfloat16: float32 results written out once, as bfloat16.
inline void round_to_bf16(BFloat16* __restrict to, const float* __restrict from, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i].bits = bf16_bits(from[i]);
}

// to[j * to_row + i] = from[i * from_row + j] for i < rows, j < cols: a transpose of 16-bit values (bfloat16 or
// float16 bits), in 8 x 8 tiles of SSE2 registers (every x86-64 CPU has them; one element at a time elsewhere and
// at the edges). deform_conv2d's bfloat16 products come out [pixels, channels] and go to [channels, pixels] rows:
// one element at a time, with the strides as run-time values, this copy took 16 us of a 64 x 512 block's 110 us.
// With To = float, each bfloat16 is written as its float value (bits << 16): deform_conv2d's channels-last float
// copy of a bfloat16 input, which one element at a time took 0.7 ms of a 6 ms forward (C64 128x128).
template <class To>
void transpose_halves(const uint16_t* from, int64_t from_row, To* to, int64_t to_row, int64_t rows, int64_t cols) {
  static_assert(std::is_same_v<To, uint16_t> || std::is_same_v<To, float>, "16-bit values, or bfloat16 to float");
  const auto put = [](To* at, uint16_t v) {
    if constexpr (std::is_same_v<To, float>) {
      const uint32_t x = static_cast<uint32_t>(v) << 16;
      std::memcpy(at, &x, sizeof x);
    } else {
      *at = v;
    }
  };
  int64_t j0 = 0;
#if defined(__SSE2__) && !defined(__CUDACC__)
  // Eight destination rows at a time, each written from start to end: destination rows lie a plane apart (often a
  // multiple of 4 KiB), so a tile order that touched every row at once kept evicting its own lines.
  for (; j0 + 8 <= cols; j0 += 8) {
    int64_t i0 = 0;
    for (; i0 + 8 <= rows; i0 += 8) {
      __m128i a[8];
      for (int k = 0; k < 8; ++k) {
        a[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + (i0 + k) * from_row + j0));
      }
      // Pairs of rows interleaved (16 bits), then pairs of pairs (32), then halves (64): column j of the tile.
      const __m128i t0 = _mm_unpacklo_epi16(a[0], a[1]), t1 = _mm_unpackhi_epi16(a[0], a[1]);
      const __m128i t2 = _mm_unpacklo_epi16(a[2], a[3]), t3 = _mm_unpackhi_epi16(a[2], a[3]);
      const __m128i t4 = _mm_unpacklo_epi16(a[4], a[5]), t5 = _mm_unpackhi_epi16(a[4], a[5]);
      const __m128i t6 = _mm_unpacklo_epi16(a[6], a[7]), t7 = _mm_unpackhi_epi16(a[6], a[7]);
      const __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
      const __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
      const __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
      const __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
      const __m128i columns[8] = {_mm_unpacklo_epi64(u0, u4), _mm_unpackhi_epi64(u0, u4), _mm_unpacklo_epi64(u1, u5),
                                  _mm_unpackhi_epi64(u1, u5), _mm_unpacklo_epi64(u2, u6), _mm_unpackhi_epi64(u2, u6),
                                  _mm_unpacklo_epi64(u3, u7), _mm_unpackhi_epi64(u3, u7)};
      for (int k = 0; k < 8; ++k) {
        To* row = to + (j0 + k) * to_row + i0;
        if constexpr (std::is_same_v<To, float>) {  // zeros below each value: its float bits
          const __m128i zero = _mm_setzero_si128();
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row), _mm_unpacklo_epi16(zero, columns[k]));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 4), _mm_unpackhi_epi16(zero, columns[k]));
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row), columns[k]);
        }
      }
    }
    for (int64_t j = j0; j < j0 + 8; ++j) {
      for (int64_t i = i0; i < rows; ++i) put(to + j * to_row + i, from[i * from_row + j]);
    }
  }
#endif
  for (int64_t j = j0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) put(to + j * to_row + i, from[i * from_row + j]);
  }
}

}  // namespace opbridge::kernels
