// The GEMM behind the ORT kernels: OpenBLAS (the scipy-openblas32 build, whose
// symbols carry a scipy_ prefix and so never clash with another BLAS in the
// host process) when the library is built with it, otherwise the portable
// reference loop. Each call runs on the calling thread: the kernels split the
// work over the session's intra-op threads themselves.
//
// RuntimeGemm: the runtime's own float32 GEMM instead (the CPU provider's Gemm kernel, MLAS, called through
// OrtApi::CreateOp / InvokeOp), where OpenBLAS cannot give the CPU's speed: a build without OpenBLAS, or an
// OpenBLAS whose kernels are narrower than the CPU (an AVX-512 CPU with OPENBLAS_CORETYPE=Haswell in the
// environment runs OpenBLAS's AVX2 kernels, 38-41 ms for [256 x 2304] x [2304 x 4200] where MLAS takes 22 ms).
// OPBRIDGE_ORT_GEMM=openblas or runtime overrides that choice (docs/architecture.md).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/deform_conv2d.h"
#include "ort/api.h"

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

// Whether RuntimeGemm is used (decided once per process, as above).
bool use_runtime_gemm();

// The runtime's float32 GEMM for one kernel instance: created from its kernel info when use_runtime_gemm() (empty
// where the runtime cannot create it: the library's GEMM then runs). Calls may come from any of the session's
// threads at once.
class RuntimeGemm {
 public:
  explicit RuntimeGemm(const OrtKernelInfo* info);
  explicit operator bool() const { return static_cast<const OrtOp*>(op_) != nullptr; }
  // c[m, n] = a[m, k] * b[n, k]^T, row-major with leading dimensions, through the runtime's Gemm (transB = 1).
  void operator()(OrtKernelContext* context, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float* c, int64_t ldc) const;

 private:
  Ort::Op op_{nullptr};
};

}  // namespace opbridge::ort
