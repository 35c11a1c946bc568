// The classic implementation of cpp/torch/api.h: ATen, TORCH_LIBRARY and torch's pybind11 casters. A build
// loads only under the torch it was compiled against (the wheels for torch < 2.10).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "torch/cpu_gemm.h"
#include "torch/tasks.h"

#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace opbridge::api {

using Tensor = at::Tensor;
using ScalarType = c10::ScalarType;
using IntList = c10::IntArrayRef;

inline std::vector<int64_t> sizes(const Tensor& tensor) { return tensor.sizes().vec(); }
inline std::vector<int64_t> strides(const Tensor& tensor) { return tensor.strides().vec(); }
inline bool is_cpu(const Tensor& tensor) { return tensor.device().is_cpu(); }
inline bool is_strided(const Tensor& tensor) { return tensor.layout() == at::kStrided; }
inline std::string device_name(const Tensor& tensor) { return tensor.device().str(); }

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }
inline int32_t device_index(const Tensor& tensor) { return tensor.device().index(); }
inline Tensor empty_on(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like) {
  return at::empty(shape, like.options().dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
}
inline Tensor zeros_on(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like) {
  return at::zeros(shape, like.options().dtype(dtype));
}
inline Tensor to_cpu(const Tensor& tensor) { return tensor.cpu(); }

inline Tensor empty(const std::vector<int64_t>& shape, ScalarType dtype) {
  return at::empty(shape, at::TensorOptions().dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
}
inline Tensor zeros(const std::vector<int64_t>& shape, ScalarType dtype) {
  return at::zeros(shape, at::TensorOptions().dtype(dtype));
}
inline Tensor contiguous(const Tensor& tensor) { return tensor.contiguous(); }
inline Tensor to(const Tensor& tensor, ScalarType dtype) { return tensor.to(dtype); }

// at::parallel_for is inline OpenMP in torch's builds (CMake compiles this library with -fopenmp).
// The tasks are handed out one at a time (tasks.h).
template <class F>
void parallel_for(int64_t tasks, const F& task) {
  TaskCounter counter;
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) { run_counted_tasks(counter, tasks, task); });
}

// c[m, n] = a[m, k] * b[n, k]^T (float32) through oneDNN: torch's mkldnn::_linear_pointwise(X = a, W = b), called
// boxed (its C++ signature changed across torch releases), its [m, n] result copied into c. False where the op is
// missing or failed (nothing written to c).
inline bool onednn_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float* c, int64_t ldc) {
  static const auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  if (!op) return false;
  const auto options = at::TensorOptions().dtype(at::kFloat);
  // W's rows must be dense (oneDNN's weight reorder of a strided W is ~2000x slower; see api_stable.h).
  std::vector<c10::IValue> stack{at::from_blob(const_cast<float*>(a), {m, k}, {lda, 1}, options),
                                 at::from_blob(const_cast<float*>(b), {n, k}, {ldb, 1}, options).contiguous(),
                                 c10::IValue(),
                                 c10::IValue(std::string("none")),
                                 c10::IValue(c10::List<std::optional<at::Scalar>>()),
                                 c10::IValue()};
  try {
    op->callBoxed(&stack);
  } catch (const std::exception&) {
    return false;
  }
  at::from_blob(c, {m, n}, {ldc, 1}, options).copy_(stack.at(0).toTensor());
  return true;
}

// c[i * c_row + j * c_col] = (a[n, k] . b[m, k]^T + bias[m])[i, j] for bfloat16 a, b, bias (bias may be null) and c:
// float32 products and sums, one rounding (at::linear: oneDNN's bfloat16 GEMM on CPUs with bfloat16 instructions).
inline bool linear_bf16(int64_t n, int64_t m, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                        const uint16_t* bias, uint16_t* c, int64_t c_row, int64_t c_col) {
  const auto options = at::TensorOptions().dtype(at::kBFloat16);
  const auto result =
      at::linear(at::from_blob(const_cast<uint16_t*>(a), {n, k}, {lda, 1}, options),
                 at::from_blob(const_cast<uint16_t*>(b), {m, k}, {ldb, 1}, options),
                 bias != nullptr ? std::optional<at::Tensor>(at::from_blob(const_cast<uint16_t*>(bias), {m}, options))
                                 : std::nullopt);
  at::from_blob(c, {n, m}, {c_row, c_col}, options).copy_(result);
  return true;
}

// torch's own BLAS (MKL or OpenBLAS through at::mm) on strided views, or oneDNN as cpu_gemm.h chooses: inside a
// parallel region it runs on the calling thread. c[m, n] = a[m, k] * b[n, k]^T.
template <class T>
auto gemm() {
  return [](int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
    if constexpr (std::is_same_v<T, float>) {
      if (use_onednn_gemm()) {
        if (onednn_gemm(m, n, k, a, lda, b, ldb, c, ldc)) return;
        onednn_gemm_failed() = true;
      }
    }
    const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
    auto c_t = at::from_blob(c, {m, n}, {ldc, 1}, options);
    at::mm_out(c_t, at::from_blob(const_cast<T*>(a), {m, k}, {lda, 1}, options),
               at::from_blob(const_cast<T*>(b), {k, n}, {1, ldb}, options));
  };
}

}  // namespace opbridge::api

#define OPBRIDGE_FAIL(message) TORCH_CHECK(false, message)
#define OPBRIDGE_LIBRARY_FRAGMENT(m) TORCH_LIBRARY_FRAGMENT(opbridge, m)
#define OPBRIDGE_LIBRARY_IMPL_CPU(m) TORCH_LIBRARY_IMPL(opbridge, CPU, m)
#define OPBRIDGE_IMPL(m, name, function) m.impl(name, &function)
