// my_add(a, b) = 2 * a + b with broadcasting: the one implementation behind
// torch.ops.opbridge.my_add, opbridge._C.my_add and ORT's opbridge::MyAdd.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/broadcast.h"
#include "kernels/device.h"
#include "kernels/float16.h"
#include "kernels/streaming.h"

namespace opbridge::kernels {

// Half precision computes in float and rounds once, like torch's opmath.
template <class T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<SoftFloat16> {
  using type = float;
};
template <>
struct OpMath<BFloat16> {
  using type = float;
};
#if defined(__FLT16_MAX__)
template <>
struct OpMath<_Float16> {
  using type = float;
};
#endif

// One element: 2 * a + b in Acc (float for half precision), rounded once to T. The CPU rows below and the CUDA
// kernel (cpp/cuda/my_add.cu) compute it.
template <class T, class Acc = typename OpMath<T>::type>
OPBRIDGE_HD inline T my_add_one(T a, T b) {
  return T(Acc(2) * Acc(a) + Acc(b));
}

// One row segment. The unit-stride and broadcast-scalar cases are separate
// loops so that each is a plain loop the compiler vectorizes.
template <class T>
inline void my_add_row(const T* __restrict a, int64_t a_stride, const T* __restrict b, int64_t b_stride,
                       T* __restrict out, int64_t length) {
  if (a_stride == 1 && b_stride == 1) {
    for (int64_t i = 0; i < length; ++i) out[i] = my_add_one(a[i], b[i]);
  } else if (a_stride == 0 && b_stride == 1) {
    const T a_value = a[0];
    for (int64_t i = 0; i < length; ++i) out[i] = my_add_one(a_value, b[i]);
  } else if (a_stride == 1 && b_stride == 0) {
    const T b_value = b[0];
    for (int64_t i = 0; i < length; ++i) out[i] = my_add_one(a[i], b_value);
  } else {
    for (int64_t i = 0; i < length; ++i) out[i] = my_add_one(a[i * a_stride], b[i * b_stride]);
  }
}

#if defined(__SSE2__)
// The unit-stride float row with streaming (non-temporal) stores; scalar ends until `out` is 16-byte aligned.
// Multiplying by 2 is exact, so this rounds as my_add_one does. The caller fences (_mm_sfence) before the
// results are read on another thread.
inline void my_add_row_streaming(const float* __restrict a, const float* __restrict b, float* __restrict out,
                                 int64_t length) {
  int64_t i = 0;
  for (; i < length && (reinterpret_cast<uintptr_t>(out + i) & 15) != 0; ++i) out[i] = my_add_one(a[i], b[i]);
  const __m128 two = _mm_set1_ps(2.0f);
  for (; i + 4 <= length; i += 4) {
    _mm_stream_ps(out + i, _mm_add_ps(_mm_mul_ps(two, _mm_loadu_ps(a + i)), _mm_loadu_ps(b + i)));
  }
  for (; i < length; ++i) out[i] = my_add_one(a[i], b[i]);
}
#endif

// Elements per parallel task: large enough to amortize scheduling, small enough
// to balance two to a few dozen threads on DRAM-sized inputs.
constexpr int64_t kMyAddChunk = int64_t(1) << 16;

// out (contiguous, loop.numel elements) = 2 * a + b, inputs addressed through
// the strides in `loop` (see make_binary_loop).
template <class T, class ParallelFor>
void my_add(const T* a, const T* b, T* out, const BinaryLoop& loop, ParallelFor&& parallel_for) {
  const int64_t a_inner = loop.a_strides.back();
  const int64_t b_inner = loop.b_strides.back();
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    if (a_inner == 1 && b_inner == 1 && loop.numel * int64_t(sizeof(float)) >= streaming_store_bytes()) {
      parallel_chunks(loop.numel, kMyAddChunk, parallel_for, [&](int64_t begin, int64_t end) {
        for_each_row(loop, begin, end, [&](int64_t a_offset, int64_t b_offset, int64_t out_offset, int64_t length) {
          my_add_row_streaming(a + a_offset, b + b_offset, out + out_offset, length);
        });
        _mm_sfence();  // streaming stores are weakly ordered: visible before the task is reported done
      });
      return;
    }
  }
#endif
  parallel_chunks(loop.numel, kMyAddChunk, parallel_for, [&](int64_t begin, int64_t end) {
    for_each_row(loop, begin, end, [&](int64_t a_offset, int64_t b_offset, int64_t out_offset, int64_t length) {
      my_add_row(a + a_offset, a_inner, b + b_offset, b_inner, out + out_offset, length);
    });
  });
}

}  // namespace opbridge::kernels
