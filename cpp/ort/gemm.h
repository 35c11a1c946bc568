// The GEMM behind the ORT kernels: OpenBLAS (the scipy-openblas32 build, whose
// symbols carry a scipy_ prefix and so never clash with another BLAS in the
// host process) when the library is built with it, otherwise the portable
// reference loop. Each call runs on the calling thread: the kernels split the
// work over the session's intra-op threads themselves.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/deform_conv2d.h"

#ifdef OPBRIDGE_WITH_OPENBLAS
#include <cblas.h>
#endif

namespace opbridge::ort {

// Called once when the library is registered: OpenBLAS must not start threads
// of its own inside our tasks.
void init_gemm();

// c[m, n] = a[m, k] * b[n, k]^T, row-major with leading dimensions.
template <class T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
#ifdef OPBRIDGE_WITH_OPENBLAS
  // blasint is 32-bit; check_deform_conv2d keeps every dimension addressable,
  // larger products fall back to the reference loop rather than truncate.
  constexpr int64_t kMax = INT32_MAX;
  if (m <= kMax && n <= kMax && k <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax) {
    if constexpr (std::is_same_v<T, float>) {
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(n), blasint(k), 1.0f, a,
                        blasint(lda), b, blasint(ldb), 0.0f, c, blasint(ldc));
      return;
    } else if constexpr (std::is_same_v<T, double>) {
      scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(n), blasint(k), 1.0, a,
                        blasint(lda), b, blasint(ldb), 0.0, c, blasint(ldc));
      return;
    }
  }
#endif
  kernels::gemm_reference(m, n, k, a, lda, b, ldb, c, ldc);
}

}  // namespace opbridge::ort
