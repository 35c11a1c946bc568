// The stable-ABI implementation of cpp/torch/api.h: torch/csrc/stable only (the build defines TORCH_STABLE_ONLY,
// which makes any other torch header an error, and TORCH_TARGET_VERSION 2.10, which hides what later torches
// added). One build loads on torch 2.10 and every later release.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include "kernels/float16.h"
#include "torch/cpu_gemm.h"
#include "torch/tasks.h"

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace opbridge::api {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using IntList = torch::headeronly::IntHeaderOnlyArrayRef;

inline std::vector<int64_t> sizes(const Tensor& tensor) {
  const auto values = tensor.sizes();
  return {values.begin(), values.end()};
}
inline std::vector<int64_t> strides(const Tensor& tensor) {
  const auto values = tensor.strides();
  return {values.begin(), values.end()};
}
inline bool is_cpu(const Tensor& tensor) { return tensor.is_cpu(); }
inline bool is_strided(const Tensor& tensor) {
  int32_t layout = -1;
  return aoti_torch_get_layout(tensor.get(), &layout) == AOTI_TORCH_SUCCESS && layout == aoti_torch_layout_strided();
}
inline std::string device_name(const Tensor& tensor) {
  const auto device = tensor.device();
  switch (device.type()) {
    case torch::headeronly::DeviceType::CPU:
      return "cpu";
    case torch::headeronly::DeviceType::CUDA:
      return "cuda:" + std::to_string(device.index());
    case torch::headeronly::DeviceType::Meta:
      return "meta";
    default:
      return "device type " + std::to_string(static_cast<int>(device.type()));
  }
}

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }
inline int32_t device_index(const Tensor& tensor) { return tensor.device().index(); }

// A contiguous tensor on the device of `like` (the CUDA adapters' outputs and buffers).
inline Tensor empty_on(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like) {
  return torch::stable::empty(shape, dtype, std::nullopt, like.device(), std::nullopt,
                              torch::headeronly::MemoryFormat::Contiguous);
}
inline Tensor zeros_on(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like) {
  auto tensor = empty_on(shape, dtype, like);
  torch::stable::zero_(tensor);
  return tensor;
}
inline Tensor to_cpu(const Tensor& tensor) {
  return tensor.is_cpu() ? tensor
                         : torch::stable::to(tensor, torch::stable::Device(torch::headeronly::DeviceType::CPU));
}

inline Tensor empty(const std::vector<int64_t>& shape, ScalarType dtype) {
  return torch::stable::empty(shape, dtype, std::nullopt, torch::stable::Device(torch::headeronly::DeviceType::CPU),
                              std::nullopt, torch::headeronly::MemoryFormat::Contiguous);
}
inline Tensor zeros(const std::vector<int64_t>& shape, ScalarType dtype) {
  auto tensor = empty(shape, dtype);
  torch::stable::zero_(tensor);
  return tensor;
}
// Without a dispatcher call where nothing changes (each costs microseconds of host time per op call, which a GPU
// op's latency shows).
inline Tensor contiguous(const Tensor& tensor) {
  return tensor.is_contiguous() ? tensor : torch::stable::contiguous(tensor);
}
inline Tensor to(const Tensor& tensor, ScalarType dtype) {
  return tensor.scalar_type() == dtype ? tensor : torch::stable::to(tensor, dtype);
}

// torch's at::parallel_for behind the stable shim: the same thread pool as torch's own ops, the tasks handed out
// one at a time (tasks.h).
template <class F>
void parallel_for(int64_t tasks, const F& task) {
  TaskCounter counter;
  torch::stable::parallel_for(0, tasks, 1, [&](int64_t, int64_t) { run_counted_tasks(counter, tasks, task); });
}

// c[m, n] = a[m, k] . b[k, n] on `device` through torch's matmul (aten::mm.out on views of the caller's memory:
// the stable surface of 2.10 has matmul, which would allocate its result and need a copy), each operand given by
// its (row, column) strides, so transposed operands cost nothing. On the CPU, inside a parallel region, it runs
// on the calling thread; on CUDA it runs on torch's current stream.
template <class T>
void mm_out(torch::stable::Device device, int64_t m, int64_t n, int64_t k, const T* a, int64_t a_row, int64_t a_col,
            const T* b, int64_t b_row, int64_t b_col, T* c, int64_t c_row) {
  constexpr auto dtype = std::is_same_v<T, float> ? ScalarType::Float : ScalarType::Double;
  const int64_t a_shape[] = {m, k}, a_strides[] = {a_row, a_col}, b_shape[] = {k, n}, b_strides[] = {b_row, b_col};
  const int64_t c_shape[] = {m, n}, c_strides[] = {c_row, 1};
  std::array<StableIValue, 3> stack{
      torch::stable::detail::from(torch::stable::from_blob(const_cast<T*>(a), a_shape, a_strides, device, dtype)),
      torch::stable::detail::from(torch::stable::from_blob(const_cast<T*>(b), b_shape, b_strides, device, dtype)),
      torch::stable::detail::from(torch::stable::from_blob(c, c_shape, c_strides, device, dtype))};
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("aten::mm", "out", stack.data(), TORCH_ABI_VERSION));
  (void)torch::stable::detail::to<Tensor>(stack[0]);  // releases the returned reference to c
}

// c[m, n] = a[m, k] * b[n, k]^T (float32) through oneDNN: torch's mkldnn::_linear_pointwise(X = a, W = b), whose
// [m, n] result is copied into c's rows. False where the call failed (nothing written to c).
inline bool onednn_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float* c, int64_t ldc) {
  const auto cpu = torch::stable::Device(torch::headeronly::DeviceType::CPU);
  const int64_t a_shape[] = {m, k}, a_strides[] = {lda, 1}, b_shape[] = {n, k}, b_strides[] = {ldb, 1};
  // W's rows must be dense: oneDNN took 12.7 s instead of 6 ms for a [2304, 1050] W with rows 4200 apart (its
  // weight reorder for a strided W; a strided X costs nothing), so such a W is copied first.
  Tensor weight = torch::stable::from_blob(const_cast<float*>(b), b_shape, b_strides, cpu, ScalarType::Float);
  if (ldb != k) weight = torch::stable::contiguous(weight);
  std::array<StableIValue, 6> stack{
      torch::stable::detail::from(
          torch::stable::from_blob(const_cast<float*>(a), a_shape, a_strides, cpu, ScalarType::Float)),
      torch::stable::detail::from(weight),
      torch::stable::detail::from(std::nullopt),
      torch::stable::detail::from(std::string("none")),
      torch::stable::detail::from(std::vector<int64_t>{}),  // scalars: none (an empty list of any type)
      torch::stable::detail::from(std::nullopt)};
  if (torch_call_dispatcher("mkldnn::_linear_pointwise", "", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS)
    return false;
  const auto result = torch::stable::detail::to<Tensor>(stack[0]);
  const auto* values = static_cast<const float*>(result.data_ptr());
  const auto result_strides = result.strides();
  for (int64_t i = 0; i < m; ++i) {
    const float* row = values + i * result_strides[0];
    if (result_strides[1] == 1) {
      std::memcpy(c + i * ldc, row, sizeof(float) * static_cast<size_t>(n));
    } else {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = row[j * result_strides[1]];
    }
  }
  return true;
}

// c[i * c_row + j * c_col] = (a[n, k] . b[m, k]^T + bias[m])[i, j] for bfloat16 a, b, bias (bias may be null) and c:
// float32 products and sums, one rounding (torch's aten::linear, oneDNN's bfloat16 GEMM on CPUs with bfloat16
// instructions). a's rows lda apart, b's ldb. False where the call failed (nothing written).
inline bool linear_bf16(int64_t n, int64_t m, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                        const uint16_t* bias, uint16_t* c, int64_t c_row, int64_t c_col) {
  const auto cpu = torch::stable::Device(torch::headeronly::DeviceType::CPU);
  const auto bf16 = ScalarType::BFloat16;
  const int64_t a_shape[] = {n, k}, a_strides[] = {lda, 1}, b_shape[] = {m, k}, b_strides[] = {ldb, 1};
  const int64_t bias_shape[] = {m}, bias_strides[] = {1};
  std::array<StableIValue, 3> stack{
      torch::stable::detail::from(torch::stable::from_blob(const_cast<uint16_t*>(a), a_shape, a_strides, cpu, bf16)),
      torch::stable::detail::from(torch::stable::from_blob(const_cast<uint16_t*>(b), b_shape, b_strides, cpu, bf16)),
      // Tensor? in the schema: an optional, not a Tensor (the boxed call reads the value as std::optional).
      torch::stable::detail::from(bias != nullptr
                                      ? std::optional<Tensor>(torch::stable::from_blob(
                                            const_cast<uint16_t*>(bias), bias_shape, bias_strides, cpu, bf16))
                                      : std::nullopt)};
  if (torch_call_dispatcher("aten::linear", "", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) return false;
  const auto result = torch::stable::detail::to<Tensor>(stack[0]);
  const auto* values = static_cast<const uint16_t*>(result.data_ptr());
  const auto strides = result.strides();
  // Stores in c's order (the result, n x m values, stays in cache: a store stride of an output plane per element
  // made deform_conv2d's 64-channel 128x128 forward 2.3x slower).
  if (c_row == 1 && strides[1] == 1) {
    kernels::transpose_halves(values, strides[0], c, c_col, n, m);
  } else if (c_row == 1) {
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t i = 0; i < n; ++i) c[i + j * c_col] = values[i * strides[0] + j * strides[1]];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) c[i * c_row + j * c_col] = values[i * strides[0] + j * strides[1]];
    }
  }
  return true;
}

// torch's CPU GEMM: c[m, n] = a[m, k] * b[n, k]^T, row-major with leading dimensions, through oneDNN or torch's
// BLAS as cpu_gemm.h chooses.
template <class T>
auto gemm() {
  return [](int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
    if constexpr (std::is_same_v<T, float>) {
      if (use_onednn_gemm()) {
        if (onednn_gemm(m, n, k, a, lda, b, ldb, c, ldc)) return;
        onednn_gemm_failed() = true;
      }
    }
    mm_out(torch::stable::Device(torch::headeronly::DeviceType::CPU), m, n, k, a, lda, 1, b, 1, ldb, c, ldc);
  };
}

}  // namespace opbridge::api

#define OPBRIDGE_FAIL(message) throw std::runtime_error(message)
#define OPBRIDGE_LIBRARY_FRAGMENT(m) STABLE_TORCH_LIBRARY_FRAGMENT(opbridge, m)
#define OPBRIDGE_LIBRARY_IMPL_CPU(m) STABLE_TORCH_LIBRARY_IMPL(opbridge, CPU, m)
#define OPBRIDGE_LIBRARY_IMPL_CUDA(m) STABLE_TORCH_LIBRARY_IMPL(opbridge, CUDA, m)
#define OPBRIDGE_IMPL(m, name, function) m.impl(name, TORCH_BOX(&function))
