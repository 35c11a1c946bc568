// The memory-bandwidth bound of `nox -s bench`: the STREAM triad c = 2a + b,
// compiled with the flags of the kernels, on `threads` OpenMP threads with a
// static split (each thread one contiguous range, as the kernels' chunks).
// Arrays beyond the last-level cache are written with streaming stores, as
// my_add writes them (cpp/kernels/my_add.h): a plain store also reads the line
// it overwrites, and a bound must not carry traffic the kernel avoids.
// Not part of any shipped library.
#include <cstdint>

#include "kernels/streaming.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

extern "C" __attribute__((visibility("default"))) void opbridge_bench_triad(float* __restrict c,
                                                                            const float* __restrict a,
                                                                            const float* __restrict b, int64_t n,
                                                                            int threads) {
#if defined(__SSE2__)
  if (n * int64_t(sizeof(float)) >= opbridge::kernels::streaming_store_bytes() &&
      (reinterpret_cast<uintptr_t>(c) & 15) == 0) {
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
      for (int64_t block = 0; block < n / 16; ++block) {
        const int64_t i = block * 16;
        for (int64_t j = i; j < i + 16; j += 4) {
          _mm_stream_ps(c + j, _mm_add_ps(_mm_mul_ps(_mm_set1_ps(2.0f), _mm_loadu_ps(a + j)), _mm_loadu_ps(b + j)));
        }
      }
      _mm_sfence();
    }
    for (int64_t i = n / 16 * 16; i < n; ++i) c[i] = 2.0f * a[i] + b[i];
    return;
  }
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) c[i] = 2.0f * a[i] + b[i];
}
