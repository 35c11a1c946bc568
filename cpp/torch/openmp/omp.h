// The OpenMP API that ATen's at::parallel_for (ATen/ParallelOpenMP.h, inline in torch's headers) calls, for a
// compiler that has no OpenMP runtime of its own: the wheels' ppbt GCC (docs/packaging.md). The classic layer is
// then compiled with -fopenmp against this header and linked to the libgomp.so.1 that torch ships and has already
// loaded (cpp/torch/CMakeLists.txt), exactly as with a compiler's own omp.h. Declarations of libgomp's C API only.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

int omp_get_num_threads(void);
int omp_get_thread_num(void);
int omp_get_max_threads(void);
int omp_in_parallel(void);
void omp_set_num_threads(int threads);

#ifdef __cplusplus
}
#endif
