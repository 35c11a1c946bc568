// float16 <-> float32 for whole arrays: the ORT library's float16 nodes widen their inputs to float32 and round their
// outputs back (ort/api.h, KernelInput and KernelOutput). x86's F16C instructions where the CPU has them (every
// x86-64 CPU since 2012; chosen at run time, the build targets plain x86-64), SoftFloat16's scalar conversion
// elsewhere, with the same bits either way (round to nearest even, infinities past 65504, NaNs stay NaN with their
// payload's top bits), except that F16C quiets a signaling float16 NaN (cpp/tests/test_float16.cpp compares them).
#pragma once

#include <cstdint>

#include "kernels/float16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#include <immintrin.h>
#define OPBRIDGE_HAVE_F16C_PATH 1
#endif

namespace opbridge::kernels {

inline void float16_to_float_scalar(const uint16_t* in, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = SoftFloat16::to_float(in[i]);
}

inline void float_to_float16_scalar(const float* in, uint16_t* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = SoftFloat16::from_float(in[i]);
}

#if defined(OPBRIDGE_HAVE_F16C_PATH)
namespace half_convert_detail {

__attribute__((target("avx,f16c"))) inline void widen_f16c(const uint16_t* in, float* out, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < count; ++i) out[i] = _cvtsh_ss(in[i]);
}

__attribute__((target("avx,f16c"))) inline void narrow_f16c(const float* in, uint16_t* out, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), half);
  }
  for (; i < count; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

inline bool cpu_has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

}  // namespace half_convert_detail
#endif

// out[i] = in[i] (binary16 bits) as float, for i < count.
inline void float16_to_float(const uint16_t* in, float* out, int64_t count) {
#if defined(OPBRIDGE_HAVE_F16C_PATH)
  if (half_convert_detail::cpu_has_f16c()) return half_convert_detail::widen_f16c(in, out, count);
#endif
  float16_to_float_scalar(in, out, count);
}

// out[i] = in[i] rounded to binary16 (nearest even), for i < count.
inline void float_to_float16(const float* in, uint16_t* out, int64_t count) {
#if defined(OPBRIDGE_HAVE_F16C_PATH)
  if (half_convert_detail::cpu_has_f16c()) return half_convert_detail::narrow_f16c(in, out, count);
#endif
  float_to_float16_scalar(in, out, count);
}

}  // namespace opbridge::kernels
