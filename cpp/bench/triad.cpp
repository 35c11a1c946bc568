// The memory-bandwidth bound of `nox -s bench`: the STREAM triad c = 2a + b,
// compiled with the flags of the kernels, on `threads` OpenMP threads with a
// static split (each thread one contiguous range, as the kernels' chunks).
// Not part of any shipped library.
#include <cstdint>

extern "C" __attribute__((visibility("default"))) void opbridge_bench_triad(float* __restrict c,
                                                                            const float* __restrict a,
                                                                            const float* __restrict b, int64_t n,
                                                                            int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) c[i] = 2.0f * a[i] + b[i];
}
